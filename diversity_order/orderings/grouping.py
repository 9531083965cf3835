"""Rule 7 of ``paced`` (documents whole, windows of fewer documents than there are clusters): large
documents share windows with large documents.

A window's token-share deviation is at least its largest document's share of the window minus that
cluster's share of all tokens, and that largest document is usually a large one: spread one per
window, the large documents set the deviation of most windows. Put together, two or three of them
(of different clusters) set it in one window, and the windows left to the other documents are
uniform. So, when documents are packed whole and windows hold fewer documents than there are
clusters (N L < K T), for all documents and for the others once the large ones are out (where the
others' windows are full of clusters already, taking the large documents out of them costs clusters):

1. A document of a window or more whose remainder (its tokens mod the window, which open the window
   after those it fills alone) is at least ``LARGE_FRACTION`` of a window *leads* a group of its own,
   with the rest of that window as room (in decreasing remainder, ties by input position). Documents of
   at least ``LARGE_FRACTION`` of a window (and shorter than one) are *large*. In
   decreasing length (ties by input position), each goes into the open group with the least room
   that holds it and has no document of its cluster (among equal rooms, the group that reached that
   room first; at most ``MAX_CHECKED`` groups looked at), else opens a group. A group holds at most
   a window (its leader's remainder counted), its leader or largest document first.
2. The other documents are ordered by rules 1-5 (``paced``'s greedy and trades).
3. The groups go between those documents' windows, evenly by count, in the order of their first
   document's slot among its cluster's grouped documents, seeded-shuffled and dealt as rule 1 deals long
   ones (the shortest at both ends while they hold a fifth of the tokens, the others anywhere between, so
   large documents come all through an epoch); each at the first window start from its aimed one on where its
   first document does not fit in the open window (a leader never does), so the group opens a window (the documents after
   it fill the room it leaves); and only where at least ``BOUNDARY_FRACTION`` of all tokens lie before
   and after them, so the head and the tail of the order, which meet at the epoch boundary, hold the
   other documents alone.

Without room for that (the other documents hold under twice ``BOUNDARY_FRACTION`` of the tokens)
or with fewer than two grouped documents, ``paced`` is rules 1-5 alone. O(N log L) for the groups.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..diversity import BOUNDARY_FRACTION
from ..packing import WHOLE, advance, place
from .pools import cluster_pools, deal_long, order_by

# A document of at least this share of a window is large (set on the tuning corpora among 0.1-0.3;
# BENCHMARKS.md, "Rule 7").
LARGE_FRACTION = 0.15
# A large document looks at most this many groups (least room first) for one without its cluster, so a
# cluster holding most large documents cannot make the grouping quadratic.
MAX_CHECKED = 64


@njit(cache=True, nogil=True)
def _tree_add(tree, top, room, delta):
    node = top + room
    while node >= 1:
        tree[node] += delta
        node //= 2


@njit(cache=True, nogil=True)
def _first_at_least(tree, top, room):
    """The least room >= ``room`` some group has (-1 if none), by the segment tree of group counts per room."""
    if room >= top:
        return -1
    node = top + room
    if tree[node] > 0:
        return room
    while node > 1:
        if node % 2 == 0 and tree[node + 1] > 0:
            node += 1
            while node < top:
                node = 2 * node if tree[2 * node] > 0 else 2 * node + 1
            return node - top
        node //= 2
    return -1


@njit(cache=True, nogil=True, inline="always")
def _append_to_room(g, r, first, last, nxt, prv, tree, top):
    """Group g, now with ``r`` tokens of room, joins the end of that room's list."""
    nxt[g] = -1
    prv[g] = last[r]
    if last[r] >= 0:
        nxt[last[r]] = g
    else:
        first[r] = g
    last[r] = g
    _tree_add(tree, top, r, 1)


