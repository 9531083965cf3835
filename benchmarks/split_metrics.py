"""Window metrics under both packing models, with the document counts the efficiency bound needs.

Two ways a trainer turns an ordered list of documents into ``seq_len``-token windows:

- whole packing (the reference's, ``diversity.window_diversity``): a document that does not fit
  closes the window and opens the next; one longer than ``seq_len`` fills whole windows alone;
- split packing (Megatron, nanoGPT, HF ``group_texts``): the documents are concatenated into one
  token stream cut every ``seq_len`` tokens. A document with t > 0 tokens starting at offset s is
  present in windows s // L .. (s + t - 1) // L, with its overlap counted in each; a zero-token
  document is present in the window holding the token just before it (window 0 at the start).

For each model, per window: unique clusters, documents present, and the largest
|cluster's share of the window's tokens - its share of all tokens| (uniformity). Efficiency is
sum(unique) / sum(min(K, documents present)): a window cannot hold more clusters than documents.
Self-contained (numpy + numba) so it can move into the package's packing module as it is.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _grow(out, n_out):
    if n_out == out.shape[0]:
        out = np.concatenate((out, np.empty_like(out)))
    return out


@njit(cache=True, nogil=True)
def _split_windows(labels, token_counts, seq_len, shares):
    """Split packing: per window (unique clusters, documents present, uniformity)."""
    n_clusters = shares.shape[0]
    n = labels.shape[0]
    stamp = np.full(n_clusters, -1, dtype=np.int64)  # stamp[c] == w: cluster c is present in window w
    window_tokens = np.zeros(n_clusters, dtype=np.int64)
    unique_out = np.empty(16, dtype=np.int64)
    docs_out = np.empty(16, dtype=np.int64)
    deviation_out = np.empty(16, dtype=np.float64)
    n_out = 0
    current = 0  # the window documents are being added to
    unique = 0
    docs = 0
    offset = 0  # s: tokens before the next document
    for i in range(n + 1):
        if i < n:
            t = token_counts[i]
            if t == 0:
                first = 0 if offset == 0 else (offset - 1) // seq_len
                last = first
            else:
                first = offset // seq_len
                last = (offset + t - 1) // seq_len
        else:
            first = current + 1  # past the end: close the last window
            last = first
            t = 0
        for w in range(first, last + 1):
            if w > current:
                # Close the current window: the stream is contiguous, so windows open one at a time.
                if docs > 0:
                    fill = 0
                    for k in range(n_clusters):
                        fill += window_tokens[k]
                    worst = 0.0
                    if fill > 0:
                        for k in range(n_clusters):
                            d = abs(window_tokens[k] / fill - shares[k])
                            if d > worst:
                                worst = d
                    unique_out = _grow(unique_out, n_out)
                    docs_out = _grow(docs_out, n_out)
                    deviation_out = _grow(deviation_out, n_out)
                    unique_out[n_out] = unique
                    docs_out[n_out] = docs
                    deviation_out[n_out] = worst
                    n_out += 1
                for k in range(n_clusters):
                    window_tokens[k] = 0
                current = w
                unique = 0
                docs = 0
            if i == n:
                break
            c = labels[i]
            if stamp[c] != w:
                stamp[c] = w
                unique += 1
            docs += 1
            if t > 0:
                window_tokens[c] += min(offset + t, (w + 1) * seq_len) - max(offset, w * seq_len)
        if i < n:
            offset += t
    return unique_out[:n_out].copy(), docs_out[:n_out].copy(), deviation_out[:n_out].copy()


@njit(cache=True, nogil=True)
def _whole_windows(labels, token_counts, seq_len, n_clusters):
    """Whole packing (window_diversity's loop): per window (unique clusters, documents present)."""
    stamp = np.full(n_clusters, -1, dtype=np.int64)
    unique_out = np.empty(16, dtype=np.int64)
    docs_out = np.empty(16, dtype=np.int64)
    n_out = 0
    window = 0
    unique = 0
    docs = 0
    fill = 0
    for i in range(labels.shape[0]):
        c = labels[i]
        t = token_counts[i]
        if fill + t <= seq_len:
            if stamp[c] != window:
                stamp[c] = window
                unique += 1
            docs += 1
            fill += t
        else:
            if fill > 0:
                unique_out = _grow(unique_out, n_out)
                docs_out = _grow(docs_out, n_out)
                unique_out[n_out] = unique
                docs_out[n_out] = docs
                n_out += 1
            window += 1
            stamp[c] = window
            unique = 1
            docs = 1
            fill = t
            while fill >= seq_len:  # a long document fills whole windows alone
                unique_out = _grow(unique_out, n_out)
                docs_out = _grow(docs_out, n_out)
                unique_out[n_out] = 1
                docs_out[n_out] = 1
                n_out += 1
                fill -= seq_len
                window += 1
                if fill > 0:
                    stamp[c] = window
                    unique = 1
                    docs = 1
                else:
                    unique = 0
                    docs = 0
    if unique > 0:
        unique_out = _grow(unique_out, n_out)
        docs_out = _grow(docs_out, n_out)
        unique_out[n_out] = unique
        docs_out[n_out] = docs
        n_out += 1
    return unique_out[:n_out].copy(), docs_out[:n_out].copy()


def _in_order(labels, token_counts, order):
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    if order is not None:
        order = np.asarray(order, dtype=np.int64)
        labels, counts = labels[order], counts[order]
    return labels, counts


def token_shares(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int) -> np.ndarray:
    """Each cluster's share of all tokens (zeros when there are none)."""
    tokens = np.bincount(np.asarray(labels, dtype=np.int64), weights=np.asarray(token_counts, dtype=np.float64),
                         minlength=n_clusters)
    total = tokens.sum()
    return tokens / total if total > 0 else tokens


def split_windows(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, n_clusters: int,
                  order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split packing, per window: (unique clusters, documents present, uniformity).

    No documents: one empty window, ``([0], [0], [0.0])``. A window without tokens (only when every
    document has none) has uniformity 0.
    """
    if seq_len < 1:
        raise ValueError("seq_len must be at least 1")
    shares = token_shares(labels, token_counts, n_clusters)
    labels, counts = _in_order(labels, token_counts, order)
    unique, docs, deviation = _split_windows(labels, counts, int(seq_len), shares)
    if unique.size == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1)
    return unique, docs, deviation


def whole_windows(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, n_clusters: int,
                  order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Whole packing, per window: (unique clusters, documents present); unique equals window_diversity's."""
    if seq_len < 1:
        raise ValueError("seq_len must be at least 1")
    labels, counts = _in_order(labels, token_counts, order)
    unique, docs = _whole_windows(labels, counts, int(seq_len), max(int(n_clusters), 1))
    if unique.size == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    return unique, docs


def efficiency(unique: np.ndarray, docs: np.ndarray, n_clusters: int) -> float:
    """sum(unique) / sum(min(K, documents present)): 1 when no window could hold another cluster."""
    bound = np.minimum(np.asarray(docs, dtype=np.int64), int(n_clusters)).sum()
    return float(np.asarray(unique).sum() / bound) if bound > 0 else 1.0
