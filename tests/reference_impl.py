"""Plain, obviously-correct implementations written straight from REFERENCE.md.

Slow Python loops on purpose: the package's compiled/vectorised code is compared against
these on random inputs. Nothing here is imported by the package.
"""

from __future__ import annotations

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
