"""Diversity statistics: unique clusters per packed window, and embedding similarity.

``window_diversity`` simulates a trainer packing documents, in order, into ``seq_len``-token
windows without splitting documents across a window boundary, exactly as the reference does,
compiled with numba (one pass, an O(K) stamp array instead of a Python set per window).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def _push(out, n_out, value):
    """Append to a growable output array (doubling when full); returns (array, new length)."""
    if n_out == out.shape[0]:
        out = np.concatenate((out, np.empty_like(out)))
    out[n_out] = value
    return out, n_out + 1


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
                out, n_out = _push(out, n_out, unique)
            window += 1
            stamp[c] = window
            unique = 1
            fill = t
            while fill >= seq_len:
                out, n_out = _push(out, n_out, unique)
                fill -= seq_len
                window += 1
                if fill > 0:
                    stamp[c] = window
                    unique = 1
                else:
                    unique = 0
    if unique > 0:
        out, n_out = _push(out, n_out, unique)
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


def similarity_stats(embeddings: np.ndarray, seed: int = 42, max_samples: int = 5000, block_rows: int = 512) -> dict:
    """Pairwise cosine similarity over a seeded sample of at most ``max_samples`` unit rows.

    Upper triangle without the diagonal; mean, std and median to 4 decimals, the number of
    pairs above 0.9 and the number of pairs. With fewer than two rows there are no pairs, and
    the statistics are None (the reference would report NaN).

    The similarities are computed ``block_rows`` rows at a time, each row only against the rows
    after it, into one float32 array of the pairs in ``np.triu_indices`` order, and numpy's
    float32 mean, std and median run on that array as they did on the dense matrix's triangle.
    Extra memory: 4 bytes per pair, 4 more while the std runs, and one block (100 MB at 5,000
    rows; the dense matrix with its triangle's index arrays took 350 MB). Each block is
    multiplied in float64 and rounded once to float32: a float32 product's last bit depends
    on how BLAS tiles the matrix (block shape, thread count, CPU), so without this the count
    above 0.9 could change by a pair or two with the block size or the machine.
    """
    n = embeddings.shape[0]
    size = min(max_samples, n)
    rows = np.random.RandomState(seed).choice(n, size, replace=False)
    sample = np.asarray(embeddings[rows], dtype=np.float32)
    n_pairs = size * (size - 1) // 2
    if n_pairs == 0:
        return {"sample_size": int(size), "mean": None, "std": None, "median": None,
                "n_above_0.9": 0, "n_pairs": 0}
    sample64 = sample.astype(np.float64)
    upper = np.empty(n_pairs, dtype=np.float32)
    filled = 0
    above = 0
    for start in range(0, size - 1, block_rows):
        stop = min(start + block_rows, size - 1)
        block = sample64[start:stop] @ sample64[start:].T  # rows start..stop-1 against columns start..size-1
        block_begin = filled
        for offset in range(stop - start):
            pairs = block[offset, offset + 1 :]  # row start+offset against the rows after it
            upper[filled : filled + pairs.size] = pairs  # rounded to float32 here
            filled += pairs.size
        above += int(np.count_nonzero(upper[block_begin:filled] > 0.9))
    del sample64, block
    mean, std = upper.mean(), upper.std()  # before the median, which reorders the array in place
    return {
        "sample_size": int(size),
        "mean": round(float(mean), 4),
        "std": round(float(std), 4),
        "median": round(float(np.median(upper, overwrite_input=True)), 4),
        "n_above_0.9": above,
        "n_pairs": int(n_pairs),
    }


# --- Token-share metrics: how far each stretch of the order is from the corpus-wide mix ---


def global_token_shares(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int) -> np.ndarray:
    """tau_k: cluster k's share of all tokens (float64, sums to 1; zeros if there are no tokens)."""
    tokens = np.bincount(np.asarray(labels, dtype=np.int64), weights=np.asarray(token_counts, dtype=np.float64),
                         minlength=n_clusters)
    total = tokens.sum()
    return tokens / total if total > 0 else tokens


@njit(cache=True, nogil=True)
def _window_share_deviation(labels, token_counts, seq_len, shares):
    # Same packing as _window_diversity; per window, max_k |tokens_k / window_tokens - tau_k|.
    n_clusters = shares.shape[0]
    window_tokens = np.zeros(n_clusters, dtype=np.int64)
    out = np.empty(16, dtype=np.float64)
    n_out = 0
    fill = 0
    i = 0
    n = labels.shape[0]
    while i <= n:
        close = i == n
        if not close:
            c = labels[i]
            t = token_counts[i]
            if fill + t <= seq_len:
                window_tokens[c] += t
                fill += t
                i += 1
                continue
            close = True
        if fill > 0:
            worst = 0.0
            for k in range(n_clusters):
                d = abs(window_tokens[k] / fill - shares[k])
                if d > worst:
                    worst = d
                window_tokens[k] = 0
            out, n_out = _push(out, n_out, worst)
            fill = 0
        if i == n:
            break
        # The document that did not fit opens the next window; one longer than seq_len fills
        # whole windows alone (share 1 for its cluster), as in the diversity count.
        c = labels[i]
        t = token_counts[i]
        worst_alone = 0.0
        for k in range(n_clusters):
            d = (1.0 - shares[k]) if k == c else shares[k]
            if d > worst_alone:
                worst_alone = d
        while t >= seq_len:
            out, n_out = _push(out, n_out, worst_alone)
            t -= seq_len
        if t > 0:
            window_tokens[c] += t
            fill = t
        i += 1
    return out[:n_out].copy()


def window_share_deviation(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, order: np.ndarray | None = None,
                           n_clusters: int | None = None) -> np.ndarray:
    """Token-share uniformity per packed window: max over clusters of |share in window - global share|.

    The objective of seed 004 evaluated on the trainer's windows (packed as in ``window_diversity``).
    0 means the window holds exactly the corpus mix; 1 is the worst possible.
    """
    if seq_len < 1:
        raise ValueError("seq_len must be at least 1")
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    k = int(n_clusters if n_clusters is not None else (labels.max() + 1 if labels.size else 1))
    shares = global_token_shares(labels, counts, k)
    if order is not None:
        order = np.asarray(order, dtype=np.int64)
        labels, counts = labels[order], counts[order]
    deviation = _window_share_deviation(labels, counts, int(seq_len), shares)
    return deviation if deviation.size else np.zeros(1)


def _token_slice_mix(labels: np.ndarray, counts: np.ndarray, start: float, stop: float, n_clusters: int) -> np.ndarray:
    """Cluster token shares of the token range [start, stop) of the packed stream (documents cut at the edges)."""
    ends = np.cumsum(counts, dtype=np.float64)
    begins = ends - counts
    inside = np.clip(np.minimum(ends, stop) - np.maximum(begins, start), 0, None)
    mix = np.bincount(labels, weights=inside, minlength=n_clusters)
    total = mix.sum()
    return mix / total if total > 0 else mix


def boundary_shift(labels: np.ndarray, token_counts: np.ndarray, order: np.ndarray | None = None,
                   n_clusters: int | None = None, fraction: float = 0.05) -> float:
    """Total-variation distance between the cluster mix of the first and the last ``fraction`` of tokens.

    What a model sees change at an epoch boundary (end of one pass -> start of the next): 0 when
    head and tail hold the same mix, 1 when they share no cluster.
    """
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.float64)
    k = int(n_clusters if n_clusters is not None else (labels.max() + 1 if labels.size else 1))
    if order is not None:
        order = np.asarray(order, dtype=np.int64)
        labels, counts = labels[order], counts[order]
    total = counts.sum()
    head = _token_slice_mix(labels, counts, 0.0, fraction * total, k)
    tail = _token_slice_mix(labels, counts, (1.0 - fraction) * total, total, k)
    return float(0.5 * np.abs(head - tail).sum())


