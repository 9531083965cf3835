"""Checkpoints of deep extraction: each rank's (or tensor-parallel group's) rows so far, saved so a
killed run resumes where it stopped, plus the list of documents skipped for memory.

Four files per share: ``.partial.json`` (the key: data, model, settings), ``.partial.rows.npy`` (the
input rows of the share), ``.partial.npy`` (one row per document of the share, a plain .npy) and
``.partial.done.npy`` (which rows are valid).
The rows file is created at its full size when the run starts (space reserved up front, so a
full disk is reported before any work, not hours later), and each checkpoint writes into it only
the rows finished since the previous one, syncs them, then replaces the done mask atomically. A
row counts only once a mask names it, so a crash at any point leaves a consistent checkpoint; and
a checkpoint costs the new rows, not the whole share (which grew with every checkpoint before).

A rerun takes up the rows of every checkpoint of this output whose key matches (``adopt``), whatever
the launch that wrote it (one process, or any number of ranks or groups: the shares differ), and
keeps them in one file, ``OUTPUT.resumed.npz``, replaced atomically, until the output is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import distributed, matrix
from ..atomic import atomic_open, remove_stale_temps, save_json, save_npy
from ..errors import UserError

log = logging.getLogger("diversity_order.deep")


def partial_paths(output: Path, ctx: distributed.DistContext) -> tuple[Path, Path, Path]:
    stem = f"{output.name}.rank{ctx.rank}.partial" if ctx.active else f"{output.name}.partial"
    data, done, _ = _share_files(output.parent / f"{stem}.json")
    return data, done, output.parent / f"{stem}.json"


def _share_files(key_path: Path) -> tuple[Path, Path, Path]:
    """(rows so far, done mask, input rows of the share) beside a share's key ``X.partial.json``."""
    stem = key_path.name.removesuffix(".json")
    return (key_path.with_name(stem + ".npy"), key_path.with_name(stem + ".done.npy"),
            key_path.with_name(stem + ".rows.npy"))


def unfinished_share(data_path: Path) -> tuple[int | None, int | None] | None:
    """(rows done, rows) where ``data_path`` is a share's rows so far (``X.partial.npy`` beside its key or done
    mask): an unfinished extraction's checkpoint, whose other rows are zeros (None: its mask is unreadable).
    None for any other file."""
    path = Path(data_path)
    if not path.name.endswith(".partial.npy"):
        return None
    key_path = path.with_name(path.name.removesuffix(".npy") + ".json")
    done_path = _share_files(key_path)[1]
    if not (key_path.exists() or done_path.exists()):
        return None
    try:
        done = np.load(done_path)
        return int(np.count_nonzero(done)), int(done.size)
    except (OSError, ValueError):
        return None, None


def rows_path(key_path: Path) -> Path:
    """``X.partial.rows.npy`` beside ``X.partial.json``: the input rows of the share."""
    return _share_files(key_path)[2]


def resumed_path(output: Path) -> Path:
    return output.parent / f"{output.name}.resumed.npz"


def skipped_path(output: Path) -> Path:
    return output.parent / f"{output.name}.skipped.json"


def rows_digest(rows: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(rows, dtype=np.int64).tobytes(), digest_size=16).hexdigest()


# Fields of a checkpoint's key that differ between launches of the same work: the share's rows, and the
# width (known only once the model is loaded; the model's fingerprint pins it).
_SHARE_FIELDS = ("rows", "dim")


@dataclass
class Adopted:
    """Rows an interrupted run finished, from its checkpoints: input rows (ascending) and their vectors."""

    rows: np.ndarray
    data: np.ndarray
    sources: list  # the checkpoints' key files they came from (and the resumed file), to remove once kept


def _work_of(key: dict) -> dict:
    return {name: value for name, value in key.items() if name not in _SHARE_FIELDS}


def _checkpoint_keys(output: Path) -> list[Path]:
    """Every checkpoint's key file of ``output``: one process's and any rank's or group's."""
    pattern = re.compile(rf"{re.escape(output.name)}(\.rank\d+)?\.partial\.json")
    return sorted(path for path in output.parent.glob("*.partial.json") if pattern.fullmatch(path.name))


