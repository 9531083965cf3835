"""Plain, obviously-correct implementations written straight from REFERENCE.md.

Slow Python loops on purpose: the package's compiled/vectorised code is compared against
these on random inputs. Nothing here is imported by the package.
"""

from __future__ import annotations

import math

import numpy as np


def ref_pools(labels, token_counts, n_clusters, within_cluster_sort):
    pools = [[i for i in range(len(labels)) if labels[i] == k] for k in range(n_clusters)]
    if within_cluster_sort == "original":
        return pools
    result = []
    for pool in pools:
        asc = sorted(pool, key=lambda i: token_counts[i])  # Python's sort is stable
        if within_cluster_sort == "length-asc":
            result.append(asc)
        elif within_cluster_sort == "length-desc":
            result.append(list(reversed(asc)))
        elif within_cluster_sort == "length-riffle":
            riffled, lo, hi = [], 0, len(asc) - 1
            take_low = True
            while lo <= hi:
                if take_low:
                    riffled.append(asc[lo])
                    lo += 1
                else:
                    riffled.append(asc[hi])
                    hi -= 1
                take_low = not take_low
            result.append(riffled)
        else:
            raise ValueError(within_cluster_sort)
    return result


def ref_stratified_order(labels, token_counts, n_clusters, within_cluster_sort="original"):
    pools = ref_pools(list(labels), list(token_counts), n_clusters, within_cluster_sort)
    remaining = [len(p) for p in pools]
    placed = [0] * n_clusters
    n = len(labels)
    order = []
    while len(order) < n:
        R = n - len(order)
        P = len(order)
        best, best_deficit = None, None
        for k in range(n_clusters):
            if remaining[k] == 0:
                continue
            deficit = remaining[k] / max(R, 1) - placed[k] / max(P, 1)
            if best is None or deficit > best_deficit:
                best, best_deficit = k, deficit
        order.append(pools[best][placed[best]])
        placed[best] += 1
        remaining[best] -= 1
    return order


def ref_window_diversity(labels_in_order, counts_in_order, seq_len):
    out = []
    S, F = set(), 0
    for c, t in zip(labels_in_order, counts_in_order):
        if F + t <= seq_len:
            S.add(c)
            F += t
        else:
            if F > 0:
                out.append(len(S))
            S, F = {c}, t
            while F >= seq_len:
                out.append(len(S))
                F -= seq_len
                S = {c} if F > 0 else set()
    if S:
        out.append(len(S))
    return out or [0]


def ref_summary(values):
    import statistics

    return {
        "mean": round(sum(values) / len(values), 2),
        "std": round(statistics.pstdev(values), 2),
        "min": min(values),
        "max": max(values),
        "n_sequences": len(values),
    }


def ref_similarity_stats(embeddings, seed=42):
    n = embeddings.shape[0]
    size = min(5000, n)
    idx = np.random.RandomState(seed).choice(n, size, replace=False)
    x = embeddings[idx]
    values = []
    for i in range(size):
        for j in range(i + 1, size):
            values.append(float(np.dot(x[i], x[j])))
    values = np.array(values)
    return {
        "mean": round(float(values.mean()), 4),
        "std": round(float(values.std()), 4),
        "median": round(float(np.median(values)), 4),
        "n_above_0.9": int((values > 0.9).sum()),
        "n_pairs": len(values),
    }


def ref_shallow_embedding(ids, table):
    """One document: clamp ids, look up rows, mean, L2-normalise (float64 here)."""
    vocab = table.shape[0]
    rows = [table[min(max(i, 0), vocab - 1)] for i in ids]
    mean = np.mean(np.asarray(rows, dtype=np.float64), axis=0)
    return mean / np.linalg.norm(mean)


def ref_pca(x, n_components, seed):
    from sklearn.decomposition import PCA

    n = min(n_components, x.shape[0] - 1, x.shape[1])
    reduced = PCA(n, random_state=seed).fit_transform(x)
    out = np.empty_like(reduced)
    for i, row in enumerate(reduced):
        out[i] = row / max(np.linalg.norm(row), 1e-8)
    return out


