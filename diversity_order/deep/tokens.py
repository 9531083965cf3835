"""Token ids for deep extraction: each document tokenized once, truncated, and cached beside the output.

The cache (``OUTPUT.tokens.*``) is a ``caches`` row cache keyed by text fingerprint, tokenizer,
text field and truncation: its rows are each document's kept and full token counts, and its
extra file the ids of all its documents back to back. A resumed or repeated run tokenizes only
texts it has not seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import caches
from ..records import RecordIndex, iter_text_batches
from ..runtime import Progress
from .config import TOKENIZE_CHUNK_DOCS

log = logging.getLogger("diversity_order.deep")

ID_DTYPE = np.int32  # token ids; every tokenizer in use has far fewer than 2**31 entries


def token_cache_files(output: Path) -> caches.CacheFiles:
    """``OUTPUT.tokens.lengths.npy`` (kept and full count per row), fingerprints, ids, marker ``OUTPUT.tokens.json``."""
    base = output.parent / f"{output.name}.tokens"
    return caches.CacheFiles(Path(f"{base}.lengths.npy"), Path(f"{base}.fingerprints.npy"), Path(f"{base}.json"),
                             {"ids": Path(f"{base}.ids.npy")})


def tokenize_rows(index: RecordIndex, rows: np.ndarray, tokenizer, max_len: int | None,
                  progress: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of ``rows`` (ascending; each tokenized once): flat ids truncated to ``max_len``
    (int32), each row's kept length and its untruncated length, in the order of ``rows``."""
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    pieces: list[np.ndarray] = []
    lengths = np.zeros(rows.size, dtype=np.int64)
    full = np.zeros(rows.size, dtype=np.int64)
    done = 0
    with Progress(int(rows.size), "Tokenizing", bar=progress) as bar:
        for batch_rows, texts in iter_text_batches(index, rows, max_batch_rows=TOKENIZE_CHUNK_DOCS):
            flat, counts = tokenizer.encode_batch(texts)
            kept = counts if max_len is None else np.minimum(counts, max_len)
            if max_len is not None and (kept < counts).any():
                starts = np.cumsum(counts) - counts
                flat = np.concatenate([flat[s : s + k] for s, k in zip(starts.tolist(), kept.tolist())] or [flat[:0]])
            pieces.append(flat.astype(ID_DTYPE, copy=False))
            # iter_text_batches yields rows in the order asked for, so positions are consecutive.
            lengths[done : done + len(batch_rows)] = kept
            full[done : done + len(batch_rows)] = counts
            done += len(batch_rows)
            bar.update(len(batch_rows), work=int(kept.sum()))
    flat_all = np.concatenate(pieces) if pieces else np.zeros(0, dtype=ID_DTYPE)
    return flat_all, lengths, full


@dataclass
class Tokens:
    """Token ids of the current records (those loaded), indexed by input row."""

    flat: np.ndarray  # ids of the loaded rows, concatenated (may be a memory map)
    starts: np.ndarray  # int64 per input row: offset in ``flat`` (-1: not loaded)
    lengths: np.ndarray  # int64 per input row: kept (truncated) token count
    full_lengths: np.ndarray  # int64 per input row: count before truncation
    tokenized: int = 0  # rows tokenized in this run (the rest came from the cache)

    def ids(self, row: int) -> np.ndarray:
        start = int(self.starts[row])
        return np.asarray(self.flat[start : start + int(self.lengths[row])])


def prepare_tokens(output: Path, key: dict, index: RecordIndex, fingerprints: np.ndarray, needed: np.ndarray,
                   tokenizer, max_len: int | None, progress: bool, writer: bool) -> Tokens:
    """Token ids of the ``needed`` rows: reused from ``OUTPUT.tokens.*`` where the text
    fingerprint (and tokenizer, text field, truncation) match, the rest tokenized once.

    The cache is rewritten (``writer`` only) when anything new was tokenized; it then keeps
    every current record it knows (old rows whose text is still in the input, plus the new).
    """
    n = fingerprints.size
    files = token_cache_files(output)
    found = caches.lookup(files, key, fingerprints, dtype=np.int64, row_shape=(2,))  # kept and full length
    if found.data is None and files.marker.exists():
        log.info("%s: %s; tokenizing again", files.marker.name, found.reason)
    hit = found.hit
    lengths = np.zeros(n, dtype=np.int64)
    full = np.zeros(n, dtype=np.int64)
    starts = np.full(n, -1, dtype=np.int64)
    cached_ids = found.extras.get("ids")
    if found.data is not None:
        lengths[hit], full[hit] = found.data[hit, 0], found.data[hit, 1]
        cached_lengths = np.asarray(found.cached[:, 0])  # the validated set's rows, as stored
        cached_starts = np.cumsum(cached_lengths) - cached_lengths
        starts[hit] = cached_starts[found.source[hit]]
    missing = needed[~hit[needed]]
    if missing.size == 0:
        if needed.size:
            log.info("Tokens of all %d document(s) to embed reused from %s", needed.size, files.marker.name)
        return Tokens(cached_ids if cached_ids is not None else np.zeros(0, ID_DTYPE), starts, lengths, full)
    if needed.size > missing.size:
        log.info("Tokens: %d of %d document(s) reused from the cache, %d to tokenize",
                 needed.size - missing.size, needed.size, missing.size)
    new_flat, new_lengths, new_full = tokenize_rows(index, missing, tokenizer, max_len, progress)
    new_starts = np.cumsum(new_lengths) - new_lengths
    lengths[missing], full[missing] = new_lengths, new_full
    # The new cache: every current row known (cached or just tokenized), in input order.
    keep = hit.copy()
    keep[missing] = True
    keep_rows = np.flatnonzero(keep)
    out_lengths = lengths[keep_rows]
    out_starts = np.cumsum(out_lengths) - out_lengths
    flat = np.zeros(int(out_lengths.sum()), dtype=ID_DTYPE)
    from_new = np.full(n, -1, dtype=np.int64)
    from_new[missing] = new_starts
    for row, at, length in zip(keep_rows.tolist(), out_starts.tolist(), out_lengths.tolist()):
        if from_new[row] >= 0:
            flat[at : at + length] = new_flat[from_new[row] : from_new[row] + length]
        else:
            flat[at : at + length] = cached_ids[starts[row] : starts[row] + length]
    starts = np.full(n, -1, dtype=np.int64)
    starts[keep_rows] = out_starts
    if writer:
        caches.store(files, key, fingerprints[keep_rows], np.stack([out_lengths, full[keep_rows]], axis=1),
                     extras={"ids": flat})
    return Tokens(flat, starts, lengths, full, tokenized=int(missing.size))
