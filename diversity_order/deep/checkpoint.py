"""Checkpoints of deep extraction: each rank's (or tensor-parallel group's) rows so far, written
atomically so a killed run resumes where it stopped, plus the list of documents skipped for memory."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import numpy as np

from .. import distributed
from ..atomic import remove_stale_temps, save_json, save_npy

log = logging.getLogger("diversity_order.deep")


def partial_paths(output: Path, ctx: distributed.DistContext) -> tuple[Path, Path, Path]:
    stem = f"{output.name}.rank{ctx.rank}.partial" if ctx.active else f"{output.name}.partial"
    base = output.parent / stem
    return Path(f"{base}.npy"), Path(f"{base}.done.npy"), Path(f"{base}.json")


def skipped_path(output: Path) -> Path:
    return output.parent / f"{output.name}.skipped.json"


class Partial:
    """This rank's rows, their vectors so far and the done mask, checkpointed atomically."""

    def __init__(self, output: Path, ctx: distributed.DistContext, rows: np.ndarray, dim: int, key: dict,
                 writer: bool = True):
        self.data_path, self.done_path, self.key_path = partial_paths(output, ctx)
        self.rows = rows  # input rows, ascending
        self.key = key
        self.writer = writer  # False: a tensor-parallel helper rank, which touches no files
        self.data = np.zeros((rows.size, dim), dtype=np.float32)
        self.done = np.zeros(rows.size, dtype=bool)
        if writer:
            self._load()

    def _load(self) -> None:
        if not self.key_path.exists():
            return
        try:
            stored = json.loads(self.key_path.read_text())
        except (OSError, ValueError):
            stored = None
        if stored != self.key:
            log.warning("%s: checkpoint is for other data, model or settings; starting over", self.key_path.name)
            self.remove()
            return
        try:
            data = np.load(self.data_path)
            done = np.load(self.done_path)
        except (OSError, ValueError):
            log.warning("%s: checkpoint unreadable or incomplete; starting over", self.data_path.name)
            return
        if data.shape != self.data.shape or done.shape != self.done.shape or data.dtype != np.float32:
            log.warning("%s: checkpoint has the wrong shape; starting over", self.data_path.name)
            return
        self.data, self.done = data.copy(), done.astype(bool)
        log.info("Resuming from %s: %d of %d rows already done", self.data_path.name, int(self.done.sum()), self.done.size)

    def start(self) -> None:
        if self.writer:
            save_json(self.key_path, self.key)

    def checkpoint(self) -> None:
        if not self.writer:
            return
        # Data before the mask: a crash in between leaves data newer than the mask, which is safe.
        save_npy(self.data_path, self.data)
        save_npy(self.done_path, self.done)

    def remove(self) -> None:
        if not self.writer:
            return
        for path in (self.data_path, self.done_path, self.key_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            remove_stale_temps(path)  # debris of a checkpoint write a killed run never finished


