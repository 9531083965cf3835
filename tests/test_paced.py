"""The ``paced`` ordering (diversity_order/orderings/paced.py) against plain loops written from its rules:
the pools (sigma-delta interleave of short and long documents), the due positions (count-paced merge)
and the window-filling greedy under both packing models, on random inputs from hypothesis with
zero-token documents, documents longer than a window and clusters without documents; and the
guarantees the rules give (pool prefixes on schedule, documents at most a few windows ahead).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order import diversity
from diversity_order.orderings import OrderingOptions, paced


def paced_order(labels, counts, n_clusters, seq_len, split, seed=42):
    options = OrderingOptions(seq_len=seq_len, packing="split" if split else "whole", seed=seed)
    return paced.paced_order(labels, counts, n_clusters, options)


# --- plain loops, written from the definitions ----------------------------------------------------


def plain_paced_pools(shuffled, labels, counts, n_clusters):
    """Rule 1: per cluster, short (<= mean) documents in shuffled order and long ones in organ-pipe
    order of length (ties in shuffled order), interleaved so the pool keeps to j * mean tokens."""
    members, pool_starts = [], []
    for k in range(n_clusters):
        pool_starts.append(len(members))
        docs = [i for i in shuffled if labels[i] == k]
        n_k, total = len(docs), sum(counts[i] for i in docs)
        # Everything scaled by n_k, so "above the mean" and the schedule error are exact integers.
        short = [i for i in docs if counts[i] * n_k <= total]
        ascending = sorted((i for i in docs if counts[i] * n_k > total), key=lambda i: counts[i])  # stable
        pipe = ascending[0::2] + ascending[1::2][::-1]
        error = 0  # n_k * (tokens so far) - (documents so far) * total
        while short or pipe:
            # the next long document when the pool is behind by at least half of its excess
            if pipe and (not short or 2 * error + (n_k * counts[pipe[0]] - total) <= 0):
                doc = pipe.pop(0)
            else:
                doc = short.pop(0)
            members.append(doc)
            error += n_k * counts[doc] - total
    pool_starts.append(len(members))
    return members, pool_starts


def plain_due_positions(pool_starts, counts_in_pool):
    """Rule 2: merge the pools purely by count pacing (slot j of a pool of n at (j + 1/2) / n, equal keys to the
    lower cluster); a slot's due position is the number of tokens merged before it."""
    slots = []
    for k in range(len(pool_starts) - 1):
        n_k = pool_starts[k + 1] - pool_starts[k]
        slots += [(Fraction(2 * j + 1, 2 * n_k), k, pool_starts[k] + j) for j in range(n_k)]
    due = [0] * len(counts_in_pool)
    merged = 0
    for _, _, slot in sorted(slots):
        due[slot] = merged
        merged += counts_in_pool[slot]
    return due


