"""Ordering measures: unique clusters per packed window, token-share uniformity, epoch-boundary
shift and coverage; and embedding similarity.

The window measures walk documents, in order, through the trainer's ``seq_len``-token windows
with the packing rule of ``packing.py`` (documents whole by default, exactly as the original
toolkit counts), compiled with numba: one pass, an O(K) stamp array instead of a set per window.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import matrix
from .defaults import DEFAULT_SEED
from .matrix import Matrix
from .packing import WHOLE, n_pieces, packing_model, piece_tokens, place

# The head and the tail of the order (fractions of its tokens) whose cluster mixes boundary_shift compares.
BOUNDARY_FRACTION = 0.05
# D, the diversity criterion: an ordering's mean unique clusters per window >= stratified's - this.
DIVERSITY_MARGIN = 0.05
# "A random shuffle's" measures are the mean over seeded shuffles: one shuffle's boundary shift swings 2-5x from
# seed to seed (50 shuffles of a 74,000-record prose corpus: 0.06 to 0.34), enough to flip a verdict either way.
# Small corpora swing most (a few documents make the first and last 5% of the tokens) and cost least, so they get
# more: enough shuffles to measure RANDOM_SHUFFLED_DOCUMENTS documents in all, from RANDOM_SHUFFLES_LEAST to MOST.
RANDOM_SHUFFLES_LEAST = 5
RANDOM_SHUFFLES_MOST = 100
RANDOM_SHUFFLED_DOCUMENTS = 2_000_000
# The epoch cut into this many runs of windows for ``diversity_by_part``.
EPOCH_PARTS = 10
# What the log and the plots call the orders every curate run measures (the keys of its metadata).
MEASURED_ORDER_NAMES = {"original": "input", "curated": "curated", "random_shuffle": "random shuffle"}


@njit(cache=True, nogil=True)
def _most_windows(token_counts, order, seq_len):
    """At least as many windows with tokens as ``order``'s documents can make: each puts tokens in at most
    its full windows and two more. Outputs so sized need no growing: an array a kernel's loop may replace
    is reference-counted at every step, which made the window walks several times slower."""
    most = 1
    for i in range(order.shape[0]):
        most += 2 + token_counts[order[i]] // seq_len
    return most


@njit(cache=True, nogil=True, inline="always")
def _close_counting(out, docs_out, n_out, unique, docs, fill, window):
    """Close the open window: a finished window if it holds tokens. Returns (n_out, window, unique, docs, fill)."""
    if fill > 0:
        out[n_out] = unique
        docs_out[n_out] = docs
        n_out += 1
    return n_out, window + 1, 0, 0, 0


@njit(cache=True, nogil=True)
def _window_counts(labels: np.ndarray, token_counts: np.ndarray, order: np.ndarray, seq_len: int, n_clusters: int,
                   model: int):
    # Per window: unique clusters and documents present. stamp[c] == window means cluster c is
    # already in the open window's set; `unique` is its size, `docs` the documents placed in it.
    # The order is read here rather than gathered into copies first.
    stamp = np.full(n_clusters, -1, dtype=np.int64)
    window = 0
    unique = 0
    docs = 0
    fill = 0
    out = np.empty(_most_windows(token_counts, order, seq_len), dtype=np.int64)
    docs_out = np.empty_like(out)
    n_out = 0
    for i in range(order.shape[0]):
        d = order[i]
        c = labels[d]
        close_first, head, n_full, tail, close_last = place(fill, token_counts[d], seq_len, model)
        if close_first:
            n_out, window, unique, docs, fill = _close_counting(out, docs_out, n_out, unique, docs, fill, window)
        for piece in range(n_pieces(n_full, tail)):
            if piece > 0:
                n_out, window, unique, docs, fill = _close_counting(out, docs_out, n_out, unique, docs, fill, window)
            if stamp[c] != window:
                stamp[c] = window
                unique += 1
            docs += 1
            fill += piece_tokens(piece, head, n_full, tail, seq_len)
        if close_last:
            n_out, window, unique, docs, fill = _close_counting(out, docs_out, n_out, unique, docs, fill, window)
    if unique > 0:
        out[n_out] = unique
        docs_out[n_out] = docs
        n_out += 1
    if n_out == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    return out[:n_out].copy(), docs_out[:n_out].copy()


def _as_ordered(labels, token_counts, order):
    """(labels, token counts, order) as the kernels read them: int64, the order the identity where None."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    order = np.arange(labels.size, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    # (the kernels do not check bounds)
    if order.size and (int(order.min()) < 0 or int(order.max()) >= min(labels.size, counts.size)):
        raise IndexError(f"order holds positions outside 0..{min(labels.size, counts.size) - 1}")
    return labels, counts, order


