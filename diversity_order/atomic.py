"""Atomic file writes: a file a later run trusts is either complete or absent.

Everything users rely on (curated JSONL, caches, metadata, plots) is first written to a
temporary file in the destination folder, flushed and fsynced, then renamed over the target.
A crash or Ctrl-C at any point leaves at most a stray ``.NAME.HOST.PID.RANDOM.tmp`` file, never
a truncated target. The host and process id in the name tell a later run whether the writer is
gone (``remove_stale_temps``); a live writer's temp file is never removed. Files that are only right
together (a set of shards) are written under staged names first and renamed together
(``replaced_together``), so a run stopped part-way leaves the earlier set whole, not half replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

import numpy as np


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()
# The host as it appears in temp names: no characters a file name or the parser would trip on.
_HOST = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "localhost"
# Targets this process wrote or read caches from; ``sweep_stale_temps`` looks beside them.
_TOUCHED: set[Path] = set()


def give_plain_permissions(path: Path | str) -> None:
    """The permissions a plain ``open()`` would give a new file (read/write as the umask allows)."""
    os.chmod(path, 0o666 & ~_UMASK)


def temp_prefix(path: Path) -> str:
    """``.NAME.HOST.PID.``: the start of the temp file names of writes to ``path`` by this process."""
    return f".{path.name}.{_HOST}.{os.getpid()}."


def note_target(path: Path | str) -> None:
    """Remember ``path`` so that ``sweep_stale_temps`` also looks for dead writers' temps beside it."""
    _TOUCHED.add(Path(path).absolute())
    _LAST_TARGET[0] = Path(path).absolute()


# The file last set to be written (``note_target``): where a write that fails without naming its file was going.
_LAST_TARGET: list[Path | None] = [None]


def last_target() -> Path | None:
    return _LAST_TARGET[0]


