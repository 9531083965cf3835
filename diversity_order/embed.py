"""Shallow embeddings: each document is the L2-normalised mean of its tokens' input-embedding rows.

On the CPU the table is a float32 numpy array and a compiled loop pools a batch of documents
(beside the tokenizer, on one thread per ``CORES_PER_POOLING_THREAD`` cores); on a GPU it is a torch
tensor and ``torch.nn.functional.embedding_bag`` pools the batch in one kernel call. Both sum in
float32 (the original toolkit computes in the table's dtype, bf16 for most checkpoints, and
differs from this by ~0.3%). A document with no tokens has no mean: it gets the zero vector and
a warning (the original toolkit gets NaN, which breaks k-means).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from .runtime import Behind, Progress, prefetched, usable_cores
from .tokenizer import DocumentTokenizer, TemplateRefused

log = logging.getLogger(__name__)


# Pooling runs beside the tokenizer, which keeps every core busy; it is ~6% of the tokenizer's work, so one
# pooling thread per this many cores keeps up (a single thread pools ~5.5M tokens/s: the tokenizer on 16+
# cores outruns it), and more would only contend with the tokenizer.
CORES_PER_POOLING_THREAD = 8


def pooling_threads() -> int:
    return max(1, usable_cores() // CORES_PER_POOLING_THREAD)


@functools.lru_cache(maxsize=4)
def _pooling_executor(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pooling")


def mean_pool_normalized(table, flat_ids: np.ndarray, lengths: np.ndarray, threads: int = 1) -> np.ndarray:
    """Unit-length mean of ``table`` rows per document; zero vector for 0-token documents.

    ``table`` is a float32 numpy array or a torch tensor (on its device). ``flat_ids`` holds the
    documents' ids back to back, ``lengths`` each document's count. Ids outside the table are
    clamped to [0, vocab - 1], as the original toolkit does. A numpy table is pooled by ``threads``
    threads, each on a run of documents holding about an equal share of the tokens; every document's
    bits are the same whatever the count.
    """
    if isinstance(table, np.ndarray):
        ids = np.ascontiguousarray(flat_ids, dtype=np.int64)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        out = np.empty((lengths.size, table.shape[1]), dtype=np.float32)
        if threads <= 1 or lengths.size < 2 * threads:
            _mean_pool_rows(table, ids, lengths, out)
            return out
        ends = np.cumsum(lengths)
        cuts = np.unique(np.concatenate(([0], np.searchsorted(ends, ends[-1] * np.arange(1, threads) / threads),
                                         [lengths.size])))
        starts = np.concatenate(([0], ends))[cuts]
        parts = [(table, ids[starts[i]: starts[i + 1]], lengths[cuts[i]: cuts[i + 1]], out[cuts[i]: cuts[i + 1]])
                 for i in range(cuts.size - 1)]
        for done in [_pooling_executor(threads).submit(_mean_pool_rows, *part) for part in parts]:
            done.result()
        return out
    import torch

    device = table.device
    ids = torch.from_numpy(np.ascontiguousarray(flat_ids, dtype=np.int64)).to(device)
    ids.clamp_(0, table.shape[0] - 1)
    counts = torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int64)).to(device)
    offsets = torch.zeros_like(counts)
    if counts.numel() > 1:
        torch.cumsum(counts[:-1], dim=0, out=offsets[1:])
    sums = torch.nn.functional.embedding_bag(ids, table, offsets, mode="sum")
    means = sums / counts.clamp(min=1).unsqueeze(1).to(sums.dtype)
    norms = means.norm(dim=1, keepdim=True)
    unit = torch.where(norms > 0, means / norms.clamp(min=torch.finfo(means.dtype).tiny), torch.zeros_like(means))
    return unit.to(torch.float32).cpu().numpy()


def warm_up_pooling() -> threading.Thread:
    """Load the compiled pooling loop on a thread now: the first call of any compiled function in a
    process costs ~0.2 s, which would otherwise stall the first batch while the tokenizer waits."""
    def run() -> None:
        table = np.zeros((1, 1), dtype=np.float32)
        _mean_pool_rows(table, np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64), np.empty((1, 1), np.float32))

    thread = threading.Thread(target=run, name="warm-up-pooling", daemon=True)
    thread.start()
    return thread


@njit(cache=True, nogil=True)
def _mean_pool_rows(table, ids, lengths, out):
    """``out[i]`` = the unit-length sum (so also mean) of document i's rows, summed in float32 in token
    order; the length is taken in float64. Zero for a document with no tokens (or a zero sum).

    No step's rounding depends on a SIMD width (torch's norm reduces in vector lanes), so every machine
    writes the same bits; they differ from torch's by at most one float32 step."""
    last = table.shape[0] - 1
    dim = table.shape[1]
    acc = np.empty(dim, dtype=np.float32)
    at = 0
    for i in range(lengths.size):
        acc[:] = 0.0
        for t in range(at, at + lengths[i]):
            row = table[min(max(ids[t], 0), last)]
            for j in range(dim):
                acc[j] += row[j]
        at += lengths[i]
        squares = 0.0
        for j in range(dim):
            squares += np.float64(acc[j]) * acc[j]
        norm = np.sqrt(squares)
        for j in range(dim):
            out[i, j] = acc[j] / norm if norm > 0 else 0.0


@dataclass
class TokenizeStats:
    documents: int = 0
    tokens: int = 0
    empty_rows: list | None = None
    seconds: float = 0.0


