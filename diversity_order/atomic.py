"""Atomic file writes: a file a later run trusts is either complete or absent.

Everything users rely on (curated JSONL, caches, metadata, plots) is first written to a
temporary file in the destination folder, flushed and fsynced, then renamed over the target.
A crash or Ctrl-C at any point leaves at most a stray ``.tmp`` file, never a truncated target.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def give_plain_permissions(path: Path | str) -> None:
    """The permissions a plain ``open()`` would give a new file (read/write as the umask allows)."""
    os.chmod(path, 0o666 & ~_UMASK)


def remove_stale_temps(path: Path | str) -> None:
    """Delete the temp files that interrupted atomic writes to ``path`` left (``.NAME.*.tmp``).

    Only call this when no other process can be writing ``path`` (e.g. after the work is done).
    """
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "wb") -> Iterator[IO]:
    """Open a temp file beside ``path``; on a clean exit rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        give_plain_permissions(tmp_name)  # mkstemp creates 0600 files
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def save_npy(path: Path | str, array: np.ndarray) -> None:
    with atomic_open(path, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array))


def save_json(path: Path | str, obj) -> None:
    with atomic_open(path, "w") as handle:
        json.dump(obj, handle, indent=2, default=_json_default)
        handle.write("\n")


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