def ref_calibration(x, samples, seed, k_values=(5, 10, 15, 20, 25, 30, 40, 50, 75, 100)):
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.metrics import silhouette_score

    rows = []
    for k in k_values:
        if k >= x.shape[0]:
            continue
        labels = MiniBatchKMeans(n_clusters=k, random_state=seed, batch_size=4096, n_init=3).fit_predict(x)
        score = silhouette_score(x, labels, metric="cosine", sample_size=samples or None, random_state=seed)
        sizes = np.bincount(labels, minlength=k)
        rows.append((k, float(score), int(sizes.min()), float(np.median(sizes)), int(sizes.max())))
    peak = max(r[1] for r in rows)
    recommended = max(r[0] for r in rows if r[1] >= 0.95 * peak)
    return rows, recommended


# --- Orderings beyond the reference's stratified greedy, and the token-share metrics ------------------
# Plain loops written from the docstrings in diversity_order/orderings/ and diversity.py.


class RefWindow:
    """The trainer's packing, as in ref_window_diversity, one document at a time.

    ``present`` is the window's cluster set S of ref_window_diversity (a zero-token document counts);
    ``closed`` collects each finished window's {cluster: tokens}, for windows holding tokens. A
    document that does not fit closes the window; one of seq_len tokens or more fills whole windows
    alone and its remainder opens the next one.
    """

    def __init__(self, seq_len):
        self.seq_len = seq_len
        self.present = set()
        self.tokens = {}  # cluster -> tokens in the current window
        self.fill = 0
        self.closed = []

    def add(self, c, t):
        if self.fill + t <= self.seq_len:
            self.present.add(c)
            self.tokens[c] = self.tokens.get(c, 0) + t
            self.fill += t
            return
        if self.fill > 0:
            self.closed.append(self.tokens)
        self.present, self.tokens, self.fill = {c}, {c: t}, t
        while self.fill >= self.seq_len:
            self.closed.append({c: self.seq_len})
            self.fill -= self.seq_len
            self.present = {c} if self.fill > 0 else set()
            self.tokens = {c: self.fill} if self.fill > 0 else {}

    def finish(self):
        if self.fill > 0:
            self.closed.append(self.tokens)
        return self.closed


def ref_global_token_shares(labels, token_counts, n_clusters):
    total = sum(token_counts)
    shares = []
    for k in range(n_clusters):
        tokens_k = sum(t for c, t in zip(labels, token_counts) if c == k)
        shares.append(tokens_k / total if total > 0 else 0.0)
    return shares


def ref_window_share_deviation(labels_in_order, counts_in_order, seq_len, n_clusters):
    """Per window with tokens: max over all clusters of |tokens_k / window tokens - global share_k|."""
    shares = ref_global_token_shares(labels_in_order, counts_in_order, n_clusters)
    packer = RefWindow(seq_len)
    for c, t in zip(labels_in_order, counts_in_order):
        packer.add(c, t)
    out = []
    for window in packer.finish():
        size = sum(window.values())
        out.append(max(abs(window.get(k, 0) / size - shares[k]) for k in range(n_clusters)))
    return out or [0.0]


def ref_boundary_shift(labels_in_order, counts_in_order, n_clusters, fraction=0.05):
    """Expand documents into tokens; token i covers [i, i+1); count the part of it inside head/tail."""
    tokens = [c for c, t in zip(labels_in_order, counts_in_order) for _ in range(t)]
    total = len(tokens)
    head_stop, tail_start = fraction * total, (1 - fraction) * total
    head = [0.0] * n_clusters
    tail = [0.0] * n_clusters
    for i, c in enumerate(tokens):
        head[c] += max(0.0, min(i + 1, head_stop) - max(i, 0.0))
        tail[c] += max(0.0, min(i + 1, total) - max(i, tail_start))
    head_total, tail_total = sum(head), sum(tail)
    head = [h / head_total if head_total > 0 else 0.0 for h in head]
    tail = [t / tail_total if tail_total > 0 else 0.0 for t in tail]
    return 0.5 * sum(abs(h - t) for h, t in zip(head, tail))


