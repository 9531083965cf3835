"""Rule 7 of ``paced`` (diversity_order/orderings/grouping.py): large documents grouped into shared windows,
packing whole, against plain loops written from the rule: the groups (least room that holds the document
and lacks its cluster, first come first served among equal rooms, at most MAX_CHECKED looked at), their
keys (slots dealt as a pool's long documents), their placing among the other documents' windows (opening a window, never in the
first or last BOUNDARY_FRACTION of tokens), and paced's use of them (only where the windows keep
stratified's clusters per window); on random inputs from hypothesis
with zero-token documents and documents longer than a window; plus a hand-worked case.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import plain_deal_long
from diversity_order import diversity
from diversity_order.orderings import ORDERINGS, OrderingOptions, grouping, last_window, paced


def plain_groups(labels, counts, seq_len):
    """Step 1 as written: each document of a window or more with a remainder of LARGE_FRACTION of a window
    or more, largest remainder first (ties by position), opens a group with the rest of that window as
    room; then each large document, longest first (ties by position), goes into the group with the least
    room that holds it and lacks its cluster (among equal rooms the one that got its room first), looking
    at MAX_CHECKED groups at most; else a new group."""
    leaders = [i for i in range(len(counts))
               if counts[i] >= seq_len and (counts[i] % seq_len) * 1.0 >= grouping.LARGE_FRACTION * seq_len]
    leaders.sort(key=lambda i: (-(counts[i] % seq_len), i))
    large = [i for i in range(len(counts))
             if counts[i] * 1.0 >= grouping.LARGE_FRACTION * seq_len and counts[i] < seq_len]
    large.sort(key=lambda i: (-counts[i], i))
    max_members = int(1 // grouping.LARGE_FRACTION) + 1
    groups, clock = [], 0
    for d in leaders:
        clock += 1
        groups.append({"members": [d], "room": seq_len - counts[d] % seq_len, "since": clock})
    for d in large:
        open_ = [g for g in groups if g["room"] >= counts[d] and len(g["members"]) < max_members]
        open_.sort(key=lambda g: (g["room"], g["since"]))
        chosen = next((g for g in open_[:grouping.MAX_CHECKED]
                       if all(labels[m] != labels[d] for m in g["members"])), None)
        if chosen is None:
            chosen = {"members": [], "room": seq_len}
            groups.append(chosen)
        chosen["members"].append(d)
        chosen["room"] -= counts[d]
        clock += 1
        chosen["since"] = clock
    return [g["members"] for g in groups]


def plain_keys(labels, counts, groups, seed):
    """Each group's first document's slot (j + 1/2) / n among its cluster's grouped documents, taken in a
    seeded shuffle (the grouped documents, in group order, permuted by the seed's permutation) and dealt
    as ``plain_deal_long`` deals them."""
    key = {}
    grouped = [d for g in groups for d in g]
    shuffled = [grouped[i] for i in np.random.default_rng(seed).permutation(len(grouped))]
    for c in set(labels[d] for d in grouped):
        deck = plain_deal_long([d for d in shuffled if labels[d] == c], counts)
        for j, d in enumerate(deck):
            key[d] = (j + 0.5) / len(deck)
    return [key[g[0]] for g in groups]


def plain_fill(fill, t, seq_len):
    """Whole packing (packing.py): (whether the document opens a window, the open window's tokens after it)."""
    if fill + t <= seq_len:
        return fill == 0, fill + t
    head = min(t, seq_len)
    tail = (t - head) % seq_len
    return True, tail if tail > 0 else (0 if head == seq_len else head)


def plain_place(rest_order, counts, groups, keys, seq_len, total, fraction=diversity.BOUNDARY_FRACTION):
    """Step 3 as written: window starts of the other documents with fraction of all tokens before and after
    them; group j (by key) aims at start lo + floor((j + 1/2)(hi - lo + 1) / n) and goes before the first
    rest document from there on where it opens a window, at the last such start at the latest."""
    starts, before, fill, placed = [], [], 0, 0
    for p, d in enumerate(rest_order):
        opens, fill = plain_fill(fill, counts[d], seq_len)
        if opens or p == 0:
            starts.append(p)
            before.append(placed)
        placed += counts[d]
    rest_tokens = placed
    ok = [i for i in range(len(starts))
          if before[i] >= fraction * total and rest_tokens - before[i] >= fraction * total]
    if not ok:
        return None
    lo, hi = ok[0], ok[-1]
    by_key = sorted(range(len(groups)), key=lambda g: (keys[g], g))
    targets = [starts[lo + int((j + 0.5) * (hi - lo + 1) / len(groups))] for j in range(len(groups))]
    out, fill, j = [], 0, 0
    for p in range(len(rest_order) + 1):
        while j < len(groups) and targets[j] <= p:
            first = counts[groups[by_key[j]][0]]
            if not (fill == 0 or fill + first > seq_len or p >= starts[hi]):
                break
            for d in groups[by_key[j]]:
                out.append(d)
                fill = plain_fill(fill, counts[d], seq_len)[1]
            j += 1
        if p < len(rest_order):
            out.append(rest_order[p])
            fill = plain_fill(fill, counts[rest_order[p]], seq_len)[1]
    return out


@st.composite
def corpora(draw, max_docs=80):
    n_clusters = draw(st.integers(1, 6))
    seq_len = draw(st.integers(5, 40))
    n = draw(st.integers(0, max_docs))
    labels = draw(st.lists(st.integers(0, n_clusters - 1), min_size=n, max_size=n))
    length = st.one_of(st.just(0), st.integers(1, max(seq_len // 5, 1)), st.integers(seq_len // 5, seq_len - 1),
                       st.integers(seq_len, 2 * seq_len + 3))
    counts = draw(st.lists(length, min_size=n, max_size=n))
    return np.asarray(labels, dtype=np.int64), np.asarray(counts, dtype=np.int64), n_clusters, seq_len


@settings(max_examples=300, deadline=None)
@given(corpora(max_docs=200), st.integers(0, 2**32 - 1))
def test_groups_and_keys_match_plain_loops(corpus, seed):
    labels, counts, _, seq_len = corpus
    groups = grouping.group_large(labels, counts, seq_len)
    got = [row[row >= 0].tolist() for row in groups]
    assert got == plain_groups(labels.tolist(), counts.tolist(), seq_len)
    for g in got:  # a group fits one window (a leader with its remainder) and holds one document per cluster
        assert (counts[g] % seq_len).sum() <= seq_len and len(set(labels[g].tolist())) == len(g)
        assert all(t < seq_len for t in counts[g[1:]])  # only the first may be longer than a window
    if got:
        assert grouping.group_keys(labels, counts, groups, seed).tolist() == plain_keys(
            labels.tolist(), counts.tolist(), got, seed)
    # every leader and every large document lands in a group, which rule 7 decides from before grouping
    in_groups = np.zeros(labels.size, dtype=bool)
    in_groups[groups[groups >= 0]] = True
    assert np.array_equal(grouping.grouped_documents(counts, seq_len), in_groups)


def test_a_document_looks_at_max_checked_groups_at_most():
    # 100 large documents of cluster 0 and one of cluster 1 (60 tokens each) open a group each, room 40;
    # a 30-token document of cluster 0 looks at the first MAX_CHECKED of them (all of its cluster) and opens
    # its own group rather than reaching the cluster-1 group, the 101st.
    labels = np.array([0] * 100 + [1, 0], dtype=np.int64)
    counts = np.array([60] * 101 + [30], dtype=np.int64)
    assert grouping.MAX_CHECKED < 101
    got = [row[row >= 0].tolist() for row in grouping.group_large(labels, counts, 100)]
    assert len(got) == 102 and got[-1] == [101]
    assert got == plain_groups(labels.tolist(), counts.tolist(), 100)
    labels[50] = 1  # now one of the first MAX_CHECKED lacks cluster 0: the document joins it
    got = [row[row >= 0].tolist() for row in grouping.group_large(labels, counts, 100)]
    assert len(got) == 101 and got[50] == [50, 101]
    assert got == plain_groups(labels.tolist(), counts.tolist(), 100)


@settings(max_examples=300, deadline=None)
@given(corpora(max_docs=150), st.integers(0, 2**32 - 1))
def test_placing_matches_plain_loop(corpus, seed):
    labels, counts, _, seq_len = corpus
    groups = grouping.group_large(labels, counts, seq_len)
    if len(groups) == 0:
        return
    large = set(groups[groups >= 0].tolist())
    rest = np.array([i for i in np.random.default_rng(seed).permutation(labels.size) if i not in large],
                    dtype=np.int64)
    keys = grouping.group_keys(labels, counts, groups, seed)
    total = int(counts.sum())
    got = grouping.place_groups(rest, counts, groups, keys, seq_len, total)
    lists = [row[row >= 0].tolist() for row in groups]
    want = plain_place(rest.tolist(), counts.tolist(), lists, keys.tolist(), seq_len, total)
    assert (got is None) == (want is None)
    if got is None:
        return
    assert got.tolist() == want
    assert sorted(got.tolist()) == list(range(labels.size))
    # the first and last BOUNDARY_FRACTION of tokens hold no large document
    ends = np.cumsum(counts[got])
    starts = ends - counts[got]
    is_large = np.isin(got, list(large))
    assert not (is_large & (starts < diversity.BOUNDARY_FRACTION * total)).any()
    assert not (is_large & (ends > (1 - diversity.BOUNDARY_FRACTION) * total)).any()


@settings(max_examples=200, deadline=None)
@given(corpora(max_docs=150), st.integers(0, 2**16))
def test_paced_groups_large_documents_only_where_rule_7_applies(corpus, seed):
    labels, counts, n_clusters, seq_len = corpus
    options = OrderingOptions(seq_len=seq_len, packing="whole", seed=seed)
    got = paced._rules_1_to_9(labels, counts, n_clusters, options, clear_ends=False)  # rule 10: test_paced.py
    assert sorted(got.tolist()) == list(range(labels.size))
    shares = diversity.global_token_shares(labels, counts, n_clusters)
    total = int(counts.sum())
    groups = grouping.group_large(labels, counts, seq_len)
    large = groups[groups >= 0]
    rest = np.setdiff1d(np.arange(labels.size), large)
    want = None
    if (not paced.windows_saturated(labels.size, seq_len, n_clusters, total) and large.size >= 2
            and not paced.windows_saturated(rest.size, seq_len, n_clusters, total - int(counts[large].sum()))):
        rest_order = rest[paced._rules_1_to_5(labels[rest], counts[rest], n_clusters, options, shares, 0)]
        want = grouping.place_groups(rest_order, counts, groups, grouping.group_keys(labels, counts, groups, seed),
                                     seq_len, total)
    if want is not None:  # None: no window start with the head and the tail of the order either side
        want = last_window.mend_last_window(want, labels, counts, seq_len, n_clusters)  # then rule 9
        # kept only while its windows hold as many clusters as stratified's, within the D margin
        stratified = ORDERINGS["stratified"](labels, counts, n_clusters, options)
        mean_unique = [diversity.window_counts(labels, counts, seq_len, o, "whole")[0].mean() for o in (want, stratified)]
        if mean_unique[0] < mean_unique[1] - diversity.DIVERSITY_MARGIN:
            want = None
    if want is None:
        want = last_window.mend_last_window(paced._rules_1_to_5(labels, counts, n_clusters, options, shares, 0),
                                            labels, counts, seq_len, n_clusters)
    assert got.tolist() == want.tolist()
    # packing split, rule 7 never applies
    split = OrderingOptions(seq_len=seq_len, packing="split", seed=seed)
    assert paced.paced_order(labels, counts, n_clusters, split).tolist() == paced.paced_order(
        labels, counts, n_clusters, split).tolist()


def test_hand_worked_large_documents_share_windows():
    """Windows of 100 tokens, 8 clusters, windows of fewer documents than that (rule 7 applies). Large
    documents (>= 15 tokens): 60, 35, 50 and 45 tokens of clusters 0, 1, 2 and 3; twelve small ones of
    14 tokens, of clusters 0-7. Longest first: 60 opens a group (room 40), 50 opens one (room 50), 45
    takes the least room that holds it (50), 35 the other (40): groups {60, 35} and {50, 45}, each opening
    a window of its own."""
    labels = np.array([0, 1, 2, 3] + [k % 8 for k in range(12)], dtype=np.int64)
    counts = np.array([60, 35, 50, 45] + [14] * 12, dtype=np.int64)
    assert grouping.LARGE_FRACTION * 100 <= 35 and 14 < grouping.LARGE_FRACTION * 100
    groups = grouping.group_large(labels, counts, 100)
    assert [row[row >= 0].tolist() for row in groups] == [[0, 1], [2, 3]]
    options = OrderingOptions(seq_len=100, packing="whole", seed=1)
    order = paced.paced_order(labels, counts, 8, options)
    position = {d: p for p, d in enumerate(order.tolist())}
    assert position[1] == position[0] + 1 and position[3] == position[2] + 1
    starts = set(grouping._window_starts(counts[order], 100)[0].tolist())
    assert position[0] in starts and position[2] in starts
    # rule 7 lowers the mean uniformity against rules 1-5 alone: two windows each set by one large document
    shares = diversity.global_token_shares(labels, counts, 8)
    plain = paced._rules_1_to_5(labels, counts, 8, options, shares, 0)
    u = [diversity.window_share_deviation(labels, counts, 100, o, 8).mean() for o in (order, plain)]
    assert u[0] < u[1]


def test_hand_worked_a_long_document_leads_a_group():
    """Windows of 100 tokens, 8 clusters. A document of 230 tokens (cluster 0) fills two windows alone and
    its last 30 open a third: it leads a group with 70 tokens of room, which the 60-token document of
    cluster 1 takes (the least room that holds it); the 50-token one of cluster 2 opens its own group. In
    the order the 60 follows the 230 at once, so the window after the 230's two holds both."""
    labels = np.array([0, 1, 2] + [k % 8 for k in range(20)], dtype=np.int64)
    counts = np.array([230, 60, 50] + [12] * 20, dtype=np.int64)
    groups = grouping.group_large(labels, counts, 100)
    assert [row[row >= 0].tolist() for row in groups] == [[0, 1], [2]]
    order = paced.paced_order(labels, counts, 8, OrderingOptions(seq_len=100, packing="whole", seed=3)).tolist()
    assert order.index(1) == order.index(0) + 1
    fill = 0
    for d in order[:order.index(0) + 1]:  # packed whole: the 230 leaves its last 30 in an open window...
        opens, fill = plain_fill(fill, counts[d], 100)
    assert opens and fill == 30
    assert plain_fill(fill, 60, 100) == (False, 90)  # ...which the 60 joins


def test_rule_7_is_dropped_where_it_would_lose_stratifieds_clusters_per_window():
    """A small corpus (2,000 documents) of Zipf-sized clusters and log-normal lengths up to 35% of a window,
    as a chat fine-tuning set: grouping the large documents two or three to a window leaves those windows
    few clusters. paced then keeps rules 1-5's order, whose windows hold more."""
    rng = np.random.default_rng(0)
    n, k, seq_len = 2000, 30, 2048
    sizes = rng.zipf(1.6, k).astype(np.float64)
    labels = rng.choice(k, n, p=sizes / sizes.sum()).astype(np.int64)
    counts = np.minimum(rng.lognormal(4.2, 0.9, n), 720).astype(np.int64) + 5
    options = OrderingOptions(seq_len=seq_len, packing="whole", seed=42)
    shares = diversity.global_token_shares(labels, counts, k)
    grouped = paced._with_large_grouped(labels, counts, k, options, shares, int(counts.sum()))
    assert grouped is not None  # rule 7 applies here...
    grouped = last_window.mend_last_window(grouped, labels, counts, seq_len, k)
    unique = lambda order: diversity.window_counts(labels, counts, seq_len, order, "whole")[0].mean()  # noqa: E731
    stratified = ORDERINGS["stratified"](labels, counts, k, options)
    assert unique(grouped) < unique(stratified) - diversity.DIVERSITY_MARGIN  # ...and would lose D
    got = paced.paced_order(labels, counts, k, options)
    assert got.tolist() == last_window.mend_last_window(paced._rules_1_to_5(labels, counts, k, options, shares, 0),
                                                        labels, counts, seq_len, k).tolist()
    assert unique(got) >= unique(stratified) - diversity.DIVERSITY_MARGIN