def window_counts(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, order: np.ndarray | None = None,
                  packing: str = "whole") -> tuple[np.ndarray, np.ndarray]:
    """Per ``seq_len`` window, in order: (unique clusters, documents present), documents packed in ``order``.

    ``packing`` is the trainer's packing model (see ``packing.py``); with "whole" one that does not fit
    closes the window; one longer than ``seq_len`` fills whole windows alone and its last part opens the
    next. No windows at all gives ``[0]``, ``[0]``.
    """
    if seq_len < 1:
        raise ValueError("seq_len must be at least 1")
    labels, counts, order = _as_ordered(labels, token_counts, order)
    n_clusters = int(labels.max()) + 1 if labels.size else 1
    return _window_counts(labels, counts, order, int(seq_len), n_clusters, packing_model(packing))


# Fewer windows than this: their figures are warned of as resting on few windows (one document moved changes them).
FEW_WINDOWS = 10


def window_diversity(
    labels: np.ndarray, token_counts: np.ndarray, seq_len: int, order: np.ndarray | None = None,
    packing: str = "whole",
) -> np.ndarray:
    """Unique clusters in each ``seq_len`` window when documents are packed in ``order`` (see ``window_counts``)."""
    return window_counts(labels, token_counts, seq_len, order, packing)[0]


def efficiency(unique: np.ndarray, documents: np.ndarray, n_present: int) -> float:
    """Unique clusters over the most possible: a window holds at most min(clusters present in the data,
    documents in the window) clusters. 1.0 means no ordering could do better on these windows."""
    bound = np.minimum(documents, n_present).sum()
    return float(unique.sum() / bound) if bound else 1.0


def summarize_windows(diversity: np.ndarray) -> dict:
    """mean and population std rounded to 2 decimals, min, max, n_sequences (as the original toolkit)."""
    values = np.asarray(diversity, dtype=np.float64)
    return {
        "mean": round(float(values.mean()), 2),
        "std": round(float(values.std()), 2),
        "min": int(values.min()),
        "max": int(values.max()),
        "n_sequences": int(values.size),
    }


def sequence_fill(token_counts: np.ndarray, n_sequences: int, seq_len: int) -> float:
    """Share of the packed sequences' ``seq_len`` slots that hold tokens (1 - padding). Packing split,
    only the last sequence is short; packing whole, a window closes when the next document does not
    fit, so the order decides how many sequences (training steps' worth of compute) the tokens take."""
    slots = int(n_sequences) * int(seq_len)
    return float(np.asarray(token_counts, dtype=np.int64).sum() / slots) if slots else 0.0


def similarity_stats(embeddings: Matrix, seed: int = DEFAULT_SEED, max_samples: int = 5000, block_rows: int = 512,
                     reduce=None) -> dict:
    """Pairwise cosine similarity over a seeded sample of at most ``max_samples`` unit rows.

    Upper triangle without the diagonal; mean, std and median to 4 decimals, the number of
    pairs above 0.9 and the number of pairs. With fewer than two rows there are no pairs, and
    the statistics are None (the original toolkit would report NaN).

    The similarities are computed ``block_rows`` rows at a time, each row only against the rows
    after it, into one float32 array of the pairs in ``np.triu_indices`` order, and numpy's
    float32 mean, std and median run on that array as they did on the dense matrix's triangle.
    Extra memory: 4 bytes per pair, 4 more while the std runs, and one block (100 MB at 5,000
    rows; the dense matrix with its triangle's index arrays took 350 MB). Each block is
    multiplied in float64 and rounded once to float32: a float32 product's last bit depends
    on how BLAS tiles the matrix (block shape, thread count, CPU), so without this the count
    above 0.9 could change by a pair or two with the block size or the machine.
    """
    n = matrix.shape(embeddings)[0]
    size = min(max_samples, n)
    rows = np.random.RandomState(seed).choice(n, size, replace=False)
    sample = matrix.read_rows(embeddings, rows)
    if reduce is not None:  # (rows -> their reduced, unit rows: the space the labels were found in)
        sample = reduce(sample)
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
        # Each row against the rows after it, row by row: the triangle's pairs in np.triu_indices order,
        # taken in one call (a loop over rows held the interpreter lock, slowing the stages beside this).
        after = np.arange(size - start)[None, :] > np.arange(stop - start)[:, None]
        pairs = block[after]
        upper[filled: filled + pairs.size] = pairs  # rounded to float32 here
        above += int(np.count_nonzero(upper[filled: filled + pairs.size] > 0.9))
        filled += pairs.size
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