def ref_coverage(labels_in_order, counts_in_order):
    """Tokens before the first document of the cluster that appears last, over all tokens."""
    total = sum(counts_in_order)
    if not labels_in_order or total == 0:
        return 0.0
    first = {}
    before = 0
    for c, t in zip(labels_in_order, counts_in_order):
        if c not in first:
            first[c] = before
        before += t
    return max(first.values()) / total


def ref_random_pools(labels, n_clusters, seed):
    """Each cluster's documents in the order of one seeded permutation of all positions."""
    perm = np.random.default_rng(seed).permutation(len(labels)).tolist()
    return [[i for i in perm if labels[i] == k] for k in range(n_clusters)]


def ref_round_robin_order(n_clusters, pools):
    """Cycle through clusters 0..K-1 taking each non-empty pool's next document."""
    taken = [0] * n_clusters
    order = []
    while len(order) < sum(len(p) for p in pools):
        for k in range(n_clusters):
            if taken[k] < len(pools[k]):
                order.append(pools[k][taken[k]])
                taken[k] += 1
    return order


def ref_bin_packing_order(labels, token_counts, n_clusters, seq_len, pools):
    """Pick the cluster with most documents left among those the open window lacks, else the one with
    most left; ties -> lowest k. ``pools``: each cluster's documents in pool order."""
    taken = [0] * n_clusters
    packer = RefWindow(seq_len)
    order = []
    while len(order) < len(labels):
        present = packer.present
        left = [len(pools[k]) - taken[k] for k in range(n_clusters)]
        lacking = [k for k in range(n_clusters) if left[k] > 0 and k not in present]
        candidates = lacking or [k for k in range(n_clusters) if left[k] > 0]
        most = max(left[k] for k in candidates)
        best = min(k for k in candidates if left[k] == most)
        doc = pools[best][taken[best]]
        taken[best] += 1
        order.append(doc)
        packer.add(labels[doc], token_counts[doc])
    return order


def ref_balanced_order(labels, token_counts, n_clusters, seq_len, seed, count_weight, horizon):
    """balanced_order's docstring as a loop: due times, earliest-due-first, lacking clusters pulled forward."""
    labels = list(labels)
    token_counts = list(token_counts)
    pools = ref_random_pools(labels, n_clusters, seed)
    w = count_weight
    due = {}
    for k in range(n_clusters):
        tokens_k = float(sum(token_counts[i] for i in pools[k]))
        before = 0.0
        for j, i in enumerate(pools[k]):
            due[i] = w * (j + 0.5) / len(pools[k]) + (1 - w) * (before + 0.5 * token_counts[i]) / max(tokens_k, 1.0)
            before += token_counts[i]
    total = max(float(sum(token_counts)), 1.0)
    taken = [0] * n_clusters
    packer = RefWindow(seq_len)
    placed_tokens = 0.0
    order = []
    while len(order) < len(labels):
        limit = (placed_tokens + horizon * seq_len) / total
        heads = [(due[pools[k][taken[k]]], k) for k in range(n_clusters) if taken[k] < len(pools[k])]
        present = packer.present
        pulled = [(d, k) for d, k in heads if k not in present and d <= limit]
        _, best = min(pulled or heads)  # earliest due, then lowest k
        doc = pools[best][taken[best]]
        taken[best] += 1
        order.append(doc)
        placed_tokens += token_counts[doc]
        packer.add(labels[doc], token_counts[doc])
    return order


def ref_f3(families, placed, total, doc_groups, length):
    """Seed 004's f_3 after adding one document of ``length`` tokens.

    families: [(weight, targets: {group: tau})]; placed: [{group: T}] per family; doc_groups: the
    document's group in each family. f_3 = sum_f w_f sum_j [(T_j + c_j) - tau_j (S + l)]^2.
    """
    value = 0.0
    for (weight, targets), tokens, g in zip(families, placed, doc_groups):
        for j, tau in targets.items():
            c = length if j == g else 0
            value += weight * ((tokens.get(j, 0) + c) - tau * (total + length)) ** 2
    return value


