"""Shallow embeddings: each document is the L2-normalised mean of its tokens' input-embedding rows.

Pooling is batched with ``torch.nn.functional.embedding_bag`` over a float32 copy of the table
(on the GPU when one is used), so a batch of thousands of documents costs one kernel call,
and the sums are accumulated in float32 (the original toolkit computes in the table's dtype, bf16
for most checkpoints, and differs from this by ~0.3%). A document with no tokens has no mean:
it gets the zero vector and a warning (the original toolkit gets NaN, which breaks k-means).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from .records import RecordIndex, iter_text_batches
from .runtime import Progress
from .tokenizer import DocumentTokenizer

log = logging.getLogger(__name__)


def mean_pool_normalized(table: torch.Tensor, flat_ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Unit-length mean of ``table`` rows per document; zero vector for 0-token documents.

    ``flat_ids`` holds the documents' ids back to back, ``lengths`` each document's count.
    Ids outside the table are clamped to [0, vocab - 1], as the original toolkit does.
    """
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


@dataclass
class TokenizeStats:
    documents: int = 0
    tokens: int = 0
    empty_rows: list | None = None
    seconds: float = 0.0


def embed_and_count(
    index: RecordIndex,
    rows: np.ndarray,
    tokenizer: DocumentTokenizer,
    table: torch.Tensor | None,
    batch_docs: int = 1024,
    batch_bytes: int = 4 << 20,
    progress: bool = True,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray | None, np.ndarray, TokenizeStats]:
    """Tokenize ``rows`` once; return (embeddings or None without a table, token counts, stats).

    Results are in the order of ``rows`` sorted ascending; with ``out`` (an N x D array for
    all records) the vectors are written into ``out[rows]`` instead, and ``out`` is returned,
    so the caller's array is not held twice.
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
    started = time.perf_counter()
    done = 0
    with Progress(int(rows.size), "Embedding" if table is not None else "Counting tokens", bar=progress) as bar:
        for batch_rows, texts in iter_text_batches(index, rows, batch_bytes, batch_docs):
            flat, lengths = tokenizer.encode_batch(texts)
            n = len(texts)
            counts[done : done + n] = lengths
            if vectors is not None:
                pooled = mean_pool_normalized(table, flat, lengths)
                if out is not None:
                    out[batch_rows] = pooled
                else:
                    vectors[done : done + n] = pooled
            stats.empty_rows.extend(batch_rows[lengths == 0].tolist())
            stats.tokens += int(lengths.sum())
            done += n
            bar.update(n, work=int(lengths.sum()))
    stats.documents = done
    stats.seconds = time.perf_counter() - started
    if stats.empty_rows:
        shown = ", ".join(str(int(index.line_numbers[r])) for r in stats.empty_rows[:10])
        more = "" if len(stats.empty_rows) <= 10 else f" and {len(stats.empty_rows) - 10} more"
        log.warning("%d document(s) have no tokens (lines %s%s): %s", len(stats.empty_rows), shown, more,
                    "their embedding is the zero vector" if table is not None else "token count 0")
    return vectors, counts, stats
