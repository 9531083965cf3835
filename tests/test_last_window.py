"""Rule 9 of ``paced`` (diversity_order/orderings/last_window.py), documents packed whole: against a plain
loop written from its rules, its guarantees on random orders (hypothesis: zero-token documents, documents
longer than a window, clusters without documents), and hand-worked cases.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order import diversity
from diversity_order.orderings import OrderingOptions, last_window, paced


def plain_windows(tok, seq_len):
    """Documents packed whole, windows numbered as they open: [tokens, positions with a piece in it]."""
    windows = [[0, []]]
    for p, t in enumerate(tok):
        if windows[-1][0] + t <= seq_len:
            windows[-1][0] += t
            windows[-1][1].append(p)
            continue
        windows.append([min(t, seq_len), [p]])  # it does not fit: it opens the next window
        rest = t - min(t, seq_len)
        while rest > 0:  # a document longer than a window fills windows alone, its remainder opens the next
            windows.append([min(rest, seq_len), [p]])
            rest -= min(rest, seq_len)
        if t >= seq_len and t % seq_len == 0:
            windows.append([0, []])
    return windows


def plain_mend(order, labels, counts, seq_len, n_clusters, scan):
    order = list(order)
    tok = [int(counts[d]) for d in order]
    lab = [int(labels[d]) for d in order]
    n = len(order)
    windows = plain_windows(tok, seq_len)
    with_tokens = [w for w, (fill, _) in enumerate(windows) if fill > 0]
    if len(with_tokens) < 2:
        return order
    end = with_tokens[-1]
    lowest = max(0, end - scan)
    nearest_first = range(end - 1, lowest - 1, -1)
    unique = {w: len({lab[p] for p in windows[w][1]}) for w in with_tokens}
    shift = diversity.boundary_shift(labels, counts, np.array(order), n_clusters)

    def keeps_the_boundary(new_order):
        new_shift = diversity.boundary_shift(labels, counts, np.array(new_order), n_clusters)
        return new_shift <= shift + last_window.BOUNDARY_SLACK
    start = windows[end][1][0]
    # 1. Empty the last window into the room of the windows before it, if all of it fits.
    if sum(tok[start:]) == windows[end][0] and max(tok[start:]) <= seq_len:
        room = {w: seq_len - windows[w][0] for w in range(len(windows))}
        movers = sorted(range(start, n), key=lambda p: (-tok[p], p))
        after, gained = {}, 0
        for w in nearest_first:  # windows lacking the document's cluster
            if windows[w][0] == 0 or room[w] == 0:
                continue
            present = {lab[p] for p in windows[w][1]}
            for p in movers:
                if p not in after and tok[p] <= room[w] and lab[p] not in present:
                    after[p], gained = windows[w][1][-1], gained + 1
                    room[w] -= tok[p]
                    present.add(lab[p])
        for p in movers:  # then any window with room
            for w in nearest_first:
                if p not in after and windows[w][0] > 0 and 0 < room[w] and tok[p] <= room[w]:
                    after[p] = windows[w][1][-1]
                    room[w] -= tok[p]
        rest = sum(unique.values()) - unique[end]
        if len(after) == n - start and (rest + gained) / (len(with_tokens) - 1) >= (rest + unique[end]) / len(with_tokens):
            out = []
            for p in range(start):
                out.append(order[p])
                out += [order[q] for q in range(start, n) if after[q] == p]
            if keeps_the_boundary(out):
                return out
    # 2. Pull the clusters the last window lacks into it, from windows that keep their cut and the cluster.
    room = seq_len - windows[end][0]
    present = {lab[p] for p in windows[end][1]}
    fill = [f for f, _ in windows]
    pulled = []
    for w in nearest_first:
        positions = windows[w][1]
        if fill[w] == 0 or room == 0 or len(positions) == 1:
            continue
        in_window = Counter(lab[p] for p in positions)
        opener = tok[positions[-1] + 1]
        for p in reversed(positions[1:]):
            k, t = lab[p], tok[p]
            if k not in present and in_window[k] >= 2 and t <= room and fill[w] - t + opener > seq_len and t < fill[w]:
                present.add(k)
                in_window[k] -= 1
                fill[w] -= t
                room -= t
                pulled.append(p)
    out = [order[p] for p in range(n) if p not in pulled] + [order[p] for p in pulled]
    return out if keeps_the_boundary(out) else order


@st.composite
def corpora(draw, max_docs=60):
    n_clusters = draw(st.integers(1, 6))
    seq_len = draw(st.integers(2, 16))
    n = draw(st.integers(0, max_docs))
    labels = draw(st.lists(st.integers(0, n_clusters - 1), min_size=n, max_size=n))
    # exactly a window or two close the window they fill (a document without tokens after one opens the next)
    length = st.one_of(st.just(0), st.integers(1, max(seq_len // 4, 1)), st.integers(1, seq_len),
                       st.integers(seq_len, 3 * seq_len), st.sampled_from([seq_len, 2 * seq_len]))
    counts = draw(st.lists(length, min_size=n, max_size=n))
    return np.asarray(labels, dtype=np.int64), np.asarray(counts, dtype=np.int64), n_clusters, seq_len


@settings(max_examples=400, deadline=None)
@given(corpora(), st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3, last_window.SCAN_WINDOWS]))
def test_mend_matches_plain_loop(corpus, seed, scan):
    labels, counts, n_clusters, seq_len = corpus
    order = np.random.default_rng(seed).permutation(labels.size)
    got = last_window.mend_last_window(order, labels, counts, seq_len, n_clusters, scan)
    assert got.tolist() == plain_mend(order.tolist(), labels, counts, seq_len, n_clusters, scan)


def openers(labels, counts, seq_len, order):
    """The document opening each window with tokens (packed whole)."""
    tok = counts[order]
    return [order[w[1][0]] for w in plain_windows(tok.tolist(), seq_len) if w[0] > 0]


@settings(max_examples=400, deadline=None)
@given(corpora(max_docs=120), st.integers(0, 2**32 - 1))
def test_mend_keeps_the_cuts_and_the_boundary_and_never_lowers_the_mean(corpus, seed):
    labels, counts, n_clusters, seq_len = corpus
    order = np.random.default_rng(seed).permutation(labels.size)
    got = last_window.mend_last_window(order, labels, counts, seq_len, n_clusters)
    assert got.dtype == np.int64 and sorted(got.tolist()) == list(range(labels.size))
    before, after = (diversity.window_counts(labels, counts, seq_len, o, "whole")[0] for o in (order, got))
    assert after.mean() >= before.mean() - 1e-12
    # every window but the last opens with the same document: no window was cut anywhere else
    was, now = openers(labels, counts, seq_len, order), openers(labels, counts, seq_len, got)
    assert now in (was, was[:-1])
    shifts = [diversity.boundary_shift(labels, counts, o, n_clusters) for o in (order, got)]
    assert shifts[1] <= shifts[0] + last_window.BOUNDARY_SLACK
    # the last window is emptied whole, or keeps its documents and gains clusters
    if now == was and got.tolist() != order.tolist():
        assert after[-1] > before[-1] and (after[:-1] == before[:-1]).all()


def test_a_last_window_of_one_document_goes_into_the_room_before_it():
    # L = 12: [A5 B4] (room 3; C6 does not fit), [C6 A4] (room 2; D3 does not fit), [D3]. D3 goes to the
    # nearest window lacking its cluster with room for it: the first. Mean clusters 5/3 -> 5/2.
    labels = np.array([0, 1, 2, 0, 3])
    counts = np.array([5, 4, 6, 4, 3])
    got = last_window.mend_last_window(np.arange(5), labels, counts, 12, 4)
    assert got.tolist() == [0, 1, 4, 2, 3]
    assert diversity.window_counts(labels, counts, 12, got, "whole")[0].tolist() == [3, 2]


def test_a_last_window_too_large_to_empty_gains_the_clusters_it_lacks():
    # L = 10: [C2 B1 B1 C1 A1 A1] (7 tokens; A6 does not fit), [A6 A2] (room 2). The last window cannot go
    # into 3 tokens of room; it lacks B and C. From the end of the first window: the A's are in the last
    # window already; C1 goes (a C is left; 6 + 6 > 10: A6 still does not fit), then B1 (5 + 6 > 10); the
    # room is used up. The first tokens are C's and the last were A's, now B's: the boundary shift stays 1.
    labels = np.array([2, 1, 1, 2, 0, 0, 0, 0])
    counts = np.array([2, 1, 1, 1, 1, 1, 6, 2])
    got = last_window.mend_last_window(np.arange(8), labels, counts, 10, 3)
    assert got.tolist() == [0, 1, 4, 5, 6, 7, 3, 2]
    assert diversity.window_counts(labels, counts, 10, got, "whole")[0].tolist() == [3, 3]


def test_a_document_without_tokens_does_not_go_after_a_window_that_closed_full():
    # L = 6, clusters A B C D = 0 1 2 3: [A0 D2] (D6 does not fit), [D6] (full: it closes), [C1 A1 D0].
    # The last window's documents go into the first window's room: C1 (lacking there), then A1 and D0.
    # D0 has no tokens; after the full D6 it would open a window of its own (found by review: three
    # windows again, the mean 2 -> 5/3). Now: [A0 D2 C1 A1 D0], [D6].
    labels = np.array([3, 0, 0, 2, 3, 3])
    counts = np.array([0, 0, 1, 1, 2, 6])
    order = np.array([1, 4, 5, 3, 2, 0])
    got = last_window.mend_last_window(order, labels, counts, 6, 4)
    assert got.tolist() == [1, 4, 3, 2, 0, 5]
    assert diversity.window_counts(labels, counts, 6, got, "whole")[0].tolist() == [3, 1]
    assert got.tolist() == plain_mend(order.tolist(), labels, counts, 6, 4, last_window.SCAN_WINDOWS)


def test_a_mend_that_would_shift_the_boundary_is_not_made():
    # As above with the first document an A: the first and the last tokens were A's, and B's would end
    # the order (the shift from 0 to 1).
    labels = np.array([0, 1, 1, 2, 2, 0, 0, 0])
    counts = np.array([2, 1, 1, 1, 1, 1, 6, 2])
    assert last_window.mend_last_window(np.arange(8), labels, counts, 10, 3).tolist() == list(range(8))


def test_paced_mends_the_last_window_when_whole():
    # 2,000 short documents of 30 clusters: windows of 4,096 tokens hold more documents than there are
    # clusters (rule 7 does not apply), and the last window holds what is left.
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 30, 2000)
    counts = rng.integers(1, 120, 2000)
    options = OrderingOptions(seq_len=4096, packing="whole", seed=5)
    shares = diversity.global_token_shares(labels, counts, 30)
    before = paced._rules_1_to_5(labels, counts, 30, options, shares, 0)
    want = last_window.mend_last_window(before, labels, counts, 4096, 30)
    assert want.tolist() != before.tolist()
    assert paced.paced_order(labels, counts, 30, options).tolist() == want.tolist()
