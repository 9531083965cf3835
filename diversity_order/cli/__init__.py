"""The command line: one module per script (``curate_dataset``, ``extract_deep_embeddings``,
``compare_clusterings``, ``animate_ordering``), and here what they share: argument parsing, logging
set-up, and turning user errors (and Ctrl-C) into one line.

Each script module imports only the standard library at the top; the package's heavy imports
(numpy, torch, numba) happen inside ``main``, under ``run_main``, so a Ctrl-C at any moment ends
with one line rather than a traceback. ``console()`` is the installed command's entry point.
"""

from __future__ import annotations

import argparse
import logging
import numbers
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable

from ..errors import NO_ROOM, EveryRankError, UserError
from ..interrupts import Terminated, finishing_what, request_interrupt

log = logging.getLogger("diversity_order")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line usage error (``error: PROG: --flag ...``, exit 2), like the scripts' other errors.

    argparse would print the whole usage block first; ``--help`` still shows it.
    """

    def __init__(self, description: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        # No flag is taken for another by its first letters: --compare ran a 44 s --compare-strategies, and
        # --output-shard 2 set --output-shards. A prefix is an error that names the flag.
        kwargs.setdefault("allow_abbrev", False)
        # Run as the installed command (curate-dataset), the usage names it rather than the script.
        command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        if kwargs.get("prog") and command == kwargs["prog"].removesuffix(".py").replace("_", "-"):
            kwargs["prog"] = command
        super().__init__(description=description, **kwargs)
        # A value starting with a minus and a digit is a value, not a flag: argparse's own rule takes only -1 and
        # -1.5, so "--score-default -1e9" (or -inf, or "--segment-percentages -5,10") was "expected one argument".
        self._negative_number_matcher = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)

    def parse_args(self, args=None, namespace=None):
        # A misspelt flag is said before a flag it left missing: '--inptu x' read as "--input is required".
        argv = list(sys.argv[1:] if args is None else args)
        unknown = [text.split("=", 1)[0] for text in map(str, argv)
                   if text.startswith("--") and text != "--" and text.split("=", 1)[0] not in self._option_string_actions]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_args(argv, namespace)

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}{self._suggestion(message)} (see --help)\n")

    def _suggestion(self, message: str) -> str:
        """'; did you mean ...?' for a misspelt choice or flag (``--ordering stratifed``, ``--no-plots``)."""
        import difflib

        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            given, options = choice.group(1), re.findall(r"'([^']*)'", choice.group(2)) or \
                [option.strip() for option in choice.group(2).split(",")]
        else:
            unknown = re.search(r"unrecognized arguments: (\S+)", message)
            if not unknown or not unknown.group(1).startswith("--"):
                return ""
            given, options = unknown.group(1).split("=")[0], [o for o in self._option_string_actions if o.startswith("--")]
        close = [o for o in options if o.startswith(given)] if given else []  # a flag's or choice's first letters
        if choice and len(close) != 1:
            # Another case ('EOS'), a common short name ('bf16', 'desc'), or the metadata's name for the default.
            wanted = CHOICE_ALIASES.get(given.lower(), given.lower())
            close = [o for o in options if o.lower() == wanted]
        if len(close) != 1:
            # Two letters swapped or one typed wrong ('eso' for eos) is too far for difflib in a short word.
            close = [o for o in options if _edits_apart(given, o) <= max(1, len(o) // 4)]
        close = close if len(close) == 1 else difflib.get_close_matches(given, options, n=1, cutoff=0.75)
        return f"; did you mean {close[0]}?" if close else ""


# Short names users type for our choices (dtypes as PyTorch users write them, sort directions).
CHOICE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32",
                  "desc": "descending", "asc": "ascending", "stratified_greedy": "stratified"}


def _edits_apart(a: str, b: str) -> int:
    """Letters inserted, deleted, replaced or swapped with a neighbour to turn ``a`` into ``b`` (each once)."""
    previous, row = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (a[i - 1] != b[j - 1]))
            if previous is not None and i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], previous[j - 2] + 1)
        previous, row = row, current
    return row[-1]


def add_input_flags(parser) -> None:
    """--input and --text-field, as every script that reads the records takes them."""
    parser.add_argument("--input", required=True, action="append", metavar="PATH",
                        help="the records: JSONL (.jsonl, .json or .ndjson, each also .gz or .zst), Parquet "
                             "(.parquet), or a Hugging Face datasets folder (save_to_disk); a folder of such files or "
                             "a quoted glob (data/*.parquet) reads them all, and --input may be repeated (one format in all)")
    parser.add_argument("--text-field", action="append", metavar="FIELD",
                        help="the field holding the document (default: text): a dotted path reads nested objects "
                             "(meta.body); repeated, the fields' texts are joined with a newline (prompt + "
                             "completion); a conversation (a list of role/content messages) is rendered with the "
                             "tokenizer's chat template")


def input_values(args: argparse.Namespace) -> tuple:
    """(--input value(s), --text-field value(s)) as the configs take them: one value alone, several as a tuple."""
    from pathlib import Path

    from ..fields import DEFAULT_TEXT_FIELD

    inputs = [Path(value) for value in args.input]
    fields = args.text_field or [DEFAULT_TEXT_FIELD]
    return (inputs[0] if len(inputs) == 1 else tuple(inputs)), (fields[0] if len(fields) == 1 else tuple(fields))


def add_output_flags(parser, progress: bool = True) -> None:
    """The flags every script shares for what it prints: -v, and --no-progress where it has bars."""
    if progress:
        parser.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def setup_logging(verbose: bool = False) -> None:
    # Under torchrun every rank logs to the same terminal: each line says whose it is (two ranks' "12 document(s)
    # have no tokens" and "8 document(s) ..." read as one run contradicting itself).
    world = os.environ.get("WORLD_SIZE", "1")
    rank = f"[rank {os.environ.get('RANK', '?')}/{world}] " if world.isdigit() and int(world) > 1 else ""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ThousandsFormatter(f"%(asctime)s %(levelname)-7s {rank}%(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])


# A plain %d conversion in a log message: an integer count, written as the rest of the log writes counts.
_CONVERSION = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")


class _ThousandsFormatter(logging.Formatter):
    """Integers given to a plain ``%d`` (a count) are written with thousands separators (2,595 records, as the
    messages that format their counts themselves write them: a log read 2595 beside 2,555). An identifier (a record's
    index, a flag's value, a size in pixels) is given to ``%i``, written as typed: "record 12345", "--n-clusters 1000"."""

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if isinstance(args, tuple) and args and isinstance(record.msg, str) and "%d" in record.msg:
            pieces, values, at, last = [], list(args), 0, 0
            for match in _CONVERSION.finditer(record.msg):
                spec = match.group()
                if spec == "%%":
                    continue
                if spec == "%d" and at < len(values) and isinstance(values[at], numbers.Integral) and \
                        not isinstance(values[at], bool):
                    pieces.append(record.msg[last:match.start()] + "%s")
                    values[at] = f"{values[at]:,}"
                    last = match.end()
                at += 1 + spec.count("*")
            if last:
                record = logging.makeLogRecord({**record.__dict__, "msg": "".join(pieces) + record.msg[last:],
                                                "args": tuple(values)})
        return super().format(record)


INTERRUPTED = "interrupted: every file written is complete; none was left half-written"
TERMINATED = "terminated (SIGTERM): every file written is complete; none was left half-written"


# After Ctrl-C, how long a command may take to stop by itself before it is ended. Python turns Ctrl-C into
# a KeyboardInterrupt wherever the main thread is, and some code swallows it (a Cython module's set-up
# during an import does; so does a weakref callback of the import machinery, printing "Exception
# ignored"), so the run would go on; a thread can also hold up the exit.
INTERRUPT_GRACE_S = 10.0
FINISHING_LIMIT_S = 600.0  # the longest the grace is held off by ``interrupts.finishing``
# "finished": the command's work is done (its outputs written): a signal from then on is only noted, so one that
# lands while the process returns is no traceback.
_interrupt = {"received": False, "reported": False, "code": 130, "finished": False, "command": 0}


def _report_interrupt() -> None:
    if not _interrupt["reported"]:
        _interrupt["reported"] = True
        if os.environ.get("RANK", "0") == "0":  # under torchrun the ranks share one stderr: rank 0 says it
            print(TERMINATED if _interrupt["code"] == 143 else INTERRUPTED, file=sys.stderr, flush=True)


def _end_after_grace() -> None:
    time.sleep(INTERRUPT_GRACE_S)
    told, started = False, time.monotonic()
    # Work that keeps what the run did (hours of embedding) may take longer; Ctrl-C again stops it.
    while finishing_what() is not None and time.monotonic() - started < FINISHING_LIMIT_S:
        if not told:
            print(f"still {finishing_what()} (Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
            told = True
        time.sleep(0.1)
    _report_interrupt()
    os._exit(_interrupt["code"])  # atomic writes leave at most a temp file, which a later run removes


def _quiet_about_interrupts(unraisable) -> None:
    """``sys.unraisablehook`` that says nothing of a KeyboardInterrupt (or SIGTERM's ``Terminated``) raised where
    Python cannot raise it (a ``__del__``, a weakref callback inside the import machinery): ``run_command``
    reports it."""
    if not isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
        sys.__unraisablehook__(unraisable)


def _on_interrupt(signum, frame) -> None:
    if _interrupt["finished"]:
        _exit_if_still_here(130)
        return
    _stop_received(130)
    raise KeyboardInterrupt


def _exit_if_still_here(code: int) -> None:
    """A signal once the command is done: not raised (it would be a traceback as the process returns), but the
    process is ended after the grace if it has not by then (an exit hung on a thread or an atexit handler)."""
    command = _interrupt["command"]

    def end() -> None:
        time.sleep(INTERRUPT_GRACE_S)
        if _interrupt["command"] == command:  # not if another command has started in this process since
            os._exit(code)

    threading.Thread(target=end, name="interrupt-exit", daemon=True).start()


def _on_terminate(signum, frame) -> None:
    """SIGTERM (a scheduler's preemption or time limit, ``timeout``, ``docker stop``) stops a command as Ctrl-C
    does: the work worth keeping is kept, one line says so, and the exit status is 143, as for a process
    SIGTERM ended. (Python's default ends it at once, without a word.)"""
    if _interrupt["finished"]:
        _exit_if_still_here(128 + signum)
        return
    _stop_received(128 + signum)
    raise Terminated(128 + signum)


def _stop_received(code: int) -> None:
    if not _interrupt["received"]:
        _interrupt["received"], _interrupt["code"] = True, code
        request_interrupt()  # where a library drops the exception, the next stage raises it again
        threading.Thread(target=_end_after_grace, name="interrupt-grace", daemon=True).start()


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a script's main; user errors become one line on stderr and exit code 2, Ctrl-C exit code 130. A run
    that fails removes the output folders it created and left empty."""
    code = None
    try:
        code = main(argv) or 0
        _interrupt["finished"] = True
        return code
    except UserError as exc:
        # One write: under torchrun the ranks share one stderr, and a line written in parts interleaves with another's.
        rank = os.environ.get("RANK", "0")  # torchrun's; unset in one process
        if rank == "0" or not isinstance(exc, EveryRankError):
            sys.stderr.write(("" if rank == "0" else f"[rank {rank}] ") + f"error: {exc}\n")
            sys.stderr.flush()
        return 2
    except OSError as exc:
        full = _disk_full_line(exc)
        if full is None:
            raise
        sys.stderr.write(f"error: {full}\n")
        return 2
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.partition(".")[0] == "diversity_order":
            raise  # our own module missing: a broken install, the traceback says which
        # A requirement missing from the Python that runs the script (often the system's, not the project's venv).
        sys.stderr.write(f"error: the package '{exc.name.partition('.')[0]}' is not installed for {sys.executable}; "
                         "install the project's requirements (pip install -e . or make setup) or run the command "
                         "with the Python that has them (.venv/bin/python)\n")
        return 2
    except (KeyboardInterrupt, Terminated) as stop:
        _report_interrupt()
        return _interrupt["code"] if _interrupt["received"] else 143 if isinstance(stop, Terminated) else 130
    finally:
        # Only a run that imported it created folders; importing it here raised again where numpy was missing.
        outputs = sys.modules.get(f"{__name__.rpartition('.')[0]}.outputs")
        if outputs is not None:
            outputs.remove_created_folders(failed=code != 0)


def _disk_full_line(exc: OSError) -> str | None:
    """One line for a write that found its disk full (or the user's quota spent): where, and what to do. Writers
    report it their own ways (an errno; numpy's "N requested and M written"; pyarrow's and PIL's text), so each is
    recognised here, and the files written so far were left whole by their atomic writes. None for another error."""
    import errno

    text = str(exc)
    too_large = exc.errno == errno.EFBIG or "File too large" in text
    if exc.errno not in NO_ROOM and not too_large and "No space left on device" not in text and \
            "Disk quota exceeded" not in text and not re.search(r"\d+ requested and \d+ written", text):
        return None
    from ..atomic import last_target

    target = exc.filename or last_target()  # pyarrow's, PIL's and numpy's errors name no file
    where = f"writing in {os.path.dirname(os.path.abspath(target))}" if target else "writing a file"
    reason = exc.strerror or text.splitlines()[0]
    if too_large:
        return (f"a file too large for its file system (FAT's 4 GiB) or for ulimit -f, {where} ({reason}); the "
                "earlier files are as they were: write on another file system, and run again")
    return (f"no room left on the disk {where} ({reason}); the earlier files are "
            "as they were: free space or write elsewhere, and run again")


def run_command(main: Callable[[list[str] | None], int]) -> int:
    """An installed command's ``run_main``, with Ctrl-C certain to end it: one line and exit code 130 even
    where the KeyboardInterrupt was swallowed or turned into another error (an extension module whose import
    it cut short raises ImportError), and the process ended ``INTERRUPT_GRACE_S`` after Ctrl-C if it is
    still running by then."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_interrupt)
        # Under torchrun the agent stops every rank with SIGTERM, and ranks blocked in a collective would not
        # see an exception: the ranks keep their work while they embed (``kept_rows``) and end at once elsewhere.
        if os.environ.get("WORLD_SIZE", "1") == "1" and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_terminate)
        sys.unraisablehook = _quiet_about_interrupts
    # A second command in one process starts afresh.
    _interrupt.update(received=False, reported=False, code=130, finished=False, command=_interrupt["command"] + 1)
    try:
        code = run_main(main)
    except (Exception, KeyboardInterrupt, Terminated):  # the last two: a signal that landed as run_main returned
        if not _interrupt["received"]:
            raise
        code = _interrupt["code"]  # what the interrupt broke on its way (an import it cut short fails as ImportError)
    finally:
        _interrupt["finished"] = True  # failed or not, the work is over: a later signal is no traceback
    if _interrupt["received"]:
        _report_interrupt()
        return _interrupt["code"]
    return code
