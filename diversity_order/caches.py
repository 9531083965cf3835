"""Per-row caches that know which rows are still valid.

A cache is three plain files beside each other:

- ``NAME.npy``: the data, one row per record, in input order (what the reference writes);
- ``NAME.fingerprints.npy``: uint64, the fingerprint of each row's text;
- ``NAME.cache.json``: what the rows were computed with (model, tokenizer, text field) and
  the row count; written last, so it marks the set as complete.

On the next run each record's text fingerprint is looked up among the cached ones: rows whose
text is unchanged are reused wherever they moved, only new or edited rows are recomputed,
removed rows are dropped, and a different model or text field invalidates everything. (The
reference compares row counts only and silently reuses stale vectors after an edit.)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import save_json, save_npy

log = logging.getLogger(__name__)


def sidecar_paths(data_path: Path) -> tuple[Path, Path]:
    stem = data_path.name[:-4] if data_path.name.endswith(".npy") else data_path.name
    return data_path.with_name(stem + ".fingerprints.npy"), data_path.with_name(stem + ".cache.json")


@dataclass
class CacheLookup:
    """Cached rows found for the current records."""

    data: np.ndarray | None  # rows for the current records, valid where ``hit``
    hit: np.ndarray  # bool per current record
    reason: str  # why nothing (or what) was reused, for the log

    @property
    def missing_rows(self) -> np.ndarray:
        return np.flatnonzero(~self.hit)


def lookup(data_path: Path, key: dict, fingerprints: np.ndarray, accept_any_key: bool = False) -> CacheLookup:
    """Reuse cached rows whose text fingerprint matches a current record's.

    ``accept_any_key``: reuse rows computed with whatever model the cache names (used when
    the caller has no model to compare against, e.g. token counts without a tokenizer).
    """
    n = fingerprints.shape[0]
    nothing = lambda reason: CacheLookup(None, np.zeros(n, dtype=bool), reason)  # noqa: E731
    fp_path, meta_path = sidecar_paths(data_path)
    if not meta_path.exists():
        if data_path.exists():
            return nothing(f"{data_path.name} has no fingerprints to check it against the input; recomputing")
        return nothing("no cache yet")
    try:
        meta = json.loads(meta_path.read_text())
        cached_fp = np.load(fp_path)
        cached = np.load(data_path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        return nothing(f"{data_path.name} cache unreadable ({exc}); recomputing")
    if not (cached.shape[0] == cached_fp.shape[0] == meta.get("rows")):
        return nothing(f"{data_path.name} cache files disagree on the row count; recomputing")
    if meta.get("key") != key and not accept_any_key:
        changed = sorted(k for k in set(key) | set(meta.get("key", {})) if key.get(k) != meta.get("key", {}).get(k))
        return nothing(f"{data_path.name} was computed with a different {', '.join(changed)}; recomputing all rows")
    order = np.argsort(cached_fp, kind="stable")
    sorted_fp = cached_fp[order]
    pos = np.searchsorted(sorted_fp, fingerprints)
    pos_clipped = np.minimum(pos, max(sorted_fp.size - 1, 0))
    hit = (pos < sorted_fp.size) & (sorted_fp[pos_clipped] == fingerprints) if sorted_fp.size else np.zeros(n, bool)
    data = np.zeros((n,) + cached.shape[1:], dtype=cached.dtype)
    if hit.any():
        data[hit] = cached[order[pos_clipped[hit]]]
    return CacheLookup(data, hit, f"{int(hit.sum())} of {n} rows reused from {data_path.name}")


def store(data_path: Path, key: dict, fingerprints: np.ndarray, data: np.ndarray) -> None:
    """Write the cache; the marker goes last, so a crash mid-way leaves no trusted set."""
    fp_path, meta_path = sidecar_paths(data_path)
    meta_path.unlink(missing_ok=True)
    save_npy(data_path, data)
    save_npy(fp_path, fingerprints.astype(np.uint64))
    save_json(meta_path, {"key": key, "rows": int(data.shape[0]), "dtype": str(data.dtype),
                          "shape": list(data.shape)})
