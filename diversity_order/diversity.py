"""Diversity statistics: unique clusters per packed window, and embedding similarity.

``window_diversity`` simulates a trainer packing documents, in order, into ``seq_len``-token
windows without splitting documents across a window boundary, exactly as the reference does,
compiled with numba (one pass, an O(K) stamp array instead of a Python set per window).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _window_diversity(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, n_clusters: int) -> np.ndarray:
    # stamp[c] == window means cluster c is already in the current window's set S.
    stamp = np.full(n_clusters, -1, dtype=np.int64)
    window = 0
    unique = 0  # |S|
    fill = 0  # F, tokens in the current window
    out = np.empty(labels.shape[0] * 2 + 1, dtype=np.int64)
    n_out = 0
    for i in range(labels.shape[0]):
        c = labels[i]
        t = token_counts[i]
        if fill + t <= seq_len:
            if stamp[c] != window:
                stamp[c] = window
                unique += 1
            fill += t
        else:
            if fill > 0:
                if n_out == out.shape[0]:
                    out = np.concatenate((out, np.empty(out.shape[0], dtype=np.int64)))
                out[n_out] = unique
                n_out += 1
            window += 1
            stamp[c] = window
            unique = 1
            fill = t
            while fill >= seq_len:
                if n_out == out.shape[0]:
                    out = np.concatenate((out, np.empty(out.shape[0], dtype=np.int64)))
                out[n_out] = unique
                n_out += 1
                fill -= seq_len
                window += 1
                if fill > 0:
                    stamp[c] = window
                    unique = 1
                else:
                    unique = 0
    if unique > 0:
        if n_out == out.shape[0]:
            out = np.concatenate((out, np.empty(1, dtype=np.int64)))
        out[n_out] = unique
        n_out += 1
    if n_out == 0:
        return np.zeros(1, dtype=np.int64)
    return out[:n_out].copy()


def window_diversity(
    labels: np.ndarray, token_counts: np.ndarray, seq_len: int, order: np.ndarray | None = None
) -> np.ndarray:
    """Unique clusters in each ``seq_len`` window when documents are packed in ``order``.

    Documents are never split: one that does not fit closes the window; one longer than
    ``seq_len`` fills whole windows by itself. No windows at all gives ``[0]``.
    """
    if seq_len < 1:
        raise ValueError("seq_len must be at least 1")
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    if order is not None:
        order = np.asarray(order, dtype=np.int64)
        labels, counts = labels[order], counts[order]
    n_clusters = int(labels.max()) + 1 if labels.size else 1
    return _window_diversity(labels, counts, int(seq_len), n_clusters)


def summarize_windows(diversity: np.ndarray) -> dict:
    """mean and population std rounded to 2 decimals, min, max, n_sequences (as the reference)."""
    values = np.asarray(diversity, dtype=np.float64)
    return {
        "mean": round(float(values.mean()), 2),
        "std": round(float(values.std()), 2),
        "min": int(values.min()),
        "max": int(values.max()),
        "n_sequences": int(values.size),
    }


def similarity_stats(embeddings: np.ndarray, seed: int = 42, max_samples: int = 5000) -> dict:
    """Pairwise cosine similarity over a seeded sample of at most ``max_samples`` unit rows.

    Upper triangle without the diagonal; mean, std and median to 4 decimals, the number of
    pairs above 0.9 and the number of pairs. With fewer than two rows there are no pairs, and
    the statistics are None (the reference would report NaN).
    """
    n = embeddings.shape[0]
    size = min(max_samples, n)
    rows = np.random.RandomState(seed).choice(n, size, replace=False)
    sample = np.asarray(embeddings[rows], dtype=np.float32)
    n_pairs = size * (size - 1) // 2
    if n_pairs == 0:
        return {"sample_size": int(size), "mean": None, "std": None, "median": None,
                "n_above_0.9": 0, "n_pairs": 0}
    cosine = sample @ sample.T
    upper = cosine[np.triu_indices(size, k=1)]
    return {
        "sample_size": int(size),
        "mean": round(float(upper.mean()), 4),
        "std": round(float(upper.std()), 4),
        "median": round(float(np.median(upper)), 4),
        "n_above_0.9": int((upper > 0.9).sum()),
        "n_pairs": int(n_pairs),
    }
