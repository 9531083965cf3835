"""Per-row caches that know which rows are still valid.

A cache is a few plain files beside each other (``CacheFiles``):

- ``NAME.npy``: the data, one row per record, in input order (what the original toolkit writes);
- ``NAME.fingerprints.npy``: uint64, the fingerprint of each row's text;
- optional extras, e.g. the flat token ids whose per-row lengths are the data;
- ``NAME.cache.json``: what the rows were computed with (model, tokenizer, text field) and
  the row count; written last, so it marks the set as complete.

On the next run each record's text fingerprint is looked up among the cached ones: rows whose
text is unchanged are reused wherever they moved, only new or edited rows are recomputed,
removed rows are dropped, and a different model or text field invalidates everything. (The
original toolkit compares row counts only and silently reuses stale vectors after an edit.)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .atomic import save_json, save_npy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheFiles:
    """The files of one cache."""

    data: Path
    fingerprints: Path
    marker: Path
    extras: dict[str, Path] = field(default_factory=dict)


def files_for(data_path: Path, extras: tuple[str, ...] = ()) -> CacheFiles:
    """The usual names beside ``NAME.npy``: ``NAME.fingerprints.npy``, ``NAME.cache.json``, ``NAME.EXTRA.npy``."""
    data_path = Path(data_path)
    stem = data_path.name[:-4] if data_path.name.endswith(".npy") else data_path.name
    return CacheFiles(data_path, data_path.with_name(stem + ".fingerprints.npy"), data_path.with_name(stem + ".cache.json"),
                      {name: data_path.with_name(f"{stem}.{name}.npy") for name in extras})


def sidecar_paths(data_path: Path) -> tuple[Path, Path]:
    """(fingerprints, marker) beside ``data_path``."""
    files = files_for(data_path)
    return files.fingerprints, files.marker


@dataclass
class CacheLookup:
    """Cached rows found for the current records."""

    data: np.ndarray | None  # rows for the current records, valid where ``hit``
    hit: np.ndarray  # bool per current record
    reason: str  # why nothing (or what) was reused, for the log
    source: np.ndarray | None = None  # int64 per current record: its row in the cache (-1: none)
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # the cache's extras, memory-mapped

    @property
    def missing_rows(self) -> np.ndarray:
        return np.flatnonzero(~self.hit)


def _files(target: Path | CacheFiles) -> CacheFiles:
    return target if isinstance(target, CacheFiles) else files_for(target)


def lookup(target: Path | CacheFiles, key: dict, fingerprints: np.ndarray, accept_any_key: bool = False) -> CacheLookup:
    """Reuse cached rows whose text fingerprint matches a current record's.

    ``accept_any_key``: reuse rows computed with whatever model the cache names (used when
    the caller has no model to compare against, e.g. token counts without a tokenizer).
    """
    files = _files(target)
    n = fingerprints.shape[0]
    nothing = lambda reason: CacheLookup(None, np.zeros(n, dtype=bool), reason)  # noqa: E731
    if not files.marker.exists():
        if files.data.exists():
            return nothing(f"{files.data.name} has no fingerprints to check it against the input; recomputing")
        return nothing("no cache yet")
    try:
        meta = json.loads(files.marker.read_text())
        cached_fp = np.load(files.fingerprints)
        cached = np.load(files.data, mmap_mode="r")
        extras = {name: np.load(path, mmap_mode="r") for name, path in files.extras.items()}
    except (OSError, ValueError) as exc:
        return nothing(f"{files.data.name} cache unreadable ({exc}); recomputing")
    if not (cached.shape[0] == cached_fp.shape[0] == meta.get("rows")):
        return nothing(f"{files.data.name} cache files disagree on the row count; recomputing")
    if any(meta.get("extras", {}).get(name) != int(array.shape[0]) for name, array in extras.items()):
        return nothing(f"{files.data.name} cache files disagree on their sizes; recomputing")
    if meta.get("key") != key and not accept_any_key:
        changed = sorted(k for k in set(key) | set(meta.get("key", {})) if key.get(k) != meta.get("key", {}).get(k))
        return nothing(f"{files.data.name} was computed with a different {', '.join(changed)}; recomputing all rows")
    source = match_rows(cached_fp, fingerprints)
    hit = source >= 0
    data = np.zeros((n,) + cached.shape[1:], dtype=cached.dtype)
    if hit.any():
        data[hit] = cached[source[hit]]
    return CacheLookup(data, hit, f"{int(hit.sum())} of {n} rows reused from {files.data.name}", source, extras)


def match_rows(cached_fingerprints: np.ndarray, fingerprints: np.ndarray) -> np.ndarray:
    """For each fingerprint, the index of an equal one among ``cached_fingerprints`` (-1: none)."""
    source = np.full(fingerprints.shape[0], -1, dtype=np.int64)
    if cached_fingerprints.size == 0:
        return source
    order = np.argsort(cached_fingerprints, kind="stable")
    pos = np.searchsorted(cached_fingerprints[order], fingerprints)
    clipped = np.minimum(pos, cached_fingerprints.size - 1)
    hit = (pos < cached_fingerprints.size) & (cached_fingerprints[order[clipped]] == fingerprints)
    source[hit] = order[clipped[hit]]
    return source


def store(target: Path | CacheFiles, key: dict, fingerprints: np.ndarray, data: np.ndarray,
          extras: dict[str, np.ndarray] | None = None) -> None:
    """Write the cache; the marker goes last, so a crash mid-way leaves no trusted set."""
    files = _files(target)
    extras = extras or {}
    files.marker.unlink(missing_ok=True)
    for name, array in extras.items():
        save_npy(files.extras[name], array)
    save_npy(files.data, data)
    save_npy(files.fingerprints, fingerprints.astype(np.uint64))
    meta = {"key": key, "rows": int(data.shape[0]), "dtype": str(data.dtype), "shape": list(data.shape)}
    if extras:
        meta["extras"] = {name: int(array.shape[0]) for name, array in extras.items()}
    save_json(files.marker, meta)
