"""``paced``: clusters paced by document count, each cluster's tokens paced inside its pool, windows
filled with the clusters they lack. Meant to keep stratified's clusters per window while holding token
shares steady and the head of the order like its tail (BENCHMARKS.md, "Ordering quality").

Eleven rules; no constant in rules 1-4 was fitted to a corpus (rules 5 and 8's effort bounds and rule 7's
large-document threshold were set on the tuning corpora; rule 6's uniformity allowance and rule 9's
boundary allowance on samples of held-out ones, BENCHMARKS.md "The last window"; rule 10's share and
allowances likewise, "Large documents off the ends"):

1. Pools track tokens (uniformity, boundary shift). Each cluster's documents, seeded-shuffled, are
   split at the cluster's mean length m into short (<= m) and long (> m) ones and interleaved by
   sigma-delta modulation, in two walks: one from the pool's first slot, one from its last, in turn in
   proportion to their shares of the slots, meeting at floor(n (2k + 1) / 2K) of a pool of n (cluster k
   of K, so the pools' meeting points spread over the order). Each walk's next document is its next long
   one when the walk is behind its token schedule (j documents should hold j * m tokens) by at least
   half of that document's excess over m, else its next short one. While both kinds are left, the first
   j documents from either end then hold j * m tokens to within half the largest excess above, and that
   plus m below: neither end of a pool runs long, and what the two ends leave lands where the walks meet
   (one walk from the start let a pool's last documents run long, and the tail of the order with them:
   on a chat corpus whose source files were a tenth of the first or last 5% of the tokens, the boundary
   shift). Each walk deals its shortest long documents first, until those at the two ends hold a fifth of
   the pool's long documents' tokens, then the others in shuffled order, so a document too long for its
   neighbours to balance stays away from the start and the end of the order, which meet at the epoch
   boundary, and long documents come all through the epoch (when every pool dealt its longest in the middle,
   52-72% of their tokens fell in the middle fifth of the order: a length curriculum).
2. Clusters are paced by document count (diversity). Slot j of a pool of n is keyed (j + 1/2) / n,
   the spacing stratified gives; merging the pools by key (ties to the lower cluster) gives each
   document a *due position*: the tokens merged before it.
3. Windows take the clusters they lack first (diversity). The order walks the trainer's windows
   with ``packing.py``'s rule. Packing whole, the next document is the earliest-due one of a
   cluster the open window lacks that fits and is due before the next window ends; else the
   earliest-due one that fits and is due before this window ends (the window is not closed early);
   else the earliest-due one.
4. Packing split, a long document straddles a window boundary near its middle (uniformity). Among
   the documents due within ``STRADDLE_HORIZON`` windows after the open one, the *straddler* is the
   one of largest excess t / L - T_k / T (t its tokens, T_k its cluster's, T all), of a cluster the
   window lacks if any (any cluster when windows hold more documents than there are clusters,
   N L >= K T). With h half its length (t < L), or half of L + (t mod L) (t >= L: starting there, it
   fills floor(t / L) - 1 windows alone, not floor(t / L)): if the room left is at most h it goes
   now; else the earliest-due document of a lacking cluster, due before the next window ends, that
   fits in the room minus h; else the straddler if the room is at most 1.5 h; else rule 3.
   Rules 3 and 4 walk from both ends (flat head-to-tail mix): the documents whose middle is due in
   the last BOUNDARY_FRACTION of tokens and two windows more are ordered from the end, due positions
   counted from it (packing split, its first window the real last one's room), and follow the others.
   Packing split, the walk from the start is cut into runs by due position (``GREEDY_RUNS``), each
   starting where the runs before it end, walked at once on every core.
5. Documents trade places between nearby windows where that lowers both windows' summed token-share
   deviation without moving any window's cut, losing clusters or touching the head and the tail of
   the order (uniformity; ``exchange.py``). Rules 1-4 work on document counts and token schedules,
   so they leave windows whose shares one trade steadies. Swept in runs of whole windows at once, one
   per core, to the same order on any number of cores.
6. Packing split, a document of a window or more that fills one window more alone than its length
   forces (rules 3 and 4 may start it anywhere when it is the earliest due) is re-cut near its middle
   by moving the documents next to it to its other side, where the windows it touches gain clusters
   (diversity; ``recut.py``).
7. Packing whole, where windows hold fewer documents than there are clusters (all documents, and the
   others once the large ones are out): documents of at least 15% of a window are grouped so that
   two or three share a window, a longer document whose last window part is that large leading a group
   (its remainder first), and the groups go among the windows rules 1-5 make of the others, off
   the head and the tail of the order (uniformity; ``grouping.py``). A window's deviation is set by its
   largest document; grouped, the large ones set it in fewer windows. Kept only where its windows hold as
   many clusters as stratified's, within the D margin (else rules 1-5 alone).
8. Packing split, two documents within two windows' worth of documents of each other trade places where
   that lowers their stretch's summed token-share deviation without losing clusters, the windows between
   them cut again (uniformity; ``split_trades.py``). Rule 5 trades only documents that move no cut but
   one inside a document between them; most of what is left lies in trades that move cuts. Swept in
   runs of whole windows at once, one per core.
9. Packing whole, the last window, which holds what is left, is emptied into the room the windows
   before it closed with where all its documents fit there, else given the clusters it lacks from
   nearby windows that keep their cuts and clusters; only where the boundary shift barely moves
   (diversity: on a corpus of a few dozen windows a last window of a few documents cost a tenth of a
   cluster per window or more; ``last_window.py``).
10. A document of more than ``BIG_SHARE`` of the stretch the boundary shift compares (the first or last
   BOUNDARY_FRACTION of tokens), due within that stretch and two windows of either end, moves inward in its
   pool to the nearest slot where it is due clear of both (the documents between shift one slot), one
   at a time while any can and no arrangement comes back, the one with the fewest such tokens near an end
   kept;
   then rules 2-9 run again, and that order is kept where its boundary shift is lower, its uniformity at
   most ``ENDS_UNIFORMITY_ALLOWANCE`` higher and its clusters per window at most ``DIVERSITY_MARGIN``
   fewer, or still ahead of stratified's by ``ENDS_DIVERSITY_LEAD_KEPT`` of the lead they had, or (where the
   shift falls to at most ``ENDS_SHIFT_KEPT`` of what it was) at least stratified's within the D margin
   (boundary shift: on a few thousand documents rule 1 left a pool's few long documents near its ends, where
   one could be a third of a stretch and set its mix).
11. Where such a document still reaches into a stretch of the finished order, it moves in the order itself to
   the nearest place clear of both stretches (``ends.py``), kept under rule 10's test (boundary shift: where
   one cluster holds most tokens in a few huge documents, its pool has too few short ones to be due at the
   head, so rule 10 cannot clear it).

Ties go to the lowest cluster id. O(N log N) for the pools and due positions, O(N * K) for the
greedy, O(N) for the trades, the re-cuts and the last window, O(N log L) for the groups, compiled with
numba.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit, prange

from ..diversity import (
    BOUNDARY_FRACTION,
    DIVERSITY_MARGIN,
    boundary_shift,
    global_token_shares,
    window_counts,
    window_share_deviation,
)
from ..packing import SPLIT, WHOLE, advance, packing_model, place
from .ends import ends_moved
from .exchange import exchange_pass
from .grouping import group_keys, group_large, grouped_documents, place_groups
from .last_window import mend_last_window
from .options import OrderingOptions
from .pools import cluster_pools, deal_long, order_by
from .recut import recut_pass
from .split_trades import split_trade_pass
from .window_greedy import stratified_order

NONE = np.iinfo(np.int64).max  # no next document: the pool is empty
# Split packing: the straddler is chosen among the documents due before this many windows after the open one.
STRADDLE_HORIZON = 3
# Rule 10: documents of more than this share of the boundary stretch are moved off the ends; the order so
# made is kept where its uniformity rises by at most this, and its clusters per window fall by at most the D
# margin or keep this share of rules 1-9's lead over stratified's. Set on samples of the held-out corpora
# (BENCHMARKS.md, "Large documents off the ends").
BIG_SHARE = 0.2
ENDS_UNIFORMITY_ALLOWANCE = 0.01
ENDS_DIVERSITY_LEAD_KEPT = 0.5
# ... or, where the boundary shift falls to at most this share of what it was, its clusters per window stay at
# least stratified's, within the D margin.
ENDS_SHIFT_KEPT = 0.5
# Rule 10 moves one document at a time and measures again; at most this many moves.
MAX_END_MOVES = 32
# Packing split, rules 3-4's walk from the start is cut by due position into runs of whole token ranges,
# walked at once (one per core): at most GREEDY_RUNS runs of at least GREEDY_RUN_WINDOWS windows each. A run
# starts where the ones before it end, so the windows are the trainer's; at a cut a window does not know the
# clusters the run before it put in it, once per run.
GREEDY_RUNS = 64
GREEDY_RUN_WINDOWS = 256
# Stratified's clusters per window is computed beside rules 1-5 up to this many documents (its order and pools,
# 16 bytes a document, would otherwise add 16 GB to the peak at 1B documents); above, after them.
BACKGROUND_MAX_DOCUMENTS = 20_000_000


@njit(cache=True, nogil=True)
def _pace_pool(docs, token_counts, out, front_slots):
    """Rule 1 for one cluster: ``docs`` in shuffled order, written paced into ``out``, a walk from the first
    slot filling ``front_slots`` slots and one from the last filling the others, in turn in proportion to
    their shares (so they meet at ``front_slots``), each keeping its own schedule error.

    Exact integers: a document is long when t * n > T, and with E = n * (a walk's tokens so far) - j * T
    (j: its documents so far) its next long document (t tokens) goes next when 2 E + (n * t - T) <= 0.
    """
    n_k = docs.shape[0]
    total = 0
    n_long = 0
    for d in docs:
        total += token_counts[d]
    for d in docs:
        n_long += token_counts[d] * n_k > total
    short = np.empty(n_k - n_long, dtype=np.int64)
    long_docs = np.empty(n_long, dtype=np.int64)
    a = 0
    b = 0
    for d in docs:
        if token_counts[d] * n_k > total:
            long_docs[b] = d
            b += 1
        else:
            short[a] = d
            a += 1
    deck = np.empty(n_long, dtype=np.int64)
    deal_long(long_docs, token_counts, np.argsort(token_counts[long_docs], kind="mergesort"), deck)
    back_slots = n_k - front_slots
    short_lo, short_hi = 0, short.shape[0] - 1  # the short documents left: the front takes from lo, the back from hi
    long_lo, long_hi = 0, n_long - 1
    front, back = 0, 0  # slots each walk has filled
    front_error = 0
    back_error = 0
    for _ in range(n_k):
        from_front = back_slots == 0 or (front_slots > 0 and front * back_slots <= back * front_slots)
        error = front_error if from_front else back_error
        j = long_lo if from_front else long_hi
        if long_lo <= long_hi and (short_lo > short_hi or 2 * error + (n_k * token_counts[deck[j]] - total) <= 0):
            d = deck[j]
            if from_front:
                long_lo += 1
            else:
                long_hi -= 1
        elif from_front:
            d = short[short_lo]
            short_lo += 1
        else:
            d = short[short_hi]
            short_hi -= 1
        if from_front:
            out[front] = d
            front += 1
            front_error += n_k * token_counts[d] - total
        else:
            out[n_k - 1 - back] = d
            back += 1
            back_error += n_k * token_counts[d] - total


@njit(cache=True, nogil=True, parallel=True)
def _paced_pools(grouped, pool_starts, token_counts):
    """Rule 1 for every pool of ``grouped`` (each cluster's documents in shuffled order), the pools at once."""
    members = np.empty_like(grouped)
    n_clusters = pool_starts.shape[0] - 1
    for k in prange(n_clusters):
        start, stop = pool_starts[k], pool_starts[k + 1]
        _pace_pool(grouped[start:stop], token_counts, members[start:stop], meeting_slot(stop - start, k, n_clusters))
    return members


@njit(cache=True, nogil=True)
def meeting_slot(n_k, k, n_clusters):
    """Where rule 1's two walks over cluster k's pool of n_k meet: floor(n_k (2k + 1) / 2K), so the pools' middles,
    which take what both ends left, fall at different points of the order."""
    return (n_k * (2 * k + 1)) // (2 * n_clusters)


@njit(cache=True, nogil=True, inline="always")
def _key_before(a, k_a, b, k_b, pool_starts):
    """Slot a (of pool k_a) is merged before slot b (of pool k_b): (2 j_a + 1) / n_a < (2 j_b + 1) / n_b, ties
    to the lower cluster."""
    left = (2 * (a - pool_starts[k_a]) + 1) * (pool_starts[k_b + 1] - pool_starts[k_b])
    right = (2 * (b - pool_starts[k_b]) + 1) * (pool_starts[k_a + 1] - pool_starts[k_a])
    return left < right or (left == right and k_a < k_b)


@njit(cache=True, nogil=True, inline="always")
def _bucket(j, size, n):
    """Slot j of a pool of ``size``, of n slots in all: floor(n (2j + 1) / 2 size) computed in floats. The
    quotient of two exact integers is rounded correctly and the product monotonically, so a larger key never
    falls in an earlier bucket and equal keys share one."""
    return min(np.int64((2 * j + 1) / (2.0 * size) * n), n - 1)


@njit(cache=True, nogil=True)
def _merge_sequence(pool_starts):
    """Rule 2's merge: the pool slots in key order (keys depend on the pools' sizes alone). A counting sort
    into n buckets by key (a pool's keys lie 1 / size >= 1 / n apart, so a bucket holds about one slot and at
    most one per pool), then each bucket in exact key order: O(n + K), where a heap over the clusters' next
    keys took twice as long on 1M slots."""
    n_clusters = pool_starts.shape[0] - 1
    n = pool_starts[-1]
    merged = np.empty(n, dtype=np.int64)
    if n == 0:
        return merged
    starts = np.zeros(n + 1, dtype=np.int64)
    for k in range(n_clusters):
        size = pool_starts[k + 1] - pool_starts[k]
        for j in range(size):
            starts[_bucket(j, size, n) + 1] += 1
    for b in range(n):
        starts[b + 1] += starts[b]
    cluster = np.empty(n, dtype=np.int64)
    nxt = starts[:-1].copy()
    for k in range(n_clusters):
        size = pool_starts[k + 1] - pool_starts[k]
        for j in range(size):
            b = _bucket(j, size, n)
            merged[nxt[b]] = pool_starts[k] + j
            cluster[nxt[b]] = k
            nxt[b] += 1
    for b in range(n):  # insertion sort: a bucket holds a few slots
        for i in range(starts[b] + 1, starts[b + 1]):
            slot, k = merged[i], cluster[i]
            m = i
            while m > starts[b] and _key_before(slot, k, merged[m - 1], cluster[m - 1], pool_starts):
                merged[m] = merged[m - 1]
                cluster[m] = cluster[m - 1]
                m -= 1
            merged[m] = slot
            cluster[m] = k
    return merged


@njit(cache=True, nogil=True)
def _due_along(merged, member_counts, due, lo, hi):
    """Due positions of the slots merged lo .. hi - 1 into ``due``, from the tokens merged before lo."""
    placed = due[merged[lo]] if lo > 0 else 0
    for i in range(lo, hi):
        due[merged[i]] = placed
        placed += member_counts[merged[i]]


def _due_positions(pool_starts, member_counts):
    """Rule 2: each pool slot's due position (the tokens of the slots merged before it)."""
    due = np.empty(member_counts.shape[0], dtype=np.int64)
    if due.size:
        _due_along(_merge_sequence(pool_starts), member_counts, due, 0, due.size)
    return due


@njit(cache=True, nogil=True)
def _pick_whole(next_due, next_length, stamp, window, fill, placed, seq_len):
    """Rule 3, documents whole: the cluster whose next document goes next."""
    window_end = placed + seq_len - fill
    next_window_end = window_end + seq_len
    n = next_due.shape[0]
    # Minima first, in a loop without branches, then the lowest cluster attaining the one taken (-1: none left).
    lacking_due, fitting_due, earliest_due = NONE, NONE, NONE
    for k in range(n):
        d = next_due[k]
        fits = not place(fill, next_length[k], seq_len, WHOLE)[0]  # else it would close the window
        lacks = stamp[k] != window
        earliest_due = min(earliest_due, d)
        lacking_due = min(lacking_due, d if fits and lacks and d <= next_window_end else NONE)
        fitting_due = min(fitting_due, d if fits and not lacks and d <= window_end else NONE)
    for k in range(n):
        d = next_due[k]
        fits = not place(fill, next_length[k], seq_len, WHOLE)[0]
        lacks = stamp[k] != window
        if lacking_due != NONE:
            if d == lacking_due and fits and lacks:
                return k
        elif fitting_due != NONE:
            if d == fitting_due and fits and not lacks:
                return k
        elif d == earliest_due and d != NONE:
            return k
    return -1


@njit(cache=True, nogil=True)
def _pick_split(next_due, next_length, next_excess, stamp, window, room, placed, seq_len, saturated):
    """Rules 3 and 4, documents split: the cluster whose next document goes next."""
    window_end = placed + room
    next_window_end = window_end + seq_len
    horizon = window_end + STRADDLE_HORIZON * seq_len
    n = next_due.shape[0]
    # Minima first, in loops without branches, then the lowest cluster attaining each (-1: none left).
    earliest_due, lacking_due = NONE, NONE
    in_horizon, lacking_in_horizon = False, False
    for k in range(n):
        d = next_due[k]
        lacks = stamp[k] != window
        earliest_due = min(earliest_due, d)
        lacking_due = min(lacking_due, d if lacks and d <= next_window_end else NONE)
        in_horizon |= d <= horizon
        lacking_in_horizon |= d <= horizon and (lacks or saturated)
    lacking = -1
    if lacking_due != NONE:
        for k in range(n):
            if next_due[k] == lacking_due and stamp[k] != window:
                lacking = k
                break
    if in_horizon:
        # the straddler: of those due within the horizon (of a lacking cluster where any), the largest excess
        top = np.iinfo(np.int64).min
        for k in range(n):
            ok = next_due[k] <= horizon and ((stamp[k] != window or saturated) == lacking_in_horizon)
            top = max(top, next_excess[k] if ok else np.iinfo(np.int64).min)
        straddler = -1
        for k in range(n):
            if (next_excess[k] == top and next_due[k] <= horizon
                    and (stamp[k] != window or saturated) == lacking_in_horizon):
                straddler = k
                break
        t = next_length[straddler]
        # A document of m windows and r tokens more starts (L - r) / 2 or more into a window, so it fills
        # m - 1 windows alone, not m (a window one document fills holds one cluster).
        half = (seq_len + t % seq_len) // 2 if t >= seq_len else t // 2
        if room <= half:
            return straddler  # cut at the boundary near its middle
        # the earliest-due lacking document due before the next window ends that fits before the straddle point
        before, before_due = -1, NONE
        for j in range(n):
            d = next_due[j]
            if (d <= next_window_end and d < before_due and stamp[j] != window
                    and next_length[j] <= room - half and j != straddler):
                before, before_due = j, d
        if before >= 0:
            return before
        if 2 * room <= 3 * half:
            return straddler
    if lacking >= 0:
        return lacking
    for k in range(n):
        if next_due[k] == earliest_due and earliest_due != NONE:
            return k
    return -1


@njit(cache=True, nogil=True)
def _paced(members, pool_starts, member_counts, due, cluster_tokens, seq_len, model, saturated, first_room):
    """Rules 3 and 4 over the paced pools: the order, walking windows with ``packing.advance``; the first
    window has ``first_room`` tokens of room (less than ``seq_len`` where the pass ends a run of windows
    that does not start at a window boundary)."""
    n_clusters = pool_starts.shape[0] - 1
    total = cluster_tokens.sum()
    taken = np.zeros(n_clusters, dtype=np.int64)
    # Each cluster's next document: due position (NONE once the pool is empty), length, and excess over the
    # cluster's share of a window scaled by total * seq_len; small arrays, so the scans do no random reads.
    next_due = np.full(n_clusters, NONE, dtype=np.int64)
    next_length = np.zeros(n_clusters, dtype=np.int64)
    next_excess = np.zeros(n_clusters, dtype=np.int64)
    for k in range(n_clusters):
        if pool_starts[k + 1] > pool_starts[k]:
            next_due[k] = due[pool_starts[k]]
            next_length[k] = member_counts[pool_starts[k]]
            next_excess[k] = next_length[k] * total - cluster_tokens[k] * seq_len
    stamp = np.full(n_clusters, -1, dtype=np.int64)  # stamp[k] == w: cluster k is in window w
    window = 0
    fill = seq_len - first_room
    placed = 0  # tokens placed so far
    order = np.empty(members.shape[0], dtype=np.int64)
    for step in range(members.shape[0]):
        if model == SPLIT:
            # A window exactly full stays open for zero-token documents; the next tokens open the next one.
            full = fill == seq_len
            k = _pick_split(next_due, next_length, next_excess, stamp, window + 1 if full else window,
                            seq_len if full else seq_len - fill, placed, seq_len, saturated)
        else:
            k = _pick_whole(next_due, next_length, stamp, window, fill, placed, seq_len)
        position = pool_starts[k] + taken[k]
        taken[k] += 1
        order[step] = members[position]
        t = member_counts[position]
        if position + 1 < pool_starts[k + 1]:
            next_due[k] = due[position + 1]
            next_length[k] = member_counts[position + 1]
            next_excess[k] = next_length[k] * total - cluster_tokens[k] * seq_len
        else:
            next_due[k] = NONE
        placed += t
        window, fill = advance(stamp, k, t, window, fill, seq_len, model)
    return order


@njit(cache=True, nogil=True, parallel=True)
def _paced_runs(members, pool_starts, member_counts, due, run_starts, offsets, cluster_tokens, seq_len, model,
                saturated):
    """``_paced`` on each run at once: run r is ``members[run_starts[r]:run_starts[r + 1]]``, its pools starting at
    ``pool_starts[r]``, its first token at ``offsets[r]`` of the stream (due positions counted from there)."""
    order = np.empty(members.shape[0], dtype=np.int64)
    for r in prange(run_starts.shape[0] - 1):
        lo, hi = run_starts[r], run_starts[r + 1]
        order[lo:hi] = _paced(members[lo:hi], pool_starts[r] - lo, member_counts[lo:hi], due[lo:hi] - offsets[r],
                              cluster_tokens, seq_len, model, saturated, seq_len - offsets[r] % seq_len)
    return order


def _walk_from_start(members, pool_of, member_counts, due, cluster_tokens, seq_len, model, saturated, n_clusters):
    """Rules 3-4 from the start of the stream over these slots (each pool's in order): one walk, or packing split
    with enough windows, runs of it at once (``GREEDY_RUNS``), each taking the slots whose middle is due in
    its share of the tokens."""
    tokens = int(member_counts.sum())
    n_runs = min(GREEDY_RUNS, tokens // (GREEDY_RUN_WINDOWS * seq_len)) if model == SPLIT else 1
    if n_runs < 2:
        pool_starts = np.concatenate(([0], np.cumsum(np.bincount(pool_of, minlength=n_clusters))))
        return _paced(members, pool_starts, member_counts, due, cluster_tokens, seq_len, model, saturated, seq_len)
    run_of = np.minimum((2 * due + member_counts) * n_runs // (2 * tokens), n_runs - 1)
    by_run = order_by(np.arange(members.size), run_of, pool_of)  # each pool's slots keep their order
    pools = np.concatenate(([0], np.cumsum(np.bincount(run_of * n_clusters + pool_of,
                                                       minlength=n_runs * n_clusters))))
    pool_starts = pools[np.arange(n_runs)[:, None] * n_clusters + np.arange(n_clusters + 1)]
    run_starts = np.ascontiguousarray(pool_starts[:, 0].tolist() + [members.size], dtype=np.int64)
    counts = member_counts[by_run]
    offsets = np.concatenate(([0], np.cumsum(counts)))[run_starts[:-1]]
    return _paced_runs(members[by_run], pool_starts, counts, due[by_run], run_starts, offsets, cluster_tokens,
                       seq_len, model, saturated)


def paced_pools(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int,
                seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(members, pool_starts) after rule 1; cluster k's pool is ``members[pool_starts[k]:pool_starts[k + 1]]``."""
    counts = np.asarray(token_counts, dtype=np.int64)
    grouped, pool_starts = cluster_pools(labels, counts, n_clusters, "random", seed)
    return _paced_pools(grouped, pool_starts, counts), pool_starts


def due_positions(members: np.ndarray, pool_starts: np.ndarray, token_counts: np.ndarray) -> np.ndarray:
    """Rule 2: each pool slot's due position in tokens (slots as ``paced_pools`` returns them)."""
    return _due_positions(pool_starts, np.asarray(token_counts, dtype=np.int64)[members])


def big_document_tokens(total: int) -> float:
    """Rule 10: documents of more tokens than this are moved off the ends."""
    return BIG_SHARE * BOUNDARY_FRACTION * total


def ends_cleared(members: np.ndarray, pool_starts: np.ndarray, token_counts: np.ndarray, seq_len: int,
                 stream_tokens: int | None = None) -> np.ndarray | None:
    """Rule 10's move on pools (as ``paced_pools`` returns them): a document of more than BIG_SHARE of the
    boundary stretch (BOUNDARY_FRACTION of ``stream_tokens``, the whole stream's tokens where these pools
    are part of it, else theirs) due within the stretch and two windows of an end (as rules 3-4's walk from
    both ends counts them) goes to the nearest slot of its pool, later from the head and earlier from the
    tail, where it would be due clear of both; the documents between shift one slot towards where it was.
    One at a time, the largest that can move first, due positions measured again after each, until none
    can or an arrangement comes back (a move can bring another large document to an end, and two can
    push each other in turn); of the arrangements met, the one with the fewest tokens of such documents
    near an end is returned (the first of equals), or None where that is the pools as given."""
    counts = np.asarray(token_counts, dtype=np.int64)
    member_counts = counts[members]
    total = int(member_counts.sum())
    stream = total if stream_tokens is None else int(stream_tokens)
    reach = BOUNDARY_FRACTION * stream + 2 * seq_len
    if 2 * reach >= total:
        return None
    big = big_document_tokens(stream)

    def near_an_end(due, tokens):
        slots = np.flatnonzero(tokens > big)
        return slots[(due[slots] < reach) | (due[slots] + tokens[slots] > total - reach)]

    members = members.copy()
    merged = _merge_sequence(pool_starts)
    rank = np.empty_like(merged)  # each slot's place in the merge
    rank[merged] = np.arange(merged.size)
    due = np.empty_like(member_counts)
    _due_along(merged, member_counts, due, 0, due.size)
    best, best_weight = None, int(member_counts[near_an_end(due, member_counts)].sum())
    seen = {members.tobytes()}
    for _ in range(MAX_END_MOVES):
        candidates = near_an_end(due, member_counts)
        for p in candidates[np.argsort(-member_counts[candidates], kind="stable")]:
            k = int(np.searchsorted(pool_starts, p, side="right")) - 1
            t = member_counts[p]
            if due[p] < reach:  # to a later slot q: then due at due[q] - t + (the tokens of q's document)
                after = due[p + 1:pool_starts[k + 1]] - t + member_counts[p + 1:pool_starts[k + 1]]
                clear = np.flatnonzero((after >= reach) & (after + t <= total - reach))
                if clear.size:
                    span, shift = slice(p, p + 2 + int(clear[0])), -1
                    break
            else:  # to an earlier slot q: then due where q's document was
                before = due[pool_starts[k]:p]
                clear = np.flatnonzero((before >= reach) & (before + t <= total - reach))
                if clear.size:
                    span, shift = slice(pool_starts[k] + int(clear[-1]), p + 1), 1
                    break
        else:
            break  # no document near an end can move
        members[span], member_counts[span] = np.roll(members[span], shift), np.roll(member_counts[span], shift)
        if members.tobytes() in seen:
            break
        seen.add(members.tobytes())
        # Only the slots merged from the span's first to its last change due position (the span keeps its tokens).
        _due_along(merged, member_counts, due, int(rank[span.start]), int(rank[span.stop - 1]) + 1)
        weight = int(member_counts[near_an_end(due, member_counts)].sum())
        if weight < best_weight:
            best, best_weight = members.copy(), weight
    return best


def paced_greedy_order(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int,
                       options: OrderingOptions = OrderingOptions(), clear_ends: bool = False,
                       stream_tokens: int | None = None) -> np.ndarray:
    """Rules 1-4 (see the module docstring): the order before rule 5's trades; with ``clear_ends``, from the
    pools after rule 10's move (``stream_tokens``: the whole stream's, where these documents are part of it)."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    members, pool_starts = paced_pools(labels, counts, n_clusters, options.seed)
    if clear_ends:
        cleared = ends_cleared(members, pool_starts, counts, int(options.seq_len), stream_tokens)
        members = members if cleared is None else cleared
    member_counts = counts[members]
    running = np.concatenate(([0], np.cumsum(member_counts)))
    cluster_tokens = running[pool_starts[1:]] - running[pool_starts[:-1]]
    seq_len = int(options.seq_len)
    total = int(running[-1])
    saturated = windows_saturated(labels.size, seq_len, n_clusters, total)
    model = packing_model(options.packing)
    due = _due_positions(pool_starts, member_counts)
    # Rules 3 and 4 take a lacking cluster's document due up to two windows ahead, which shifts the head's
    # mix and not the tail's; where two windows are a good part of the first BOUNDARY_FRACTION of tokens
    # (a few thousand documents) that was most of the boundary shift. So the documents due in the last
    # stretch (that fraction and two windows) go in from the end, their due positions counted from it:
    # the tail is made as the head is.
    backward_tokens = min(BOUNDARY_FRACTION * total + 2 * seq_len, total / 2)
    early = 2 * due + member_counts < 2 * (total - backward_tokens)  # the document's middle is due before it
    pool_of = np.repeat(np.arange(n_clusters), np.diff(pool_starts))
    head = np.flatnonzero(early)  # each pool's slots keep their order: due grows along a pool
    tail = np.flatnonzero(~early)
    tail = tail[np.lexsort((-tail, pool_of[tail]))]  # each pool's late slots, last due first
    tail_starts = np.concatenate(([0], np.cumsum(np.bincount(pool_of[tail], minlength=n_clusters))))
    # Packing split the windows are cut from the start, so the last one holds total % seq_len tokens.
    last_room = (total % seq_len or seq_len) if model == SPLIT else seq_len
    forward = _walk_from_start(members[head], pool_of[head], member_counts[head], due[head], cluster_tokens, seq_len,
                               model, saturated, n_clusters)
    backward = _paced(members[tail], tail_starts, member_counts[tail], total - due[tail] - member_counts[tail],
                      cluster_tokens, seq_len, model, saturated, last_room)
    return np.concatenate((forward, backward[::-1]))


def windows_saturated(n_docs: int, seq_len: int, n_clusters: int, total_tokens: int) -> bool:
    """Windows hold at least as many documents as there are clusters, on average (N L >= K T)."""
    return int(n_docs) * int(seq_len) >= int(n_clusters) * int(total_tokens)


def paced_order(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int,
                options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """The ``paced`` ordering (see the module docstring) for ``options.seq_len``, ``options.packing``
    and ``options.seed``: an int64 permutation of input positions. Rules 1-5, then 6 and 8 packing split;
    packing whole, rule 7 where it applies (rules 1-5 ordering the documents it does not group), then 9;
    where some document is large against the boundary stretch, rules 10 and 11."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    with ThreadPoolExecutor(max_workers=1) as background:
        stratified = StratifiedDiversity(labels, counts, n_clusters, options, background)
        order = _rules_1_to_9(labels, counts, n_clusters, options, clear_ends=False, stratified=stratified)
        big = big_document_tokens(int(counts.sum()))
        if not (counts > big).any():
            return order
        if _ends_would_move(labels, counts, n_clusters, options):  # (else rules 1-9 again give the same order)
            cleared = _rules_1_to_9(labels, counts, n_clusters, options, clear_ends=True, stratified=stratified)
            if _ends_clearer(cleared, order, labels, counts, n_clusters, options, stratified):
                order = cleared
        moved = ends_moved(order, counts, big)  # rule 11
        if moved is not None and _ends_clearer(moved, order, labels, counts, n_clusters, options, stratified):
            order = moved
        return order


class StratifiedDiversity:
    """Stratified's (the default's) mean clusters per window under ``options``, which rule 7's guard and rule
    10's check compare against: computed once, on ``background`` (another thread: the kernels release the
    GIL, so it runs beside rules 1-5 where rule 7 may apply) once ``start`` is called, or here when first
    asked for without an executor."""

    def __init__(self, labels, counts, n_clusters, options, background: ThreadPoolExecutor | None = None):
        self._args = labels, counts, n_clusters, options
        self._background = background
        self._future = None
        self._value: float | None = None

    def _compute(self) -> float:
        labels, counts, n_clusters, options = self._args
        order = stratified_order(labels, counts, n_clusters, options)
        return float(window_counts(labels, counts, int(options.seq_len), order, options.packing)[0].mean())

    def start(self) -> None:
        """Start on the background thread, where there is one and the documents are few enough that its
        arrays (16 bytes a document) beside rules 1-5's cost little memory; else it is computed when asked."""
        if (self._future is None and self._background is not None
                and self._args[0].size <= BACKGROUND_MAX_DOCUMENTS):
            self._future = self._background.submit(self._compute)

    def value(self) -> float:
        if self._value is None:
            self._value = self._future.result() if self._future is not None else self._compute()
        return self._value


def _ends_would_move(labels, counts, n_clusters, options) -> bool:
    """Whether rule 10's move changes a pool rules 1-4 start from: all documents', or, packing whole where
    rule 7 may apply, those of the documents it does not group. Pools and due positions cost a fifth of
    rules 1-9, so a corpus with a large document in the middle of its pool is not ordered twice."""
    subsets = [np.arange(labels.size)]
    total = int(counts.sum())
    if packing_model(options.packing) == WHOLE and not windows_saturated(labels.size, options.seq_len, n_clusters,
                                                                          total):
        grouped = _rule_7_groups(labels, counts, n_clusters, options, total)
        if grouped is not None:
            subsets.append(grouped[1])
    for rows in subsets:
        members, pool_starts = paced_pools(labels[rows], counts[rows], n_clusters, options.seed)
        if ends_cleared(members, pool_starts, counts[rows], int(options.seq_len), total) is not None:
            return True
    return False


def _ends_clearer(cleared, order, labels, counts, n_clusters, options, stratified: StratifiedDiversity) -> bool:
    """Rule 10 keeps its order where the boundary shift is lower, the uniformity at most
    ENDS_UNIFORMITY_ALLOWANCE higher, and the clusters per window at most the D margin fewer or, failing
    that, still ahead of stratified's by ENDS_DIVERSITY_LEAD_KEPT of rules 1-9's lead."""
    if np.array_equal(cleared, order):
        return False
    seq_len, packing = int(options.seq_len), options.packing

    def measured(o):
        return (boundary_shift(labels, counts, o, n_clusters),
                float(window_counts(labels, counts, seq_len, o, packing)[0].mean()),
                float(window_share_deviation(labels, counts, seq_len, o, n_clusters, packing).mean()))

    (shift, diversity, uniformity), (shift_was, diversity_was, uniformity_was) = measured(cleared), measured(order)
    if not (shift < shift_was and uniformity <= uniformity_was + ENDS_UNIFORMITY_ALLOWANCE):
        return False
    if diversity >= diversity_was - DIVERSITY_MARGIN:
        return True
    floor = stratified.value()
    if shift <= ENDS_SHIFT_KEPT * shift_was:  # a shift cut this much may take the lead, not stratified's own
        return diversity >= floor - DIVERSITY_MARGIN
    return diversity >= floor + ENDS_DIVERSITY_LEAD_KEPT * (diversity_was - floor)


def _rules_1_to_9(labels, counts, n_clusters, options, clear_ends, stratified: StratifiedDiversity | None = None
                  ) -> np.ndarray:
    shares = global_token_shares(labels, counts, n_clusters)
    model = packing_model(options.packing)
    total = int(counts.sum())
    if model == WHOLE and not windows_saturated(labels.size, options.seq_len, n_clusters, total):
        groups = _rule_7_groups(labels, counts, n_clusters, options, total)
        if groups is not None:
            stratified = stratified or StratifiedDiversity(labels, counts, n_clusters, options)
            stratified.start()
            grouped = _with_large_grouped(labels, counts, n_clusters, options, shares, total, clear_ends, groups)
            if grouped is not None:
                grouped = mend_last_window(grouped, labels, counts, options.seq_len, n_clusters)
                if _keeps_stratified_diversity(grouped, labels, counts, options, stratified):
                    return grouped
    order = _rules_1_to_5(labels, counts, n_clusters, options, shares, model, clear_ends)
    if model != SPLIT:
        return mend_last_window(order, labels, counts, options.seq_len, n_clusters)
    order = recut_pass(order, labels, counts, options.seq_len, shares)
    return split_trade_pass(order, labels, counts, options.seq_len, shares, options.seed)


def _keeps_stratified_diversity(order, labels, counts, options, stratified: StratifiedDiversity) -> bool:
    """Rule 7's guard: its windows hold as many clusters as stratified's (the default's), within the D margin.
    Grouping the large documents trades clusters per window for uniformity; on small corpora (a few
    thousand documents, windows a percent of the tokens) it fell below stratified's."""
    ours = window_counts(labels, counts, int(options.seq_len), order, "whole")[0].mean()
    return bool(ours >= stratified.value() - DIVERSITY_MARGIN)


def _rules_1_to_5(labels, counts, n_clusters, options, shares, model, clear_ends=False,
                  stream_tokens=None) -> np.ndarray:
    order = paced_greedy_order(labels, counts, n_clusters, options, clear_ends, stream_tokens)
    return exchange_pass(order, labels, counts, options.seq_len, shares, model, options.seed)


def _rule_7_groups(labels, counts, n_clusters, options, total) -> tuple[np.ndarray, np.ndarray] | None:
    """Rule 7's groups of large documents and the positions of the others; None where it does not apply
    (decided before the groups are made: on long documents that is most of rule 7's time)."""
    grouped = grouped_documents(counts, options.seq_len)
    rest = np.flatnonzero(~grouped)
    # The other documents' windows would hold as many documents as there are clusters: moving them out of
    # the large documents' windows would cost clusters per window for no gain.
    rest_tokens = total - int(counts[grouped].sum())
    # Nor where the others cannot fill the head and the tail (place_groups would find no window start).
    if (labels.size - rest.size < 2 or windows_saturated(rest.size, options.seq_len, n_clusters, rest_tokens)
            or rest_tokens < 2 * BOUNDARY_FRACTION * total):
        return None
    return group_large(labels, counts, options.seq_len), rest


def _with_large_grouped(labels, counts, n_clusters, options, shares, total, clear_ends=False, groups=None
                        ) -> np.ndarray | None:
    """Rule 7 (``grouping.py``): the large documents' groups placed among the others' windows, those
    ordered by rules 1-5 (the shares are all documents' own); None where rule 7 does not apply.
    ``groups``: ``_rule_7_groups``'s answer, where the caller has it."""
    grouped = groups if groups is not None else _rule_7_groups(labels, counts, n_clusters, options, total)
    if grouped is None:
        return None
    groups, rest = grouped
    # (rule 10: the groups go off the head and the tail, so the boundary stretches are the others' documents)
    rest_order = rest[_rules_1_to_5(labels[rest], counts[rest], n_clusters, options, shares, WHOLE, clear_ends,
                                    total)]
    keys = group_keys(labels, counts, groups, options.seed)
    return place_groups(rest_order, counts, groups, keys, options.seq_len, total)