@njit(cache=True, nogil=True)
def _group(leaders, large, token_counts, labels, seq_len, max_members):
    """Step 1: ``leaders`` (in decreasing remainder) each open a group, then ``large`` (in decreasing length)
    join them or open their own; returns (members per group, -1 padded, in placing order)."""
    n = leaders.shape[0] + large.shape[0]
    members = np.full((n, max_members), -1, dtype=np.int64)
    size = np.zeros(n, dtype=np.int64)
    room = np.zeros(n, dtype=np.int64)
    top = 1
    while top < seq_len + 1:
        top *= 2
    tree = np.zeros(2 * top, dtype=np.int64)
    first = np.full(seq_len + 1, -1, dtype=np.int64)  # per room, a FIFO list of the groups with that room
    last = np.full(seq_len + 1, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    prv = np.full(n, -1, dtype=np.int64)
    n_groups = 0
    for d in leaders:  # its remainder opens the window after the ones it fills alone
        g = n_groups
        n_groups += 1
        members[g, 0] = d
        size[g] = 1
        room[g] = seq_len - token_counts[d] % seq_len
        _append_to_room(g, room[g], first, last, nxt, prv, tree, top)
    for d in large:
        t = token_counts[d]
        c = labels[d]
        chosen = -1
        r = _first_at_least(tree, top, t)
        checked = 0
        while r >= 0 and chosen < 0 and checked < MAX_CHECKED:
            g = first[r]
            while g >= 0 and checked < MAX_CHECKED:
                checked += 1
                clash = False
                for m in range(size[g]):
                    if labels[members[g, m]] == c:
                        clash = True
                        break
                if not clash:
                    chosen = g
                    break
                g = nxt[g]
            if chosen < 0:
                r = _first_at_least(tree, top, r + 1)
        if chosen >= 0:  # unlink it from its room's list
            g = chosen
            if prv[g] >= 0:
                nxt[prv[g]] = nxt[g]
            else:
                first[r] = nxt[g]
            if nxt[g] >= 0:
                prv[nxt[g]] = prv[g]
            else:
                last[r] = prv[g]
            _tree_add(tree, top, r, -1)
        else:
            g = n_groups
            n_groups += 1
            room[g] = seq_len
        members[g, size[g]] = d
        size[g] += 1
        room[g] -= t
        if room[g] > 0 and size[g] < max_members:
            _append_to_room(g, room[g], first, last, nxt, prv, tree, top)
    return members[:n_groups]


@njit(cache=True, nogil=True)
def _window_starts(token_counts, seq_len):
    """Positions of ``token_counts`` (an order, packed whole) where a window starts, and the tokens before each."""
    n = token_counts.shape[0]
    starts = np.empty(n, dtype=np.int64)
    before = np.empty(n, dtype=np.int64)
    stamp = np.zeros(1, dtype=np.int64)
    n_starts = 0
    window = 0
    fill = 0
    placed = 0
    for p in range(n):
        t = token_counts[p]
        if fill == 0 or place(fill, t, seq_len, WHOLE)[0]:
            starts[n_starts] = p
            before[n_starts] = placed
            n_starts += 1
        window, fill = advance(stamp, 0, t, window, fill, seq_len, WHOLE)
        placed += t
    return starts[:n_starts], before[:n_starts]


@njit(cache=True, nogil=True)
def _merge(rest_order, members, member_starts, targets, limit, token_counts, seq_len):
    """The rest of the order with the groups (``members[member_starts[j]:member_starts[j + 1]]``, in key
    order) put in: group j goes before the first rest position from ``targets[j]`` on where its largest
    document does not fit in the open window (so it opens one), and at ``limit`` at the latest."""
    n_rest = rest_order.shape[0]
    n_groups = targets.shape[0]
    out = np.empty(n_rest + members.shape[0], dtype=np.int64)
    stamp = np.zeros(1, dtype=np.int64)
    window = 0
    fill = 0
    n_out = 0
    j = 0
    for p in range(n_rest + 1):
        while j < n_groups and targets[j] <= p:
            first = token_counts[members[member_starts[j]]]
            if not (fill == 0 or fill + first > seq_len or p >= limit):
                break
            for m in range(member_starts[j], member_starts[j + 1]):
                d = members[m]
                out[n_out] = d
                n_out += 1
                window, fill = advance(stamp, 0, token_counts[d], window, fill, seq_len, WHOLE)
            j += 1
        if p < n_rest:
            d = rest_order[p]
            out[n_out] = d
            n_out += 1
            window, fill = advance(stamp, 0, token_counts[d], window, fill, seq_len, WHOLE)
    return out


def _is_large(counts: np.ndarray, seq_len: int) -> np.ndarray:
    return (counts * 1.0 >= LARGE_FRACTION * seq_len) & (counts < seq_len)


def _leads(counts: np.ndarray, seq_len: int) -> np.ndarray:
    return (counts >= seq_len) & ((counts % seq_len) * 1.0 >= LARGE_FRACTION * seq_len)


def grouped_documents(token_counts: np.ndarray, seq_len: int) -> np.ndarray:
    """Which documents step 1 puts in groups (every leader and every large document lands in one): a bool
    per document, so whether rule 7 applies is known before the groups are made."""
    counts = np.asarray(token_counts, dtype=np.int64)
    return _is_large(counts, seq_len) | _leads(counts, seq_len)


def large_documents(token_counts: np.ndarray, seq_len: int) -> np.ndarray:
    """Step 1's large documents, in the order they are placed: decreasing length, ties by input position."""
    counts = np.asarray(token_counts, dtype=np.int64)
    large = np.flatnonzero(_is_large(counts, seq_len))
    return order_by(large, seq_len - counts[large], np.zeros_like(large))


def leading_documents(token_counts: np.ndarray, seq_len: int) -> np.ndarray:
    """Step 1's leaders: documents of a window or more whose remainder (tokens mod the window) is at least
    ``LARGE_FRACTION`` of one, in decreasing remainder, ties by input position."""
    counts = np.asarray(token_counts, dtype=np.int64)
    leaders = np.flatnonzero(_leads(counts, seq_len))
    return order_by(leaders, seq_len - counts[leaders] % seq_len, np.zeros_like(leaders))


def group_large(labels: np.ndarray, token_counts: np.ndarray, seq_len: int) -> np.ndarray:
    """Step 1: the groups, one row each in placing order (its leader or largest document first), -1 padded."""
    counts = np.asarray(token_counts, dtype=np.int64)
    max_members = int(1 // LARGE_FRACTION) + 1
    return _group(leading_documents(counts, seq_len), large_documents(counts, seq_len), counts,
                  np.asarray(labels, dtype=np.int64), int(seq_len), max_members)


def group_keys(labels: np.ndarray, token_counts: np.ndarray, groups: np.ndarray, seed: int) -> np.ndarray:
    """Step 3's key of each group: its first document's slot (j + 1/2) / n among its cluster's n grouped
    documents, taken in a seeded shuffle and dealt as rule 1 deals a pool's long ones (``pools.deal_long``)."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    grouped = groups[groups >= 0]
    members, pool_starts = cluster_pools(labels[grouped], counts[grouped], int(labels.max(initial=0)) + 1,
                                         "random", seed)
    pools = grouped[members]
    # every pool's documents by length at once (ties by place in the pool): one sort, not one per pool
    by_length = order_by(np.arange(pools.size), labels[pools], counts[pools])
    key = np.zeros(labels.size, dtype=np.float64)
    _dealt_keys(pools, pool_starts, counts, by_length, key)
    return key[groups[:, 0]]


@njit(cache=True, nogil=True)
def _dealt_keys(pools, pool_starts, token_counts, by_length, key):
    """Each pool of ``pools`` dealt by ``deal_long`` (``by_length``: all pools' positions in length order,
    pool by pool), the slot j of n writing (j + 1/2) / n into ``key``."""
    for k in range(pool_starts.shape[0] - 1):
        lo, hi = pool_starts[k], pool_starts[k + 1]
        deck = np.empty(hi - lo, dtype=np.int64)
        deal_long(pools[lo:hi], token_counts, by_length[lo:hi] - lo, deck)
        for j in range(hi - lo):
            key[deck[j]] = (j + 0.5) / (hi - lo)


def place_groups(rest_order: np.ndarray, token_counts: np.ndarray, groups: np.ndarray, keys: np.ndarray,
                 seq_len: int, total_tokens: int, fraction: float = BOUNDARY_FRACTION) -> np.ndarray | None:
    """Step 3: ``rest_order`` (the other documents, ordered) with the groups between its windows; None when
    no window start has ``fraction`` of all tokens before and after it."""
    counts = np.asarray(token_counts, dtype=np.int64)
    rest_order = np.asarray(rest_order, dtype=np.int64)
    starts, before = _window_starts(counts[rest_order], int(seq_len))
    rest_tokens = int(counts[rest_order].sum())
    ok = np.flatnonzero((before >= fraction * total_tokens) & (rest_tokens - before >= fraction * total_tokens))
    if ok.size == 0:
        return None
    lo, hi = int(ok[0]), int(ok[-1])  # the starts in between qualify too (``before`` grows with the index)
    n_groups = groups.shape[0]
    by_key = np.argsort(keys, kind="stable")
    targets = starts[lo + ((np.arange(n_groups) + 0.5) * (hi - lo + 1) / n_groups).astype(np.int64)]
    ordered = groups[by_key]
    sizes = (ordered >= 0).sum(axis=1)
    member_starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    return _merge(rest_order, ordered[ordered >= 0], member_starts, targets, int(starts[hi]), counts, int(seq_len))
