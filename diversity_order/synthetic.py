"""Synthetic (labels, token counts) corpora built to break naive orderings.

Only what an ordering sees: a cluster label and a token count per document, in an input order
that is grouped by cluster (as files from separate sources are), with document lengths drifting
inside each group. Used by the tests, the ordering benchmark and the strategy comparison.
"""

from __future__ import annotations

import numpy as np

SKEWED_CORPORA = ("uneven-sizes", "long-cluster", "tiny-clusters", "k1000")


def _lengths(rng, n, median, sigma=1.0, low=16, high=200_000):
    return np.clip(rng.lognormal(np.log(median), sigma, n), low, high).astype(np.int64)


def skewed_corpus(name: str, n_docs: int = 20_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """``(labels, token_counts, n_clusters)`` for one of ``SKEWED_CORPORA``.

    - uneven-sizes: 30 clusters with Zipf sizes (the largest ~100x the smallest) and lengths;
    - long-cluster: 30 clusters; one holds 1.5% of documents but ~35% of tokens (4-24k-token documents);
    - tiny-clusters: 200 clusters, 150 of them with 1-5 documents;
    - k1000: 1000 clusters of random sizes.
    Input order: grouped by cluster, and inside each group sorted by length (a drift a pool that
    keeps input order carries from head to tail).
    """
    rng = np.random.default_rng(seed)
    if name == "uneven-sizes":
        k = 30
        weights = 1.0 / np.arange(1, k + 1) ** 1.4
        labels = rng.choice(k, n_docs, p=weights / weights.sum())
        medians = rng.uniform(80, 2000, k)
        counts = np.clip(rng.lognormal(np.log(medians[labels]), 1.0), 16, 200_000).astype(np.int64)
    elif name == "long-cluster":
        k = 30
        labels = rng.integers(1, k, n_docs)
        long_docs = rng.random(n_docs) < 0.015
        labels[long_docs] = 0
        counts = _lengths(rng, n_docs, 300, 0.8)
        counts[long_docs] = rng.integers(4_000, 24_000, int(long_docs.sum()))
    elif name == "tiny-clusters":
        k = 200
        tiny = rng.integers(1, 6, 150)
        labels = np.concatenate([np.repeat(np.arange(150), tiny),
                                 rng.integers(150, k, max(n_docs - int(tiny.sum()), 0))])
        counts = _lengths(rng, labels.size, 400)
    elif name == "k1000":
        k = 1000
        weights = rng.pareto(1.5, k) + 0.05
        labels = rng.choice(k, n_docs, p=weights / weights.sum())
        counts = _lengths(rng, n_docs, 500)
    else:
        raise ValueError(f"unknown synthetic corpus {name!r}; choose one of {', '.join(SKEWED_CORPORA)}")
    order = np.lexsort((counts, labels))
    labels = np.asarray(labels, dtype=np.int64)[order]
    counts = np.asarray(counts, dtype=np.int64)[order]
    # Relabel so every cluster id below k occurs (k-means never returns an empty cluster).
    _, labels = np.unique(labels, return_inverse=True)
    return labels.astype(np.int64), counts, int(labels.max()) + 1