def plain_paced(members, pool_starts, counts_in_pool, seq_len, split):
    """Rules 3-4 against the due positions (tokens) of rule 2. Packing whole: the earliest-due document of a
    cluster the window lacks that fits and is due before the next window ends; else the earliest-due one that
    fits and is due before this window ends; else the earliest-due one. Packing split: the straddler is the
    document due before STRADDLE_HORIZON windows after this one ends with the largest excess t / L - T_k / T,
    of a cluster the window lacks if any (of any cluster when N L >= K T, windows holding more documents than
    there are clusters); if the room left is at most half of it (of t mod L when t >= L), it
    goes now; else the earliest-due document of a lacking cluster, due before the next window ends, that fits
    in the room left minus that half; else the straddler if the room is at most 1.5 halves; else the
    earliest-due lacking document due before the next window ends; else the earliest-due one. Ties: lowest
    cluster."""
    n_clusters = len(pool_starts) - 1
    due = plain_due_positions(pool_starts, counts_in_pool)
    cluster_tokens = [sum(counts_in_pool[pool_starts[k]:pool_starts[k + 1]]) for k in range(n_clusters)]
    total = sum(cluster_tokens)
    horizon_windows = paced.STRADDLE_HORIZON
    taken = [0] * n_clusters
    in_window = [set() for _ in range(n_clusters)]
    window, fill, placed = 0, 0, 0
    order = []
    for _ in range(len(members)):
        if split:
            window = placed // seq_len
            room = (window + 1) * seq_len - placed
        else:
            room = seq_len - fill
        window_end = placed + room
        heads = []  # (due, cluster, length, lacks)
        for k in range(n_clusters):
            if taken[k] < pool_starts[k + 1] - pool_starts[k]:
                p = pool_starts[k] + taken[k]
                heads.append((due[p], k, counts_in_pool[p], window not in in_window[k]))
        earliest = min(heads)
        pick = None
        if split:
            lacking = [h for h in heads if h[3] and h[0] <= window_end + seq_len]
            near = [h for h in heads if h[0] <= window_end + horizon_windows * seq_len]
            if near:
                # windows hold more documents than there are clusters: any cluster may straddle
                saturated = len(members) * seq_len >= n_clusters * total
                pool = near if saturated else ([h for h in near if h[3]] or near)
                excess = {h[1]: Fraction(h[2], seq_len) - Fraction(cluster_tokens[h[1]], total or 1) for h in pool}
                straddler = max(pool, key=lambda h: (excess[h[1]], -h[1]))
                t = straddler[2]
                half = (t % seq_len if t >= seq_len else t) // 2
                if room <= half:
                    pick = straddler
                else:
                    before = [h for h in lacking if h[1] != straddler[1] and h[2] <= room - half]
                    if before:
                        pick = min(before)
                    elif room <= Fraction(3, 2) * half:
                        pick = straddler
            if pick is None:
                pick = min(lacking) if lacking else earliest
        else:
            fits = [h for h in heads if fill + h[2] <= seq_len]
            lacking = [h for h in fits if h[3] and h[0] <= window_end + seq_len]
            fitting = [h for h in fits if not h[3] and h[0] <= window_end]
            pick = min(lacking) if lacking else (min(fitting) if fitting else earliest)
        k = pick[1]
        position = pool_starts[k] + taken[k]
        taken[k] += 1
        order.append(members[position])
        t = counts_in_pool[position]
        if split:
            if t > 0:
                in_window[k].update(range(placed // seq_len, (placed + t - 1) // seq_len + 1))
            else:
                in_window[k].add((placed - 1) // seq_len if placed > 0 else 0)
            placed += t
        else:
            placed += t
            if fill + t <= seq_len:
                in_window[k].add(window)
                fill += t
            else:
                window += 1
                fill = t
                while fill >= seq_len:
                    in_window[k].add(window)
                    fill -= seq_len
                    window += 1
                if fill > 0:
                    in_window[k].add(window)
    return order


# --- random inputs ----------------------------------------------------------------------------------


@st.composite
def corpora(draw, max_docs=60):
    """(labels, token counts, n_clusters, seq_len): zero-token documents, documents longer than a
    window, and clusters without documents all occur."""
    n_clusters = draw(st.integers(1, 6))
    seq_len = draw(st.integers(1, 24))
    n = draw(st.integers(0, max_docs))
    labels = draw(st.lists(st.integers(0, n_clusters - 1), min_size=n, max_size=n))
    length = st.one_of(st.just(0), st.integers(1, seq_len + 1), st.integers(0, 4 * seq_len + 3))
    counts = draw(st.lists(length, min_size=n, max_size=n))
    return np.asarray(labels, dtype=np.int64), np.asarray(counts, dtype=np.int64), n_clusters, seq_len


@st.composite
def short_documents(draw, max_docs=60):
    """Windows that hold more documents than there are clusters (N L >= K T, the "saturated" case)."""
    n_clusters = draw(st.integers(1, 4))
    seq_len = draw(st.integers(8, 24))
    n = draw(st.integers(1, max_docs))
    labels = draw(st.lists(st.integers(0, n_clusters - 1), min_size=n, max_size=n))
    counts = draw(st.lists(st.integers(0, max(seq_len // (2 * n_clusters), 1)), min_size=n, max_size=n))
    counts[draw(st.integers(0, n - 1))] = draw(st.integers(0, 2 * seq_len))  # one long one
    return np.asarray(labels, dtype=np.int64), np.asarray(counts, dtype=np.int64), n_clusters, seq_len


# --- paced ----------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1))
def test_pools_match_plain_loop(corpus, seed):
    labels, counts, n_clusters, _ = corpus
    shuffled = np.random.default_rng(seed).permutation(labels.size)  # the seeded shuffle of cluster_pools
    members, pool_starts = paced.paced_pools(labels, counts, n_clusters, seed)
    want_members, want_starts = plain_paced_pools(list(shuffled), list(labels), list(counts), n_clusters)
    assert members.tolist() == want_members
    assert pool_starts.tolist() == want_starts


@settings(max_examples=300, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1))
def test_pool_prefixes_keep_to_the_token_schedule(corpus, seed):
    """Rule 1's guarantee: after j documents a pool holds j * mean tokens, to within half the largest
    excess of a long document above, and that plus one mean below."""
    labels, counts, n_clusters, _ = corpus
    members, pool_starts = paced.paced_pools(labels, counts, n_clusters, seed)
    for k in range(n_clusters):
        pool = counts[members[pool_starts[k]:pool_starts[k + 1]]]
        if pool.size == 0:
            continue
        n_k, total = pool.size, int(pool.sum())
        excess = max([n_k * int(t) - total for t in pool if n_k * int(t) > total], default=0)
        # Scaled by n_k so the check is exact: E_j = n_k * prefix_j - j * T_k.
        scaled_error = n_k * np.cumsum(pool) - np.arange(1, n_k + 1) * total
        assert (2 * scaled_error <= excess).all()
        assert (2 * scaled_error >= -(excess + 2 * total)).all()


@settings(max_examples=300, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1))
def test_due_positions_match_plain_merge(corpus, seed):
    labels, counts, n_clusters, _ = corpus
    members, pool_starts = paced.paced_pools(labels, counts, n_clusters, seed)
    due = paced.due_positions(members, pool_starts, counts)
    assert due.tolist() == plain_due_positions(pool_starts.tolist(), counts[members].tolist())


@settings(max_examples=400, deadline=None)
@given(st.one_of(corpora(), short_documents()), st.integers(0, 2**32 - 1), st.booleans())
def test_greedy_matches_plain_loop(corpus, seed, split):
    labels, counts, n_clusters, seq_len = corpus
    order = paced_order(labels, counts, n_clusters, seq_len, split, seed)
    members, pool_starts = paced.paced_pools(labels, counts, n_clusters, seed)
    want = plain_paced(members.tolist(), pool_starts.tolist(), counts[members].tolist(), seq_len, split)
    assert order.tolist() == want


@settings(max_examples=200, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1), st.booleans())
def test_paced_order_is_a_seeded_permutation(corpus, seed, split):
    labels, counts, n_clusters, seq_len = corpus
    order = paced_order(labels, counts, n_clusters, seq_len, split, seed)
    assert order.dtype == np.int64
    assert sorted(order.tolist()) == list(range(labels.size))
    again = paced_order(labels, counts, n_clusters, seq_len, split, seed)
    assert order.tolist() == again.tolist()


@settings(max_examples=300, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1), st.booleans())
def test_documents_run_at_most_the_horizon_ahead(corpus, seed, split):
    """The pacing guarantee: each document starts at most STRADDLE_HORIZON + 1 windows (split) or 2 windows
    (whole) before its due position, unless no document at all was due by then (it is then the earliest due)."""
    labels, counts, n_clusters, seq_len = corpus
    order = paced_order(labels, counts, n_clusters, seq_len, split, seed)
    members, pool_starts = paced.paced_pools(labels, counts, n_clusters, seed)
    due_of = dict(zip(members.tolist(), paced.due_positions(members, pool_starts, counts).tolist()))
    ahead = (paced.STRADDLE_HORIZON + 1 if split else 2) * seq_len
    placed = 0
    remaining = set(order.tolist())
    for doc in order.tolist():
        # whole packing: a window ends at most seq_len after the document's start
        if due_of[doc] > placed + ahead:
            assert due_of[doc] == min(due_of[d] for d in remaining)
        remaining.discard(doc)
        placed += int(counts[doc])


def test_a_long_document_straddles_the_boundary_at_its_middle():
    # L = 10, split packing: cluster 0 has one 8-token document, clusters 1-9 two one-token ones each. The
    # 8-token document is the straddler; six one-token documents of clusters the window lacks go first, it
    # starts when 4 tokens are left (its half) and ends 4 tokens into the next window, so neither window
    # holds more than 4 of its tokens.
    labels = np.array([0] + [k for k in range(1, 10) for _ in range(2)])
    counts = np.array([8] + [1] * 18)
    order = paced_order(labels, counts, 10, 10, split=True, seed=0)
    start = int(np.cumsum(counts[order])[np.flatnonzero(order == 0)[0]] - 8)
    assert start % 10 == 6


def test_a_lacking_cluster_goes_first():
    # Two clusters, equal sizes and lengths: the windows alternate clusters instead of repeating one.
    labels = np.array([0] * 8 + [1] * 8)
    counts = np.ones(16, dtype=np.int64)
    for split in (False, True):
        order = paced_order(labels, counts, 2, 2, split, seed=0)
        assert diversity.window_diversity(labels, counts, 2, order).tolist() == [2] * 8


def test_long_documents_stay_off_the_ends():
    # One cluster: 50 one-token documents and one of 100 tokens. The long one sits mid-pool and its
    # tokens are not in the first or last 5% of the stream.
    labels = np.zeros(51, dtype=np.int64)
    counts = np.ones(51, dtype=np.int64)
    counts[7] = 100
    order = paced_order(labels, counts, 1, 16, split=True, seed=3)
    start = int(np.cumsum(counts[order])[np.flatnonzero(order == 7)[0]] - 100)
    assert 0.05 * counts.sum() <= start and start + 100 <= 0.95 * counts.sum()


def test_no_documents():
    assert paced_order(np.zeros(0, np.int64), np.zeros(0, np.int64), 3, 8, True).size == 0
