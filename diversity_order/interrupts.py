"""Whether Ctrl-C was pressed, for code that must stop though a library dropped the KeyboardInterrupt.

Python raises KeyboardInterrupt wherever the main thread is, and some libraries catch and drop it (seen
during a UMAP fit: the run went on to write every file). A command's Ctrl-C handler (``cli.run_command``)
calls ``request_interrupt``; stages (``runtime.StageTimer``) call ``stop_if_interrupted`` when they start
and end, so such a run stops at the next stage. Work that keeps what an interrupted run did (``finishing``)
holds off the end a command's handler forces some seconds after Ctrl-C. No imports but the standard
library's lightest: the handler is set before anything heavy loads.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_requested = {"set": False}
_finishing: list[str] = []  # what is being kept after Ctrl-C, innermost last


def request_interrupt() -> None:
    """Ctrl-C was pressed: ``stop_if_interrupted`` raises KeyboardInterrupt from now on."""
    _requested["set"] = True


def stop_if_interrupted() -> None:
    if _requested["set"]:
        raise KeyboardInterrupt


@contextlib.contextmanager
def finishing(what: str):
    """While inside, a command interrupted by Ctrl-C is not ended by force (``what`` says why, to the user);
    Ctrl-C again still stops it."""
    _finishing.append(what)
    try:
        yield
    finally:
        _finishing.remove(what)


def finishing_what() -> str | None:
    """What is being kept after Ctrl-C (``finishing``), or None."""
    return _finishing[-1] if _finishing else None


class Terminated(SystemExit):
    """SIGTERM (Slurm preemption or time limit, ``timeout``, ``docker stop``), raised so the work done so far can
    be kept and the run end with a line, as after Ctrl-C."""


@contextlib.contextmanager
def sigterm_raises():
    """While open, SIGTERM raises ``Terminated`` (exit status 143, as a shell reports for a process SIGTERM
    ended), so the work done so far can be kept; Python's default would end the process at once and lose it."""
    current = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or current is not signal.SIG_DFL:
        yield  # not ours to change, or a command's handler that raises Terminated already (``raises_terminated``)
        return

    def handler(signum, frame):
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