def ref_folds(sorted_items, n_folds, zigzag):
    """Deal items i -> fold i % L, concatenate the folds; with zigzag every odd fold is reversed."""
    n_folds = max(1, min(n_folds, max(len(sorted_items), 1)))
    folds = [[] for _ in range(n_folds)]
    for i, item in enumerate(sorted_items):
        folds[i % n_folds].append(item)
    out = []
    for f, fold in enumerate(folds):
        out += list(reversed(fold)) if zigzag and f % 2 == 1 else fold
    return out


def ref_stable_and_transitions(sorted_items, n_sections, transition_ratio, n_folds, zigzag):
    """Stair/saw: boundaries round(n * s / K) for s = 1..K-1 and a radius round(r * n), both rounded
    halves to even (Python's round). Walking the boundaries in turn, the items from where the last
    region ended (or b - radius, if later) up to b + radius (or the end) are dealt into folds (zig-zag
    for saw); everything else stays in place."""
    n = len(sorted_items)
    out = list(sorted_items)
    if n == 0 or n_sections <= 1 or transition_ratio <= 0:
        return out
    radius = round(n * transition_ratio)
    last_end = 0
    for s in range(1, n_sections):
        edge = round(n * s / n_sections)
        lo, hi = max(last_end, edge - radius), min(n, edge + radius)
        out[lo:hi] = ref_folds(sorted_items[lo:hi], n_folds, zigzag)
        last_end = hi
    return out


