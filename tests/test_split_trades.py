"""Rule 8 of ``paced`` (diversity_order/orderings/split_trades.py) against a plain loop written from its
rules: windows cut from scratch for every proposal, deviations and unique clusters counted from the
windows' pieces, the same seeded generators, runs of windows swept one after the other; its incremental
bookkeeping (a trade applied to the stretch's windows, a window loaded) against the windows cut from
scratch; and the guarantees (a permutation, clusters kept, summed deviation never higher, the head and the
tail's token mixes untouched), on random inputs from hypothesis with zero-token documents, documents
longer than a window and clusters without documents.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_exchange import MASK, an_order, corpora, plain_next_random, plain_windows

from diversity_order import diversity
from diversity_order.orderings import ORDERINGS, OrderingOptions, exchange, split_trades

# --- plain loops, written from the definitions ----------------------------------------------------


def window_rows(order, labels, counts, seq_len, n_clusters, n_windows):
    """Per window: tokens per cluster, and documents per cluster present (packing split, plain pieces)."""
    tokens = np.zeros((n_windows, n_clusters), dtype=np.int64)
    docs = np.zeros((n_windows, n_clusters), dtype=np.int64)
    for w, content in plain_windows(list(order), labels, counts, seq_len, True).items():
        for k, t in content:
            tokens[w, k] += t
            docs[w, k] += 1
    return tokens, docs


def signed_worst(content, shares):
    """(max_k |tokens_k - tau_k fill| / fill, k + 1 for the lowest k attaining it, negated unless k is over its
    share); (0, 0) when no cluster is off its share or the window has no tokens."""
    fill = sum(t for _, t in content)
    if fill == 0:
        return 0.0, 0
    tokens = [0] * len(shares)
    for k, t in content:
        tokens[k] += t
    gaps = [tokens[k] - shares[k] * fill for k in range(len(shares))]
    worst = max(abs(g) for g in gaps)
    if worst == 0:
        return 0.0, 0
    k = [abs(g) for g in gaps].index(worst)
    return worst / fill, (k + 1 if gaps[k] > 0 else -k - 1)


def plain_recut_count(offsets, p, q, w0, w1, delta, seq_len):
    """Documents strictly between p and q reaching within the shift of a cut inside the stretch."""
    return sum(1 for r in range(p + 1, q)
               if any(offsets[r] <= c + max(-delta, 0) and offsets[r + 1] >= c - max(delta, 0)
                      for c in range((w0 + 1) * seq_len, w1 * seq_len + 1, seq_len)))


def plain_split_trades(order, labels, counts, seq_len, shares, seed, chunks, min_chunk_windows):
    order = list(order)
    n = len(order)
    total = int(sum(counts[d] for d in order))
    if n < 2 or total == 0:
        return order
    n_windows = -(-total // seq_len)
    lo, hi = exchange.BOUNDARY_FRACTION * total, (1 - exchange.BOUNDARY_FRACTION) * total
    part = []  # the head (0), the middle (1) and the tail (2) of the order; -1 reaches across
    for w in range(n_windows):
        start, end = w * seq_len, min((w + 1) * seq_len, total)
        part.append(0 if end <= lo else 2 if start >= hi else 1 if lo <= start and end <= hi else -1)
    span = max(2, split_trades.SPAN_WINDOWS * n // n_windows)
    n_runs = max(1, min(chunks, n_windows // min_chunk_windows))
    for run in range(n_runs):  # runs of whole windows, each with its own generator, one after the other
        w_lo, w_hi = run * n_windows // n_runs, (run + 1) * n_windows // n_runs
        state = (((seed & (MASK >> 1)) * 2 + 0x9E3779B97F4A7C15) + run * 0x3C6EF372FE94F82A) & MASK
        offsets = np.concatenate(([0], np.cumsum([counts[d] for d in order])))
        for p in [p for p in range(n) if w_lo * seq_len <= offsets[p] < w_hi * seq_len]:
            if counts[order[p]] == 0:
                continue
            for _ in range(split_trades.TRIES):
                state, draw = plain_next_random(state)
                q = p + 1 + (draw * span >> 31)
                if q >= n:
                    break
                a, b = order[p], order[q]
                if counts[b] == 0 or labels[a] == labels[b]:
                    continue
                offsets = np.concatenate(([0], np.cumsum([counts[d] for d in order])))
                w0, w1 = offsets[p] // seq_len, (offsets[q + 1] - 1) // seq_len
                if (w1 == w0 or w1 >= w_hi or w1 - w0 >= split_trades.MAX_WINDOWS or part[w0] != part[w1]
                        or part[w0] < 0):
                    continue
                now = plain_windows(order, labels, counts, seq_len, True)
                first, last = signed_worst(now[w0], shares)[1], signed_worst(now[w1], shares)[1]
                ka, kb = labels[a] + 1, labels[b] + 1
                if not (first == ka or first == -kb or last == kb or last == -ka):
                    continue
                if plain_recut_count(offsets, p, q, w0, w1, counts[b] - counts[a], seq_len) > split_trades.MAX_RECUT:
                    continue
                trial = order.copy()
                trial[p], trial[q] = b, a
                then = plain_windows(trial, labels, counts, seq_len, True)
                stretch = range(w0, w1 + 1)
                if (sum(len({k for k, _ in then[w]}) for w in stretch)
                        < sum(len({k for k, _ in now[w]}) for w in stretch)):
                    continue
                before = sum(signed_worst(now[w], shares)[0] for w in stretch)
                after = sum(signed_worst(then[w], shares)[0] for w in stretch)
                if after < before - exchange.EPSILON:
                    order = trial
                    break
    return order


# --- the pass against the plain loop ------------------------------------------------------------------


def traded(corpus, seed, from_paced, min_chunk_windows=split_trades.MIN_CHUNK_WINDOWS):
    """(order, shares, the order after rule 8): a random order or paced's rules 1-5, packing split."""
    labels, counts, n_clusters, seq_len = corpus
    order = an_order(labels, counts, n_clusters, seq_len, True, seed, from_paced)
    shares = diversity.global_token_shares(labels, counts, n_clusters)
    return order, shares, split_trades.split_trade_pass(order, labels, counts, seq_len, shares, seed,
                                                        min_chunk_windows=min_chunk_windows)