def _temp_owner(path: Path, temp: Path) -> tuple[str, int] | None:
    """(host, pid) from ``.NAME.HOST.PID.RANDOM.tmp`` or ``.NAME.HOST.PID.staged.SUFFIX``; None for a name
    without them."""
    middle = temp.name[len(path.name) + 2 :]  # HOST.PID.RANDOM.tmp, or HOST.PID.staged.SUFFIX
    staged = middle.rfind(f".{STAGED}")
    middle = middle[:staged] + f".{STAGED}" if staged >= 0 else middle[: -len(".tmp")]
    parts = middle.rsplit(".", 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


STAGED = "staged"  # the mark in the names of files written to be renamed with others (``replaced_together``)


def staged_path(path: Path, suffix: str) -> Path:
    """Where a file of a set written together is written first: ``.NAME.HOST.PID.staged`` + ``suffix`` beside
    ``path``, ending as ``path`` does, so a writer that reads the name's suffix (.zst, .parquet) writes the same
    kind of file."""
    path = Path(path)
    return path.with_name(f"{temp_prefix(path)}{STAGED}{suffix}")


@contextlib.contextmanager
def replaced_together(paths: list[Path], suffix: str, before_commit=None) -> Iterator[list[Path]]:
    """Staged names for ``paths`` (``staged_path``) to write each file to, atomically as usual; on a clean exit
    ``before_commit()`` runs and every staged file is renamed over its path, Ctrl-C and SIGTERM held off until the
    last; else the staged files are removed and the files at ``paths`` stay as they were."""
    paths = [Path(p) for p in paths]
    for path in paths:
        note_target(path)  # a killed run's staged files are swept at the end of a later run
    staged = [staged_path(path, suffix) for path in paths]
    _STAGED_NOW.update(path.absolute() for path in staged)
    try:
        yield staged
        if before_commit is not None:
            before_commit()
        with signals_held():
            for source, target in zip(staged, paths):
                os.replace(source, target)
    except BaseException:
        for source in staged:
            with contextlib.suppress(FileNotFoundError):
                source.unlink()
        raise
    finally:
        _STAGED_NOW.difference_update(path.absolute() for path in staged)


# Staged files being written (``replaced_together``): already temp files, written in place rather than through
# another temp, so a killed run leaves only names a later run sweeps.
_STAGED_NOW: set[Path] = set()


@contextlib.contextmanager
def signals_held():
    """Ctrl-C and SIGTERM wait until the block ends (they are delivered then, to the handlers there were): work
    that must all happen, or none (a few renames; a finished cache being stored).

    Their handlers are swapped for one that notes them, rather than the signals blocked: a signal sent to the
    process may be taken by any of its threads (the embedding's pools, a writer), and Python then runs the handler
    in the main thread whatever that one blocks."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a real writer's id: leave it alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def remove_stale_temps(path: Path | str) -> list[Path]:
    """Delete the temp files that interrupted atomic writes to ``path`` left (``.NAME.*.tmp``, and the staged
    files of ``replaced_together``), when the process that wrote each one is gone; return those removed.

    Safe while other runs write ``path``: a temp of a live process on this host, or of any
    process on another host (which we cannot check), is kept. Temps without a host and PID in
    the name were written by an older version and are removed.
    """
    path = Path(path)
    removed = []
    try:
        candidates = [*path.parent.glob(f".{glob_escape(path.name)}.*.tmp"),
                      *path.parent.glob(f".{glob_escape(path.name)}.*.{STAGED}*")]
    except OSError:
        return removed
    for temp in candidates:
        owner = _temp_owner(path, temp)
        if owner is None:
            stale = True  # no host/PID: written by an older version, which no run of this one can be
        else:
            host, pid = owner
            stale = host == _HOST and pid != os.getpid() and not _process_alive(pid)
        if stale:
            with contextlib.suppress(OSError):
                if temp.is_dir() and not temp.is_symlink():  # a staging folder (a packed export's)
                    shutil.rmtree(temp)
                else:
                    temp.unlink()
                removed.append(temp)
    return removed


def sweep_stale_temps(paths: Iterable[Path | str] = ()) -> list[Path]:
    """``remove_stale_temps`` beside every file this process wrote (or read caches from), and
    ``paths``; for the end of a successful run, so a killed run's debris does not pile up."""
    targets = set(_TOUCHED) | {Path(p).absolute() for p in paths}
    _TOUCHED.clear()
    removed = []
    for target in sorted(targets):
        removed += remove_stale_temps(target)
    return removed


def glob_escape(name: str) -> str:
    """``name`` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", name)


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[str]:
    """The name of a temp file beside ``path`` (for writers that open files themselves, e.g. pyarrow's);
    on a clean exit it gets a plain file's permissions and is renamed over ``path``, else removed."""
    path = Path(path)
    if path.absolute() in _STAGED_NOW:
        try:
            yield str(path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            raise
        give_plain_permissions(path)
        return
    note_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        give_plain_permissions(tmp_name)  # mkstemp creates 0600 files
        yield tmp_name
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


@contextlib.contextmanager
def atomic_link(source: Path | str, path: Path | str) -> Iterator[str]:
    """A hard link to ``source`` beside ``path``, under a temp name the caller may check; on a clean exit it is
    renamed over ``path``, else removed. OSError where no link can be made (another filesystem, one without
    links). The file is shared, not copied: it keeps ``source``'s permissions."""
    path = Path(path)
    note_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = str(path.parent / f"{temp_prefix(path)}{secrets.token_hex(4)}.tmp")
    os.link(source, tmp_name)
    try:
        yield tmp_name
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "wb") -> Iterator[IO]:
    """Open a temp file beside ``path``; on a clean exit rename it over ``path``."""
    with atomic_path(path) as tmp_name, open(tmp_name, mode) as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


def save_npy(path: Path | str, array: np.ndarray) -> None:
    with atomic_open(path, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array))


def save_json(path: Path | str, obj) -> None:
    with atomic_open(path, "w") as handle:
        json.dump(obj, handle, indent=2, default=json_default)
        handle.write("\n")


def json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