def ref_segment_parts(sorted_items, first_percent, last_percent, layout):
    """Segment: (first, middle, last) as sets of items. floor(n * p / 100) items in the first and in the
    last part, from the score ends the layout names (low = the start of sorted_items); with both parts
    from one end, first and last are given as one set (their union) and first is None."""
    n = len(sorted_items)
    n_first, n_last = int(n * first_percent // 100), int(n * last_percent // 100)
    first_end, last_end = layout.split("-")
    if first_end == last_end:
        k = n_first + n_last
        pool = sorted_items[:k] if first_end == "low" else sorted_items[n - k:]
        middle = sorted_items[k:] if first_end == "low" else sorted_items[:n - k]
        return None, set(middle), set(pool)
    low_count, high_count = (n_first, n_last) if first_end == "low" else (n_last, n_first)
    low, high = set(sorted_items[:low_count]), set(sorted_items[n - high_count:])
    middle = set(sorted_items[low_count:n - high_count])
    return (low, middle, high) if first_end == "low" else (high, middle, low)


def ref_gumbel(sorted_items, temperature, seed):
    """Sorted with Gumbel noise: item i gets the key i + temperature * g_i, g the standard Gumbel draws of a
    numpy generator seeded with ``seed``; items by key, equal keys in their sorted order."""
    if temperature == 0 or len(sorted_items) <= 1:
        return list(sorted_items)
    noise = np.random.default_rng(seed).gumbel(size=len(sorted_items))
    keys = [i + temperature * float(g) for i, g in enumerate(noise)]
    return [sorted_items[i] for i in sorted(range(len(sorted_items)), key=lambda i: (keys[i], i))]


# Split packing: documents concatenated into one token stream, cut every seq_len tokens.
def ref_split_windows(labels_in_order, counts_in_order, seq_len):
    """Per window (in order), {cluster: tokens it has there}. A document with t > 0 tokens at
    stream offset s is in windows s // L .. (s + t - 1) // L; one with no tokens is in the window
    of the token before it (window 0 at the start)."""
    windows = {}
    offset = 0
    for cluster, tokens in zip(labels_in_order, counts_in_order):
        if tokens == 0:
            w = (offset - 1) // seq_len if offset > 0 else 0
            windows.setdefault(w, {}).setdefault(cluster, 0)
            continue
        for position in range(offset, offset + tokens):
            bucket = windows.setdefault(position // seq_len, {})
            bucket[cluster] = bucket.get(cluster, 0) + 1
        offset += tokens
    return [windows[w] for w in sorted(windows)]


def ref_split_window_diversity(labels_in_order, counts_in_order, seq_len):
    windows = ref_split_windows(labels_in_order, counts_in_order, seq_len)
    return [len(w) for w in windows] or [0]


def ref_split_window_share_deviation(labels_in_order, counts_in_order, seq_len, n_clusters):
    shares = ref_global_token_shares(labels_in_order, counts_in_order, n_clusters)
    out = []
    for window in ref_split_windows(labels_in_order, counts_in_order, seq_len):
        total = sum(window.values())
        if total:
            out.append(max(abs(window.get(k, 0) / total - shares[k]) for k in range(n_clusters)))
    return out or [0.0]


def ref_window_documents(labels_in_order, counts_in_order, seq_len, split=False):
    """Documents present in each window, windows as ref_window_diversity (whole) or ref_split_windows (split)."""
    if split:
        docs, offset = {}, 0
        for tokens in counts_in_order:
            first = ((offset - 1) // seq_len if offset > 0 else 0) if tokens == 0 else offset // seq_len
            last = first if tokens == 0 else (offset + tokens - 1) // seq_len
            for w in range(first, last + 1):
                docs[w] = docs.get(w, 0) + 1
            offset += tokens
        return [docs[w] for w in sorted(docs)] or [0]
    out = []
    S, D, F = set(), 0, 0
    for c, t in zip(labels_in_order, counts_in_order):
        if F + t <= seq_len:
            S.add(c)
            D += 1
            F += t
        else:
            if F > 0:
                out.append(D)
            S, D, F = {c}, 1, t
            while F >= seq_len:
                out.append(D)
                F -= seq_len
                S, D = ({c}, 1) if F > 0 else (set(), 0)
    if S:
        out.append(D)
    return out or [0]


def assert_mean_of_shuffles(measured: dict, labels, counts, k, seq_len, seed, packing="whole", ids=None):
    """``measured`` is the mean of the measures of the random baseline's shuffles, each drawn here as the
    ``random`` ordering draws one (seeds seed, seed + 1, ...): of the clusters, or of ``ids`` (a field's
    categories) where given."""
    import pytest

    from diversity_order import diversity

    count = min(100, max(5, math.ceil(2_000_000 / labels.size)))  # more shuffles for fewer documents
    shuffles = [np.random.default_rng(seed + i).permutation(labels.size) for i in range(count)]
    groups = labels if ids is None else ids
    each = [diversity.ordering_quality(groups, counts, seq_len, order, k if ids is None else int(ids.max()) + 1,
                                       packing=packing) for order in shuffles]
    for key in set(measured) & {"efficiency", "fill", "uniformity_mean", "uniformity_max", "boundary_shift",
                                "coverage"}:
        assert measured[key] == pytest.approx(sum(q[key] for q in each) / count, abs=1e-4), key
    if "diversity" in measured:
        assert measured["shuffles"] == count
        assert measured["diversity"]["mean"] == pytest.approx(sum(q["diversity"]["mean"] for q in each) / count,
                                                              abs=1e-4)
        assert measured["diversity"]["min"] == round(sum(q["diversity"]["min"] for q in each) / count)
    if "diversity_lowest_tenth" in measured:  # each shuffle's own lowest tenth, averaged (not the lowest mean tenth)
        lowest = []
        for order in shuffles:
            unique = diversity.window_diversity(groups, counts, seq_len, order, packing)
            lowest.append(min(float(np.mean(part)) for part in np.array_split(unique, min(10, unique.size))))
        assert measured["diversity_lowest_tenth"] == pytest.approx(sum(lowest) / count, abs=0.01)
    assert measured["boundary_shift_range"] == [min(q["boundary_shift"] for q in each),
                                                max(q["boundary_shift"] for q in each)]