@settings(max_examples=400, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from([split_trades.MIN_CHUNK_WINDOWS, 1, 3]))
def test_split_trades_match_plain_loop(corpus, seed, from_paced, min_chunk_windows):
    """Also with runs of 1 or 3 windows (the suite's inputs are too short for the package's runs)."""
    labels, counts, _, seq_len = corpus
    order, shares, got = traded(corpus, seed, from_paced, min_chunk_windows)
    want = plain_split_trades(order, labels, counts, seq_len, shares, seed, split_trades.CHUNKS, min_chunk_windows)
    assert got.tolist() == want


@settings(max_examples=300, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1), st.data())
def test_a_trade_applied_to_the_stretch_matches_windows_cut_again(corpus, seed, data):
    """_trade on the stretch's windows (and _recut_runs' documents) gives the windows of the swapped order
    cut from scratch, and every window outside the stretch is unchanged; _load gives each window's row."""
    labels, counts, n_clusters, seq_len = corpus
    order = np.random.default_rng(seed).permutation(labels.size)
    total = int(counts.sum())
    with_tokens = [p for p in range(labels.size) if counts[order[p]] > 0]
    if len(with_tokens) < 2:
        return
    p, q = sorted(data.draw(st.lists(st.sampled_from(with_tokens), min_size=2, max_size=2, unique=True)))
    lab, tok = labels[order].astype(np.int64), counts[order].astype(np.int64)
    off = np.concatenate(([0], np.cumsum(tok)))
    w0, w1 = off[p] // seq_len, (off[q + 1] - 1) // seq_len
    n_windows = -(-total // seq_len)
    tokens, docs = window_rows(order, labels, counts, seq_len, n_clusters, n_windows)
    swapped = order.copy()
    swapped[p], swapped[q] = order[q], order[p]
    tokens_after, docs_after = window_rows(swapped, labels, counts, seq_len, n_clusters, n_windows)
    outside = [w for w in range(n_windows) if not w0 <= w <= w1]
    assert np.array_equal(tokens[outside], tokens_after[outside]) and np.array_equal(docs[outside], docs_after[outside])
    runs = np.empty((w1 - w0 + 1, 2), dtype=np.int64)
    n_runs, n_recut = split_trades._recut_runs(off, p, q, w0, w1, tok[q] - tok[p], seq_len, runs)
    assert n_recut == plain_recut_count(off, p, q, w0, w1, tok[q] - tok[p], seq_len)
    stretch = w1 - w0 + 1
    d_tokens, d_docs = np.zeros((stretch, n_clusters), np.int64), np.zeros((stretch, n_clusters), np.int64)
    seen, touched = np.zeros((stretch, n_clusters), bool), np.empty((stretch * n_clusters, 2), np.int64)
    n_touched = split_trades._trade(d_tokens, d_docs, seen, touched, lab, tok, off, p, q, runs, n_runs, seq_len, w0, w1)
    assert np.array_equal(tokens[w0:w1 + 1] + d_tokens, tokens_after[w0:w1 + 1])
    assert np.array_equal(docs[w0:w1 + 1] + d_docs, docs_after[w0:w1 + 1])
    # every changed entry listed once (and only those: the rest of the changes are zero)
    listed = {tuple(pair) for pair in touched[:n_touched].tolist()}
    assert len(listed) == n_touched and listed == {(i, c) for i, c in zip(*np.nonzero(seen))}
    assert all(listed.__contains__((i, c)) for i, c in zip(*np.nonzero(d_tokens | d_docs)))
    gained = split_trades._gained(docs, d_docs, touched, n_touched, w0, 0, -1)
    assert gained == int((docs_after[w0:w1 + 1] > 0).sum() - (docs[w0:w1 + 1] > 0).sum())
    shares = diversity.global_token_shares(labels, counts, n_clusters)
    for i in range(stretch):
        after = split_trades._row_deviation_after(tokens, w0 + i, d_tokens, i, seq_len, shares)
        assert after == split_trades._row_deviation(tokens_after, w0 + i, seq_len, shares)
    split_trades._clear(d_tokens, d_docs, seen, touched, n_touched)
    assert not d_tokens.any() and not d_docs.any() and not seen.any()
    band_tokens = np.zeros((split_trades.BAND, n_clusters), dtype=np.int64)
    band_docs = np.zeros_like(band_tokens)
    scan = 0
    for w in range(n_windows):
        scan = split_trades._load(w, lab, tok, off, seq_len, band_tokens, band_docs, scan)
        row = w & (split_trades.BAND - 1)
        assert np.array_equal(band_tokens[row], tokens[w]) and np.array_equal(band_docs[row], docs[w])


@settings(max_examples=300, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1), st.booleans())
def test_split_trades_keep_clusters_head_and_tail_and_never_raise_deviation(corpus, seed, from_paced):
    labels, counts, n_clusters, seq_len = corpus
    order, _, after = traded(corpus, seed, from_paced, min_chunk_windows=2)
    assert sorted(after.tolist()) == sorted(order.tolist())
    unique = [diversity.window_counts(labels, counts, seq_len, o, "split")[0].sum() for o in (order, after)]
    assert unique[1] >= unique[0]
    deviation = [diversity.window_share_deviation(labels, counts, seq_len, o, n_clusters, "split").sum()
                 for o in (order, after)]
    assert deviation[1] <= deviation[0] + 1e-9
    shift = [diversity.boundary_shift(labels, counts, o, n_clusters) for o in (order, after)]
    assert shift[1] == shift[0]