@njit(cache=True, nogil=True, inline="always")
def _close_measuring(out, n_out, window_tokens, fill, shares):
    """Close the open window: if it holds tokens, record max_k |its share of k - tau_k|. Returns (n_out, fill)."""
    if fill > 0:
        worst = 0.0
        for k in range(shares.shape[0]):
            d = abs(window_tokens[k] / fill - shares[k])
            if d > worst:
                worst = d
            window_tokens[k] = 0
        out[n_out] = worst
        n_out += 1
    return n_out, 0


@njit(cache=True, nogil=True)
def _window_share_deviation(labels, token_counts, order, seq_len, shares, model):
    # Per finished window, max_k |tokens_k / window_tokens - tau_k|; windows packed as in _window_counts.
    window_tokens = np.zeros(shares.shape[0], dtype=np.int64)
    out = np.empty(_most_windows(token_counts, order, seq_len), dtype=np.float64)
    n_out = 0
    fill = 0
    for i in range(order.shape[0]):
        d = order[i]
        c = labels[d]
        close_first, head, n_full, tail, close_last = place(fill, token_counts[d], seq_len, model)
        if close_first:
            n_out, fill = _close_measuring(out, n_out, window_tokens, fill, shares)
        for piece in range(n_pieces(n_full, tail)):
            if piece > 0:
                n_out, fill = _close_measuring(out, n_out, window_tokens, fill, shares)
            tokens = piece_tokens(piece, head, n_full, tail, seq_len)
            window_tokens[c] += tokens
            fill += tokens
        if close_last:
            n_out, fill = _close_measuring(out, n_out, window_tokens, fill, shares)
    n_out, fill = _close_measuring(out, n_out, window_tokens, fill, shares)
    return out[:n_out].copy()


def window_share_deviation(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, order: np.ndarray | None = None,
                           n_clusters: int | None = None, packing: str = "whole") -> np.ndarray:
    """Token-share uniformity per packed window: max over clusters of |share in window - global share|.

    The token-share greedy's objective, evaluated on the trainer's windows (packed as in ``window_diversity``).
    0 means the window holds exactly the corpus mix; 1 is the worst possible.
    """
    if seq_len < 1:
        raise ValueError("seq_len must be at least 1")
    labels, counts, order = _as_ordered(labels, token_counts, order)
    k = int(n_clusters if n_clusters is not None else (labels.max() + 1 if labels.size else 1))
    shares = global_token_shares(labels, counts, k)
    deviation = _window_share_deviation(labels, counts, order, int(seq_len), shares, packing_model(packing))
    return deviation if deviation.size else np.zeros(1)