class _NotThisWork(Exception):
    """A checkpoint (or resumed file) of other data, model or settings, or one that cannot be read."""


# What a damaged .npy/.npz raises on loading: truncated (ValueError, EOFError, BadZipFile), unreadable (OSError).
_DAMAGED = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def _rows_fit(rows: np.ndarray, data: np.ndarray, work: dict, dim: int | None) -> bool:
    """Rows (input positions of this work) and their vectors, one per row, of the model's width (``dim``; None:
    the model's config does not say it)."""
    records = work.get("records")
    return rows.ndim == 1 and rows.dtype.kind in "iu" and data.dtype == np.float32 and data.ndim == 2 \
        and data.shape[0] == rows.size and data.shape[1] == (dim or data.shape[1]) \
        and (rows.size == 0 or (isinstance(records, int) and 0 <= int(rows.min()) and int(rows.max()) < records))


def _read_share(key_path: Path, work: dict, dim: int | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The finished rows and vectors of one checkpoint of this work; None where no rows are saved yet or it has
    no rows file (written before rows files were kept: taken up by its own launch only). _NotThisWork where it is
    another work's or damaged."""
    try:
        stored = json.loads(key_path.read_text())
    except (OSError, ValueError):
        raise _NotThisWork("damaged (its key cannot be read)") from None
    if not isinstance(stored, dict) or _work_of(stored) != work:
        raise _NotThisWork("for other data, model or settings")
    data_path, done_path, rows_file = _share_files(key_path)
    if not rows_file.exists() or not done_path.exists():  # (no mask: no rows saved yet)
        return None
    try:
        rows = np.load(rows_file)
        done = np.load(done_path)
        data = np.load(data_path, mmap_mode="r")
    except _DAMAGED:
        raise _NotThisWork("damaged") from None
    if not isinstance(rows, np.ndarray) or not isinstance(done, np.ndarray) or not isinstance(data, np.ndarray) \
            or not _rows_fit(rows, data, work, dim or stored.get("dim")) or rows_digest(rows) != stored.get("rows") \
            or done.shape != rows.shape or done.dtype != bool:
        raise _NotThisWork("damaged")
    return rows[done].astype(np.int64), np.asarray(data[done], dtype=np.float32)


def _read_resumed(path: Path, work: dict, dim: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows and vectors an earlier adoption kept; _NotThisWork where they are another work's or damaged."""
    try:
        with np.load(path) as held:
            if json.loads(str(held["key"])) != work:
                raise _NotThisWork("for other data, model or settings")
            rows, data = held["rows"], held["data"]
    except (*_DAMAGED, AttributeError):  # (AttributeError: a .npy, not an .npz, under its name)
        raise _NotThisWork("damaged") from None
    if not _rows_fit(rows, data, work, dim):
        raise _NotThisWork("damaged")
    return rows.astype(np.int64), data


def adopt(output: Path, key: dict, dim: int | None) -> Adopted | None:
    """The rows every checkpoint of this work holds (``key``: the run's checkpoint key, its share fields left
    aside; ``dim``: the model's width), from any launch, and those of an earlier adoption; None where there are
    none. Checkpoints of other work, and damaged ones, are removed with a warning: no run could take them up. Main
    rank only."""
    work = _work_of(key)
    parts, sources = [], []
    resumed = resumed_path(output)
    if resumed.exists():
        try:
            parts.append(_read_resumed(resumed, work, dim))
            sources.append(resumed)
        except _NotThisWork as why:
            log.warning("%s: %s; removed, and the rows it held are computed again", resumed.name, why)
            _remove(resumed)
    for key_path in _checkpoint_keys(output):
        try:
            share = _read_share(key_path, work, dim)
        except _NotThisWork as why:
            log.warning("%s: checkpoint %s; removed, starting over", key_path.name, why)
            remove_checkpoint(key_path)
            continue
        if share is not None:
            parts.append(share)
            sources.append(key_path)
    parts = [(rows, data) for rows, data in parts if rows.size]
    if len({data.shape[1] for _, data in parts}) > 1:  # (only where the model's config states no width)
        log.warning("%s: the checkpoints' rows differ in width; they are computed again", output.name)
        return None
    if not parts:
        return None
    rows = np.concatenate([r for r, _ in parts])
    data = np.concatenate([d for _, d in parts])
    rows, first = np.unique(rows, return_index=True)  # (a row in two files: the first's; both are the same work)
    return Adopted(rows, data[first], sources)


def remove_leftovers(output: Path, said: str = "Removed what an interrupted run left beside") -> None:
    """Every checkpoint and resumed file of ``output``, once it holds every row (a run killed after writing it,
    or one of another launch killed before its first checkpoint, leaves them; a later recompute must not take them
    up). Main rank only."""
    leftovers = _checkpoint_keys(output) + [path for path in (resumed_path(output),) if path.exists()]
    for path in leftovers:
        if path.name.endswith(".partial.json"):
            remove_checkpoint(path)
        else:
            _remove(path)
    if leftovers:
        log.info("%s %s (%s): the output holds every row", said, output.name, ", ".join(path.name for path in leftovers))


def remove_resumed(output: Path) -> None:
    """The adopted rows' file, once the output holds them."""
    _remove(resumed_path(output))


def _remove(path: Path) -> None:
    """``path`` and its temp files gone; one that cannot be removed (another user's, a folder) is warned of."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("%s: cannot remove it (%s); remove it yourself, or the next run says this again", path,
                    exc.strerror or exc)
    remove_stale_temps(path)


def keep_adopted(output: Path, key: dict, adopted: Adopted) -> None:
    """Put the adopted rows in the resumed file (one atomic replace: the earlier adoption's rows are in the
    new file), then remove the checkpoints they came from, so a run killed at any point loses none of them."""
    path = resumed_path(output)
    if adopted.sources != [path]:
        try:
            with atomic_open(path, "wb") as handle:
                np.savez(handle, key=np.asarray(json.dumps(_work_of(key))), rows=adopted.rows, data=adopted.data)
        except OSError as exc:
            raise UserError(f"cannot write {path} ({adopted.data.nbytes / 1e6:,.1f} MB, the rows an interrupted "
                            f"run finished): {exc.strerror or exc}; free space or fix the folder, then rerun") from None
    for source in adopted.sources:
        if source != path:
            remove_checkpoint(source)


def remove_checkpoint(key_path: Path) -> None:
    """One share's checkpoint files, the done mask first (what is left is then "no rows saved yet")."""
    data, done, rows = _share_files(key_path)
    for path in (done, data, rows, key_path):
        _remove(path)


class Partial:
    """This rank's rows, their vectors so far and the done mask, checkpointed incrementally."""

    def __init__(self, output: Path, ctx: distributed.DistContext, rows: np.ndarray, dim: int, key: dict,
                 writer: bool = True):
        self.data_path, self.done_path, self.key_path = partial_paths(output, ctx)
        self.rows = rows  # input rows, ascending
        self.key = key
        self.writer = writer  # False: a tensor-parallel helper rank, which touches no files
        self.reports = ctx.is_main  # one line about free space, not one per rank
        self.data = np.zeros((rows.size, dim), dtype=np.float32)
        self.done = np.zeros(rows.size, dtype=bool)
        self.saved = np.zeros(rows.size, dtype=bool)  # rows already in the checkpoint files
        self.offset = 0  # where the rows start in data_path (after the .npy header)
        self.writes = 0  # checkpoints written (tests count them)
        if writer and not self._load():
            self._create()

    def _load(self) -> bool:
        """Take up a checkpoint of this very work; False (and nothing kept) when there is none to trust."""
        if not self.key_path.exists():
            return False
        try:
            stored = json.loads(self.key_path.read_text())
        except (OSError, ValueError):
            stored = None
        if stored != self.key:
            log.warning("%s: checkpoint is for other data, model or settings; starting over", self.key_path.name)
            return False
        if not self.done_path.exists():
            # The run before stopped before its first checkpoint: nothing was saved, nothing is lost.
            log.info("%s: no rows checkpointed yet; starting from the beginning", self.key_path.name)
            return False
        try:
            done = np.load(self.done_path)
            data = np.load(self.data_path)
            offset = _data_offset(self.data_path)
        except (OSError, ValueError) as exc:  # missing or truncated: rows the mask names are lost
            log.warning("%s: checkpoint damaged (%s); starting over", self.data_path.name, exc)
            return False
        if data.shape != self.data.shape or done.shape != self.done.shape or data.dtype != np.float32 or \
                done.dtype != bool or np.isfortran(data):
            log.warning("%s: checkpoint damaged (rows %s %s, done mask %s; expected %s); starting over",
                        self.data_path.name, data.shape, data.dtype, done.shape, self.data.shape)
            return False
        self.data, self.done, self.saved, self.offset = data, done.copy(), done.copy(), offset
        log.info("Resuming from %s: %d of %d rows already done", self.data_path.name, int(self.done.sum()),
                 self.done.size)
        return True

    def _create(self) -> None:
        """A fresh checkpoint: no mask (no row counts yet), the rows file at its full size."""
        self.remove()
        nbytes = self.data.nbytes
        try:
            with open(self.data_path, "wb") as handle:
                np.lib.format.write_array_header_1_0(handle, np.lib.format.header_data_from_array_1_0(self.data))
                self.offset = handle.tell()
                handle.truncate(self.offset + nbytes)
                # A full disk fails here, at the start, not at a later checkpoint.
                matrix.reserve(handle.fileno(), self.offset, nbytes)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.data_path.unlink()
            raise UserError(f"cannot create the checkpoint {self.data_path} ({matrix.size_text(nbytes)}): "
                            f"{exc.strerror or exc}; free space or choose another --output folder") from None
        self._warn_if_output_will_not_fit()

    def _warn_if_output_will_not_fit(self) -> None:
        """Writing the output at the end needs room for all its rows: say so now, not after the run."""
        records = self.key.get("records")
        if not (self.reports and isinstance(records, int)):
            return
        needed = records * self.data.shape[1] * 4
        free = shutil.disk_usage(self.data_path.parent).free
        if free < needed:
            log.warning("%s: %s free, but writing the output at the end needs %s; free space before "
                        "then (the checkpoint keeps the rows: a rerun after a failed write only writes)",
                        self.data_path.parent, matrix.size_text(free), matrix.size_text(needed))

    def start(self) -> None:
        if self.writer:
            save_npy(rows_path(self.key_path), self.rows)  # before the key: a key names rows that are there
            save_json(self.key_path, self.key)

    def checkpoint(self) -> None:
        """Save the rows finished since the last checkpoint, then the mask that makes them count."""
        if not self.writer:
            return
        new = np.flatnonzero(self.done & ~self.saved)
        if new.size == 0:
            return
        try:
            with open(self.data_path, "r+b") as handle:
                row_bytes = self.data.shape[1] * 4
                for start, stop in _runs(new):
                    handle.seek(self.offset + start * row_bytes)
                    handle.write(self.data[start:stop].tobytes())
                handle.flush()
                os.fsync(handle.fileno())
            # The rows before the mask: a crash in between leaves rows no mask names, never the reverse.
            save_npy(self.done_path, self.done)
        except OSError as exc:
            saved = int(self.saved.sum())
            raise UserError(f"cannot write the checkpoint {self.data_path.name} in {self.data_path.parent}: "
                            f"{exc.strerror or exc}; the last checkpoint ({saved} of {self.done.size} rows) is "
                            f"intact: free space or fix the folder, then rerun to resume") from None
        self.saved[new] = True
        self.writes += 1

    def remove(self) -> None:
        if self.writer:
            remove_checkpoint(self.key_path)  # debris of a checkpoint write a killed run never finished too


def _data_offset(path: Path) -> int:
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        if version not in ((1, 0), (2, 0)):  # np.save writes 1.0 (2.0 for huge headers) for float32 rows
            raise ValueError(f".npy format version {version}")
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        read(handle)
        return handle.tell()


def _runs(positions: np.ndarray):
    """(start, stop) of each run of consecutive ``positions`` (sorted)."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [positions.size]])
    for a, b in zip(starts.tolist(), stops.tolist()):
        yield int(positions[a]), int(positions[b - 1]) + 1