@dataclass
class Finished:
    """What ``embed_and_count`` had finished when an error or Ctrl-C stopped it: the first of its rows
    (ascending) whose counts, and vectors written to ``out``, are complete, and those counts."""

    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def embed_and_count(
    index,
    rows: np.ndarray,
    tokenizer: DocumentTokenizer,
    table,
    batch_docs: int = 1024,
    batch_bytes: int = 4 << 20,
    progress: bool = True,
    out=None,
    finished: Finished | None = None,
) -> tuple[np.ndarray | None, np.ndarray, TokenizeStats]:
    """Tokenize ``rows`` once; return (embeddings or None without a table, token counts, stats).

    Results are in the order of ``rows`` sorted ascending; with ``out`` (N x D rows for all
    records: an array, or a ``matrix.RowWriter`` into the cache file) the vectors are written into
    ``out[rows]`` batch by batch instead, and ``out`` is returned, so no N x D array is built here.
    ``finished``: where an interrupted call leaves what it had done (batches finish in row order, so
    it is a prefix of the sorted rows), for the caller to keep.
    """
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    counts = np.zeros(rows.size, dtype=np.int64)
    if table is None:
        vectors = None
    elif out is not None:
        vectors = out
    else:
        vectors = np.zeros((rows.size, table.shape[1]), dtype=np.float32)
    stats = TokenizeStats(empty_rows=[])
    done = 0
    complete = [0]  # rows whose counts and vectors are written (``finish`` runs batches in submission order)
    threads = pooling_threads()

    def finish(batch_rows: np.ndarray, encoded: list, at: int) -> None:
        """Ids, counts and vectors of one tokenized batch: on a background thread while the next one is
        tokenized (the tokenizer leaves part of the cores idle; this work fills them)."""
        flat, lengths = tokenizer.ids_and_lengths(encoded)
        n = lengths.size
        counts[at: at + n] = lengths
        if vectors is not None:
            pooled = mean_pool_normalized(table, flat, lengths, threads)
            if out is not None:
                out[batch_rows] = pooled
            else:
                vectors[at: at + n] = pooled
        stats.empty_rows.extend(batch_rows[lengths == 0].tolist())
        stats.tokens += int(lengths.sum())
        complete[0] = at + n
        bar.update(n, work=int(lengths.sum()), size=int(sizes[at: at + n].sum()) if sizes is not None else 0)

    behind = Behind("embedding", depth=2)
    kinds = getattr(index, "kinds", None)
    if kinds is not None and kinds.conversations and rows.size:
        tokenizer.prepare_chat()  # (loads transformers: seconds, which the rates below leave out, as the bar does)
    started = time.perf_counter()
    sizes = _record_sizes(index, rows)
    with Progress(int(rows.size), "Embedding" if table is not None else "Counting tokens", bar=progress,
                  total_size=int(sizes.sum()) if sizes is not None else None) as bar:
        try:
            for batch_rows, texts in prefetched(index.iter_documents(rows, batch_bytes, batch_docs)):
                encoded = tokenizer.encode_texts(texts)
                behind.submit(finish, batch_rows, encoded, done)
                done += len(texts)
            behind.wait()
        except BaseException as exc:
            behind.wait(raise_error=False)  # the error that stopped the loop is the one to report
            if finished is not None:
                finished.rows, finished.counts = rows[: complete[0]], counts[: complete[0]].copy()
            if isinstance(exc, TemplateRefused):
                raise _every_refusal(index, rows[done:], tokenizer, exc) from None
            raise
    stats.documents = done
    stats.seconds = time.perf_counter() - started
    if stats.empty_rows:
        warn_no_tokens(index, stats.empty_rows, embedded=table is not None)
    return vectors, counts, stats


def _every_refusal(index, rows: np.ndarray, tokenizer, first: TemplateRefused) -> TemplateRefused:
    """``first`` (the conversation the chat template refused), with how many of ``rows`` (it and those after it) the
    template refuses: a user mending records one error at a time (a template without a system role, a set where a
    tenth of the chats have one) learns the extent at once. Renders each conversation left: seconds per 100,000."""
    from .fields import Conversation

    refused, checked, last = 0, 0, None
    with Progress(int(rows.size), "Checking the other conversations against the chat template", bar=False) as bar:
        for batch_rows, documents in index.iter_documents(rows):
            for row, document in zip(batch_rows.tolist(), documents):
                if not isinstance(document, Conversation):
                    continue
                checked += 1
                try:
                    tokenizer.render_chat(document.messages, document.where, document.template_arguments)
                except TemplateRefused:
                    refused += 1
                    last = index.where(row)
            bar.update(len(documents))
    if refused <= 1:
        return first
    return TemplateRefused(f"{first}; it refuses {refused:,} conversations in all, of the {checked:,} left to render "
                           f"when it first did (the last: {last})")


def _record_sizes(index, rows: np.ndarray) -> np.ndarray | None:
    """Each record's bytes, where the index knows them (JSONL; Parquet rows as stored), for the ETA: tokenizing
    takes about as long per byte, not per document. None where it does not."""
    from .sources import record_bytes

    try:
        sizes = record_bytes(index, rows)
    except (AttributeError, TypeError, IndexError):
        return None
    return sizes if sizes.size == rows.size and sizes.sum() > 0 else None


def warn_no_tokens(index, rows, embedded: bool, known_from: str = "") -> None:
    """The warning for documents without tokens (the first 10 named); ``known_from``: where their counts came from,
    when not from tokenizing them in this run."""
    rows = list(rows)
    shown = (f"lines {', '.join(map(str, index.line_numbers(rows[:10]).tolist()))}"
             if hasattr(index, "line_numbers") else ", ".join(index.where(r) for r in rows[:10]))
    more = "" if len(rows) <= 10 else f" and {len(rows) - 10} more"
    log.warning("%d document(s) have no tokens (%s%s%s): %s", len(rows), shown, more,
                f"; {known_from}" if known_from else "",
                "their embedding is the zero vector" if embedded else "token count 0")