def coverage(labels: np.ndarray, token_counts: np.ndarray, order: np.ndarray | None = None) -> float:
    """How far into the order (fraction of tokens before it) the last cluster first appears; lower is better."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.float64)
    if order is not None:
        order = np.asarray(order, dtype=np.int64)
        labels, counts = labels[order], counts[order]
    total = counts.sum()
    if labels.size == 0 or total == 0:
        return 0.0
    before = np.cumsum(counts) - counts
    first = np.full(int(labels.max()) + 1, np.inf)
    np.minimum.at(first, labels, before)
    return float(first[np.isfinite(first)].max() / total)


def ordering_quality(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, order: np.ndarray | None,
                     n_clusters: int, per_window_diversity: np.ndarray | None = None) -> dict:
    """Every ordering metric for one order: diversity summary, uniformity (max/mean), boundary shift, coverage.

    ``per_window_diversity``: this order's ``window_diversity``, when the caller has it already.
    """
    deviation = window_share_deviation(labels, token_counts, seq_len, order, n_clusters)
    if per_window_diversity is None:
        per_window_diversity = window_diversity(labels, token_counts, seq_len, order)
    return {
        "diversity": summarize_windows(per_window_diversity),
        "uniformity_max": round(float(deviation.max()), 4),
        "uniformity_mean": round(float(deviation.mean()), 4),
        "boundary_shift": round(boundary_shift(labels, token_counts, order, n_clusters), 4),
        "coverage": round(coverage(labels, token_counts, order), 4),
    }