@njit(cache=True, nogil=True)
def _layered_windows(excess, sizes, seq_len):
    """W_i for pieces sorted by excess descending: a lower bound on the windows that hold the first
    i + 1 pieces, the most of ceil((i + 1) / c_i) (c_i: how many of them fit in one window at most, the
    smallest first), the pieces over half a window (no two share one) and ceil(their tokens / seq_len).
    A Fenwick tree over the pieces' size ranks gives c_i in O(log n)."""
    n = excess.shape[0]
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(sizes, kind="mergesort")] = np.arange(1, n + 1)
    count = np.zeros(n + 1, dtype=np.int64)
    tokens = np.zeros(n + 1, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    top = 1
    while top * 2 <= n:
        top *= 2
    big, held = 0, 0
    for i in range(n):
        node = rank[i]
        while node <= n:
            count[node] += 1
            tokens[node] += sizes[i]
            node += node & (-node)
        big += 2 * sizes[i] > seq_len
        held += sizes[i]
        position, filled, fit, step = 0, 0, 0, top  # descend: the most of the smallest that fit
        while step > 0:
            nxt = position + step
            if nxt <= n and filled + tokens[nxt] <= seq_len:
                position, filled, fit = nxt, filled + tokens[nxt], fit + count[nxt]
            step //= 2
        fit = max(fit, 1)
        out[i] = max((i + fit) // fit, big, (held + seq_len - 1) // seq_len)
    return out


# Thresholds s at which the bound counts the windows deviating by more than s: (j + 1) / BOUND_GRID.
# Counting at the right end of each step undercounts by at most 1 / BOUND_GRID of the mean.
BOUND_GRID = 4096
# How many clusters, those of the largest shortfall, the bound's term (d) is taken at.
DEFICIT_CLUSTERS = 4
# Packing whole the shared-window count W lies in a range; the bound is taken at W's that grow by this ratio.
BOUND_WINDOW_RATIO = 1.005


def _lacking_minus_touches(labels, excess, touches, tau, thresholds):
    """g_j = max over clusters k with tau_k > s_j of (pieces of k of excess > s_j) - (windows k can touch).

    Per cluster only the thresholds below tau_k count, and they sum to at most len(thresholds) + K, so
    this is O(N + grid + K) in time and memory."""
    n_clusters = tau.shape[0]
    reach = np.searchsorted(thresholds, tau, side="left")  # thresholds below tau_k
    touched = np.bincount(labels, weights=touches, minlength=n_clusters).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(reach)))
    size = int(offsets[-1])
    g = np.full(thresholds.shape[0], np.iinfo(np.int64).min // 4, dtype=np.int64)
    if size == 0:
        return g
    # A piece of excess e counts at every threshold below e: mark the last one in its cluster's range and
    # sum the marks from the right, per cluster.
    last = np.minimum(np.searchsorted(thresholds, excess, side="left"), reach[labels]) - 1
    marked = last >= 0
    marks = np.bincount(offsets[labels[marked]] + last[marked], minlength=size)
    from_right = np.concatenate((np.cumsum(marks[::-1])[::-1], [0]))
    cluster = np.repeat(np.arange(n_clusters), reach)
    above = from_right[:size] - from_right[offsets[cluster + 1]]
    np.maximum.at(g, np.arange(size) - offsets[cluster], above - touched[cluster])
    return g


def uniformity_lower_bound(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, n_clusters: int | None = None,
                           packing: str = "whole") -> float:
    """A mean token-share uniformity (``window_share_deviation``'s mean) that no order of these documents
    can beat, from their lengths and clusters alone: what long, large and few documents force on any order.

    A window that one cluster c fills deviates by a_c = max(1 - tau_c, max_{k != c} tau_k); a window
    holding a piece of p tokens of a cluster c deviates by at least e = p / seq_len - tau_c (its share
    is p over at most seq_len tokens); a window lacking cluster k deviates by at least tau_k. The windows:
    - whole packing: a document of l >= seq_len tokens fills l // seq_len windows alone (in every
      order) and its remainder l % seq_len opens a window others share. Each shared window holds
      pieces: shorter documents and remainders. Shared windows are at least ceil(their tokens /
      seq_len), the pieces over half a window and ceil(pieces / the most that fit in one); at most
      (long documents) + 1 + j, j the most with j (seq_len + 1) <= T_s + (the j longest shorter
      documents' tokens): each of j windows closed because the next (a shorter document, opening the
      next) did not fit. A piece touches one.
    - split packing: ceil(T / seq_len) windows. A document of m seq_len + r tokens (m >= 1) covers at
      least m - 1 windows whole and one more window with at least (seq_len + r) / 2 of its tokens (the
      m-th whole, or the larger of its two partial pieces); a shorter one of t tokens puts at least
      ceil(t / 2) in one window. Besides the m - 1, a document touches at most 2 windows, or 3 if it
      starts and ends inside windows (r >= 2), one of which it then fills alone.
    The windows filled alone are distinct from the shared ones. The sum over shared windows of their
    deviation is the integral over s of the windows deviating by more than s, which is at least
    (a) ``_layered_windows``'s bin-packing count of the pieces of excess over s, and (b) for each
    cluster k with tau_k > s, W_s - n_k + e_k(s): the W_s - j shared windows lacking k, plus the j
    holding it in which one of its e_k(s) pieces of excess over s sits (at least e_k(s) - (n_k - j),
    n_k the most windows its documents touch). Per document, the touches less the pieces over s are
    taken at their most over its placings. (c) Packing whole, of W_s windows holding P pieces at least
    W_s - (P - W_s) // j hold j or fewer, so deviate by 1 / j - max tau or more (a lone piece's window by
    a_c). (d) One cluster's shortfall in the shared windows, when its long documents hold more than its
    share of the windows they fill alone, with the pieces' excess beyond it (``_deficit_bound``): a sum
    over all windows, whatever their number. (a) alone divides by the most windows an order can make;
    with (b), (c) and (d), the mean is bounded over the range of W_s.
    """
    labels = np.asarray(labels, dtype=np.int64)
    lengths = np.asarray(token_counts, dtype=np.int64)
    k = int(n_clusters if n_clusters is not None else (labels.max() + 1 if labels.size else 1))
    tau = global_token_shares(labels, lengths, k)
    total = int(lengths.sum())
    if total == 0:
        return 0.0
    top_two = np.sort(tau)[-2:] if k > 1 else np.array([0.0, tau[0]])
    others_max = np.where(tau >= top_two[-1], top_two[0], top_two[-1])  # max over the other clusters
    alone = np.maximum(1.0 - tau, others_max)  # per cluster: a window it fills alone
    m, r = lengths // seq_len, lengths % seq_len
    long = m >= 1
    whole = packing_model(packing) == WHOLE
    if whole:
        filled_alone = m
        pieces = np.where(long, r, lengths)
        shorter = np.sort(lengths[~long])[::-1]
        shared_tokens = int(pieces.sum())
        j = np.arange(shorter.size + 1)
        closed = j * (seq_len + 1) <= shared_tokens + np.concatenate(([0], np.cumsum(shorter)))
        openers = int(j[closed].max())  # j(L + 1) - (the j longest) grows with j: the closed ones are a prefix
        most = min(int((pieces > 0).sum()), int(long.sum()) + 1 + openers)
        positive = np.sort(pieces[pieces > 0])
        fit = max(int(np.searchsorted(np.cumsum(positive), seq_len, side="right")), 1)  # the most in one window
        fewest = max(-(-shared_tokens // seq_len), int((2 * pieces > seq_len).sum()), -(-positive.size // fit))
        touches = (pieces > 0).astype(np.int64)
    else:
        filled_alone = np.maximum(m - 1, 0)
        pieces = np.where(long, (seq_len + r + 1) // 2, (lengths + 1) // 2)
        most = fewest = -(-total // seq_len) - int(filled_alone.sum())
        touches = np.where(lengths > 0, (lengths + seq_len - 2) // seq_len + 1 - filled_alone, 0)
    # For (b), per document its touches less its pieces of excess over s, at their most over its placings.
    # Split, one of m seq_len + r tokens (r >= 2) touching 3 shared windows fills one of them (its m-th
    # whole window), which deviates by 1 - tau > s for every s < tau when tau <= 1/2; so it counts as 2
    # touches whose larger piece is at least ceil(r / 2) (touching 2, that piece is larger still).
    lacking_pieces = pieces
    if not whole:
        third = long & (r >= 2) & (tau[labels] <= 0.5)
        touches = np.where(third, 2, touches)
        lacking_pieces = np.where(third, (r + 1) // 2, pieces)
    forced = float(np.dot(filled_alone, alone[labels]))
    alone_windows = int(filled_alone.sum())
    most = max(most, fewest)
    excess = pieces / seq_len - tau[labels]
    keep = (excess > 0) & (pieces > 0)
    by_excess = np.argsort(-excess[keep], kind="mergesort")
    sorted_excess = excess[keep][by_excess]
    windows = _layered_windows(sorted_excess, pieces[keep][by_excess], int(seq_len))
    steps = sorted_excess - np.append(sorted_excess[1:], 0.0)
    bound = (forced + float(np.dot(steps, windows))) / max(alone_windows + most, 1)  # (a) alone
    thresholds = np.arange(1, BOUND_GRID + 1) / BOUND_GRID
    above = sorted_excess.size - np.searchsorted(sorted_excess[::-1], thresholds, side="right")
    packed = np.where(above > 0, windows[np.maximum(above - 1, 0)] if windows.size else 0, 0)
    present = lacking_pieces > 0
    lacking = _lacking_minus_touches(labels[present], (lacking_pieces / seq_len - tau[labels])[present],
                                     touches[present], tau, thresholds)
    if whole:
        # (c): a window of at most j pieces deviates by at least 1 / j - max tau (its largest piece holds
        # 1 / j of it), one of a single piece of cluster c by a_c. Per threshold the largest j that still
        # deviates by more than s (kept off float ties), and the pieces whose lone window would not.
        n_pieces = int(present.sum())
        per_window = np.ceil(1.0 / (thresholds + tau.max()) * (1 - 1e-12)).astype(np.int64) - 1
        calm = np.searchsorted(np.sort(alone[labels[present]]), thresholds, side="right")
    deficit = _deficit_bound(labels, lengths, tau, pieces, keep, filled_alone, forced, int(seq_len), total)
    best, shared = np.inf, fewest
    while True:  # F(W_s) grows with W_s: for W_s up to the next one looked at, the mean is >= F(W_s) / (alone + it)
        after = min(most, max(shared + 1, int(np.ceil(shared * BOUND_WINDOW_RATIO))))
        deviating = np.maximum(packed, shared + lacking)
        if whole:  # of W_s windows holding P pieces, at least W_s - (P - W_s) // j hold j or fewer
            few = np.where(per_window >= 2, shared - (n_pieces - shared) // np.maximum(per_window, 1),
                           2 * shared - n_pieces - calm)
            deviating = np.maximum(deviating, few)
        counted = float(deviating.sum()) / BOUND_GRID
        best = min(best, max(forced + counted, deficit) / max(alone_windows + max(shared, after - 1), 1))
        if shared >= most:
            break
        shared = after
    return max(bound, best)


def _deficit_bound(labels, lengths, tau, pieces, keep, filled_alone, forced, seq_len, total) -> float:
    """(d) of ``uniformity_lower_bound``: the sum over all windows of their deviation, bounded through one
    cluster k's token deficit.

    A shared window w of f_w <= seq_len tokens, t_wk of them k's, deviates by at least
    D_w = (f_w tau_k - t_wk) / seq_len (its shortfall in k, scaled by f_w / seq_len <= 1), and by at least
    E_w, the excess of any piece in it. The D_w sum to (tau_k F - T_k) / seq_len over the shared windows
    whatever the order (F and T_k: their tokens, and k's); so the deviations sum to at least that plus
    the sum of max(E_w - D_w, 0). A piece of p tokens of cluster c puts E_w - D_w >= v = p / seq_len -
    tau_c - tau_k, plus p / seq_len more when c = k (its own tokens count in t_wk), and the pieces of
    v > s sit in at least ``_layered_windows``'s count of windows. It is what a cluster whose tokens sit
    in long documents forces: every other window falls short of it. Taken at the cluster where it is
    largest among the ``DEFICIT_CLUSTERS`` of the largest shortfall; only pieces of positive excess (``keep``) can have v > 0."""
    n_clusters = tau.shape[0]
    alone_tokens = np.bincount(labels, weights=filled_alone * float(seq_len), minlength=n_clusters)
    cluster_tokens = np.bincount(labels, weights=lengths.astype(np.float64), minlength=n_clusters)
    shared_tokens = float(total) - float(alone_tokens.sum())
    shortfall = (tau * shared_tokens - (cluster_tokens - alone_tokens)) / seq_len
    share, owner = pieces[keep] / seq_len, labels[keep]
    sizes = pieces[keep].astype(np.int64)
    best = 0.0
    # The shortfall leads; the clusters of the largest few are tried (each costs a sort of the pieces).
    for k in np.argsort(-shortfall, kind="stable")[:DEFICIT_CLUSTERS]:
        if shortfall[k] <= 0:
            break
        v = share - tau[owner] - tau[k] + np.where(owner == k, share, 0.0)
        positive = v > 0
        layered = 0.0
        if positive.any():
            by_v = np.argsort(-v[positive], kind="mergesort")
            sorted_v = v[positive][by_v]
            windows = _layered_windows(sorted_v, sizes[positive][by_v], seq_len)
            layered = float(np.dot(sorted_v - np.append(sorted_v[1:], 0.0), windows))
        best = max(best, forced + float(shortfall[k]) + layered)
    return best


def _token_slice_mix(labels: np.ndarray, bounds: np.ndarray, start: float, stop: float, n_clusters: int) -> np.ndarray:
    """Cluster token shares of the token range [start, stop) of the packed stream (documents cut at the
    edges). ``bounds``: the documents' token offsets in stream order, with 0 first (document i holds
    tokens bounds[i]..bounds[i+1]); only the documents that reach into the range are read."""
    first = max(int(np.searchsorted(bounds, start, side="right")) - 1, 0)  # its end is past start
    last = int(np.searchsorted(bounds, stop, side="left"))  # documents before it begin before stop
    begins, ends = bounds[first:last], bounds[first + 1:last + 1]
    inside = np.clip(np.minimum(ends, stop) - np.maximum(begins, start), 0, None)
    mix = np.bincount(labels[first:last], weights=inside, minlength=n_clusters)
    total = mix.sum()
    return mix / total if total > 0 else mix


def boundary_shift(labels: np.ndarray, token_counts: np.ndarray, order: np.ndarray | None = None,
                   n_clusters: int | None = None, fraction: float = BOUNDARY_FRACTION) -> float:
    """Total-variation distance between the cluster mix of the first and the last ``fraction`` of tokens.

    What a model sees change at an epoch boundary (end of one pass -> start of the next): 0 when
    head and tail hold the same mix, 1 when they share no cluster.
    """
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts)
    k = int(n_clusters if n_clusters is not None else (labels.max() + 1 if labels.size else 1))
    if order is not None:  # only the head's and tail's labels are read: no N-long copy of them
        order = np.asarray(order, dtype=np.int64)
        counts = counts[order]
    # One N-long array (8 bytes per document) besides the order: the documents' token offsets.
    bounds = np.zeros(counts.size + 1, dtype=np.float64)
    np.cumsum(counts, dtype=np.float64, out=bounds[1:])
    total = bounds[-1]
    in_order = labels if order is None else _Reordered(labels, order)
    head = _token_slice_mix(in_order, bounds, 0.0, fraction * total, k)
    tail = _token_slice_mix(in_order, bounds, (1.0 - fraction) * total, total, k)
    return float(0.5 * np.abs(head - tail).sum())


class _Reordered:
    """``labels[order]`` read a slice at a time."""

    def __init__(self, labels: np.ndarray, order: np.ndarray):
        self.labels, self.order = labels, order

    def __getitem__(self, part: slice) -> np.ndarray:
        return self.labels[self.order[part]]


def coverage(labels: np.ndarray, token_counts: np.ndarray, order: np.ndarray | None = None,
             chunk: int = 1 << 20) -> float:
    """How far into the order (fraction of tokens before it) the last cluster first appears; lower is better.

    Reads the order a chunk at a time until every cluster has appeared (usually within the first
    chunk), so it holds no N-long copy. Token counts are integers, so every sum is exact in float64."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts)
    total = float(counts.sum(dtype=np.float64))
    if labels.size == 0 or total == 0:
        return 0.0
    n_present = clusters_present(labels)
    first = np.full(int(labels.max()) + 1, -1, dtype=np.int64)  # position in the order of each cluster's first document
    found = 0
    for lo in range(0, labels.size, chunk):
        rows = np.arange(lo, min(lo + chunk, labels.size)) if order is None else np.asarray(order[lo:lo + chunk],
                                                                                           dtype=np.int64)
        clusters, at = np.unique(labels[rows], return_index=True)
        new = first[clusters] < 0
        first[clusters[new]] = at[new] + lo
        found += int(new.sum())
        if found == n_present:
            break
    last = int(first.max())
    prefix = counts[:last + 1] if order is None else counts[np.asarray(order[:last + 1], dtype=np.int64)]
    before = float(prefix.sum(dtype=np.float64)) - float(prefix[-1])  # tokens before that document
    return float(before / total)


def clusters_present(labels: np.ndarray) -> int:
    """How many clusters have documents (a count, not np.unique's sort: 10M labels in 0.03 s, not 0.8)."""
    labels = np.asarray(labels)
    return int(np.count_nonzero(np.bincount(labels))) if labels.size else 0


def diversity_by_part(unique: np.ndarray, parts: int = EPOCH_PARTS) -> list[float]:
    """Mean unique clusters per window in each of ``parts`` consecutive runs of the windows (tenths of the epoch;
    one per window where there are fewer): an order's mean can hide a stretch of the epoch less diverse than the
    rest."""
    unique = np.asarray(unique)
    return [round(float(part.mean()), 2) for part in np.array_split(unique, min(parts, unique.size)) if part.size]


def baseline_shuffle_count(n_documents: int) -> int:
    """How many shuffles the random baseline of ``n_documents`` documents averages."""
    wanted = -(-RANDOM_SHUFFLED_DOCUMENTS // max(n_documents, 1))
    return int(min(RANDOM_SHUFFLES_MOST, max(RANDOM_SHUFFLES_LEAST, wanted)))


def baseline_shuffles(n_documents: int, seed: int):
    """The shuffles the random baseline averages, one at a time (one in memory): seeded ``seed``, ``seed`` + 1, ...;
    the first is the ``random`` ordering's."""
    for offset in range(baseline_shuffle_count(n_documents)):
        yield np.random.default_rng(seed + offset).permutation(n_documents).astype(np.int64)


def random_baseline(n_documents: int, seed: int, measure, first: dict | None = None) -> dict:
    """``measure(order)`` (a dict of measures) of each of the baseline's shuffles, as their ``mean_measures``, with
    how many shuffles it averages. ``first``: the first shuffle's measures, where the caller made them already."""
    shuffles = baseline_shuffles(n_documents, seed)
    if first is not None:
        next(shuffles)
    measured = ([] if first is None else [first]) + [measure(order) for order in shuffles]
    return {**mean_measures(measured), "shuffles": len(measured)}


def measured_order_name(key: str, measures: dict) -> str:
    """An order's name in the log and the plots: the random baseline says how many shuffles it averages."""
    name = MEASURED_ORDER_NAMES[key]
    return f"{name} (mean of {measures['shuffles']})" if "shuffles" in measures else name


def mean_measures(measured: list[dict]) -> dict:
    """The measures of several orders (dicts of one shape, nested ones too) as one, a typical order's: the mean of
    each number (a "min" too: the least of 100 shuffles' least windows is a rare draw's); counts stay whole numbers,
    means keep 4 decimals (lists of means, 2). Beside each boundary shift, its range (the measure that swings most
    from order to order)."""
    out = {}
    for key, value in measured[0].items():
        values = [m[key] for m in measured]
        if isinstance(value, dict):
            out[key] = mean_measures(values)
        elif isinstance(value, list) and all(len(v) == len(value) for v in values) and \
                all(isinstance(x, (int, float)) for v in values for x in v):
            out[key] = [round(float(np.mean(column)), 2) for column in zip(*values)]
        elif isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            out[key] = value  # not a measure (a name, a flag): the first's
        elif isinstance(value, (int, np.integer)):
            out[key] = int(round(float(np.mean(values))))
        else:
            out[key] = round(float(np.mean(values)), 4)
    if "boundary_shift" in out:
        out["boundary_shift_range"] = [min(m["boundary_shift"] for m in measured),
                                       max(m["boundary_shift"] for m in measured)]
    return out


def ordering_quality(labels: np.ndarray, token_counts: np.ndarray, seq_len: int, order: np.ndarray | None,
                     n_clusters: int, windows: tuple[np.ndarray, np.ndarray] | None = None,
                     packing: str = "whole") -> dict:
    """Every ordering metric for one order: diversity summary, efficiency, sequence fill, uniformity (max/mean),
    boundary shift, coverage.

    ``windows``: this order's ``window_counts``, when the caller has them already.
    """
    deviation = window_share_deviation(labels, token_counts, seq_len, order, n_clusters, packing)
    unique, documents = windows if windows is not None else window_counts(labels, token_counts, seq_len, order, packing)
    present = clusters_present(labels)
    by_tenth = diversity_by_part(unique)
    return {
        "diversity": summarize_windows(unique),
        "diversity_by_tenth": by_tenth,
        # (its own: the random baseline's is the mean of each shuffle's lowest, not the lowest of the mean tenths,
        # which evens the tenths out and sits above what a shuffle reaches)
        "diversity_lowest_tenth": min(by_tenth) if by_tenth else 0.0,
        "efficiency": round(efficiency(unique, documents, present), 4),
        "fill": round(sequence_fill(token_counts, deviation.size, seq_len), 4),  # one per window holding tokens
        "uniformity_max": round(float(deviation.max()), 4),
        "uniformity_mean": round(float(deviation.mean()), 4),
        "boundary_shift": round(boundary_shift(labels, token_counts, order, n_clusters), 4),
        "coverage": round(coverage(labels, token_counts, order), 4),
    }