def test_split_trades_mix_one_cluster_windows():
    """Windows of two documents of one cluster each (A A | B B | A A | ...) become mixed: every trade that
    takes one document across the cut between such a pair lowers both windows' deviation from 1/2."""
    labels = np.tile([0, 0, 1, 1], 200)
    counts = np.full(labels.size, 5)
    shares = diversity.global_token_shares(labels, counts, 2)
    order = np.arange(labels.size)
    before = diversity.window_share_deviation(labels, counts, 10, order, 2, "split")
    mixed = split_trades.split_trade_pass(order, labels, counts, 10, shares, 0)
    after = diversity.window_share_deviation(labels, counts, 10, mixed, 2, "split")
    assert before.mean() == 0.5
    assert after.mean() < 0.25


def test_paced_runs_rule_8_last_and_paced_polished_a_second_sweep():
    from diversity_order.orderings import paced as paced_module
    from diversity_order.orderings.exchange import exchange_pass
    from diversity_order.orderings.recut import recut_pass
    from diversity_order.packing import SPLIT

    rng = np.random.default_rng(4)
    labels = rng.integers(0, 6, 3000)
    counts = rng.integers(0, 900, 3000)
    options = OrderingOptions(seq_len=1024, packing="split", seed=9)
    shares = diversity.global_token_shares(labels, counts, 6)
    greedy = paced_module.paced_greedy_order(labels, counts, 6, options)
    before = recut_pass(exchange_pass(greedy, labels, counts, 1024, shares, SPLIT, 9), labels, counts, 1024, shares)
    paced = ORDERINGS["paced"](labels, counts, 6, options)
    assert np.array_equal(paced, split_trades.split_trade_pass(before, labels, counts, 1024, shares, 9))
    assert not np.array_equal(paced, before)
    polished = ORDERINGS["paced-polished"](labels, counts, 6, options)
    assert np.array_equal(polished, split_trades.split_trade_pass(paced, labels, counts, 1024, shares, 10))


def test_rule_8_gives_the_same_order_on_any_number_of_cores():
    """Runs of windows are swept at once; each has its own generator and keeps its trades, so one thread
    and every thread give the same order (here with many runs of 64 windows)."""
    import numba

    rng = np.random.default_rng(8)
    labels = rng.integers(0, 7, 20_000)
    counts = rng.integers(0, 400, 20_000)
    shares = diversity.global_token_shares(labels, counts, 7)
    order = rng.permutation(labels.size)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        alone = split_trades.split_trade_pass(order, labels, counts, 256, shares, 3)
    finally:
        numba.set_num_threads(threads)
    together = split_trades.split_trade_pass(order, labels, counts, 256, shares, 3)
    assert np.array_equal(alone, together)
    n_windows = -(-int(counts.sum()) // 256)
    assert split_trades.chunk_bounds(n_windows, split_trades.CHUNKS, split_trades.MIN_CHUNK_WINDOWS).size > 2
    assert not np.array_equal(together, order)
