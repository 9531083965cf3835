"""Can any order meet U where `paced` misses it? A long search from `paced`'s order that keeps D.

    .venv/bin/python benchmarks/bench_uniformity_search.py --corpora CORPORA
        [--quality benchmarks/results_ordering_quality_2026-11-26_leaders.json] [--packing whole|split]
        [--iterations-per-doc 400] [--cells mix-a:16384 ...] [--out results.json]
        [--t-start 0 --max-window-gap 8 --keep-paced-diversity --per-step-diversity --forward-only
         --trades-only --fixed-openers]   # packing whole: what a fast pass could do, piece by piece

The criterion U asks for a mean token-share uniformity at most 0.8 x a random shuffle's. The lower bound
(`diversity.uniformity_lower_bound`) proves it out of reach in some cells; for the others this search asks
the other way round, with no time limit: starting from `paced`'s order, it lowers the summed largest share
deviation over windows (U times the number of windows, which neither search changes) by simulated
annealing, keeping the unique clusters summed over windows at least what D allows (stratified's mean -
0.05 + 0.005 per window, or `paced`'s if lower). Every cell `paced` misses U in (or --cells), each
packing model (or --packing):

- whole: the windows stay cut where `paced`'s order cuts them (a document of a window or more keeps its
  windows alone, its remainder first in its last one) and the other documents move between windows:
  one moves to another window, or two swap, when both windows' tokens fit and each window's longest
  document still does not fit in the window before it. The order is written window by window (the long
  document, then the others longest first).
- split: two documents at most two windows' worth of documents apart swap places when the stretch
  between them spans at most 4 windows (only those windows change).

The search starts from the `paced` of this checkout; the cells it runs by default are the ones `paced`
missed in --quality (the default file is the run before `paced`'s rule 8, which the documented results
started from). Each found order is measured with the package's metrics (`window_metrics` of bench_ordering_quality.py:
U, D, boundary shift), so every figure is a real order's: an upper bound on the best order's U. Where the
search does not reach 0.8 x, that is no proof that no order does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ordering_quality import load_corpora, window_metrics  # noqa: E402

from diversity_order.diversity import global_token_shares, uniformity_lower_bound  # noqa: E402
from diversity_order.ordering_report import DIVERSITY_MARGIN, UNIFORMITY_RATIO, criteria  # noqa: E402
from diversity_order.orderings import ORDERINGS, OrderingOptions  # noqa: E402

SEED = 42
T_START, T_END = 0.02, 0.0002  # annealing temperatures, in units of a window's largest share deviation
SPLIT_MAX_GAP = 256  # packing split: positions a swap may span (2 windows' documents, at most this)
SPLIT_MAX_WINDOWS = 4  # packing split: windows the stretch between two swapped documents may span


@njit(cache=True)
def _windows_whole(labels, counts, order, seq_len, n_clusters):
    """Walk `order` packing whole: per window its tokens per cluster and fill; per document its window
    (-1 for documents pinned: a window or more, or no tokens) and, for a document of a window or more, the
    first window it fills (-1 for the others); per window, whether a long document has a piece there, and
    its documents per cluster."""
    n = order.shape[0]
    window_of = np.full(labels.shape[0], -1, dtype=np.int64)
    tokens = np.zeros((n + 1 + counts.sum() // seq_len, n_clusters), dtype=np.int64)
    fill = np.zeros(tokens.shape[0], dtype=np.int64)
    first_window = np.full(labels.shape[0], -1, dtype=np.int64)
    pinned = np.zeros(tokens.shape[0], dtype=np.bool_)
    docs = np.zeros(tokens.shape, dtype=np.int64)
    w = 0
    for i in range(n):
        d = order[i]
        t = counts[d]
        c = labels[d]
        if t == 0:
            continue
        if t < seq_len:
            if fill[w] + t > seq_len:
                w += 1
            tokens[w, c] += t
            docs[w, c] += 1
            fill[w] += t
            window_of[d] = w
            continue
        if fill[w] > 0:
            w += 1
        first_window[d] = w
        for _ in range(t // seq_len):
            tokens[w, c] += seq_len
            docs[w, c] += 1
            fill[w] = seq_len
            pinned[w] = True
            w += 1
        if t % seq_len:
            tokens[w, c] += t % seq_len
            docs[w, c] += 1
            fill[w] = t % seq_len
            pinned[w] = True
    n_windows = w + 1 if fill[w] > 0 else w
    return window_of, first_window, pinned[:n_windows], tokens[:n_windows], docs[:n_windows], fill[:n_windows]


@njit(cache=True, inline="always")
def _deviation(row, fill, tau, c_out, s_out, c_in, s_in):
    """max_k |share_k - tau_k| of a window holding `row` tokens per cluster after taking s_out tokens of
    c_out out and putting s_in tokens of c_in in."""
    f = fill - s_out + s_in
    if f <= 0:
        return 0.0
    worst = 0.0
    for k in range(row.shape[0]):
        x = row[k]
        if k == c_out:
            x -= s_out
        if k == c_in:
            x += s_in
        d = abs(x / f - tau[k])
        if d > worst:
            worst = d
    return worst


@njit(cache=True, inline="always")
def _cooling(t_start, t_end, iterations):
    """The factor the temperature shrinks by each step, from t_start to t_end over the iterations (1 when
    t_start is 0: a search that never goes uphill)."""
    if t_start <= 0:
        return 1.0
    return (t_end / t_start) ** (1.0 / max(iterations - 1, 1))


@njit(cache=True, inline="always")
def _refused(delta, temp):
    """Metropolis: a step that raises the objective by delta is refused, always at temperature 0."""
    return delta > 0 and (temp == 0.0 or np.random.random() >= np.exp(-delta / temp))


@njit(cache=True, inline="always")
def _largest_without(w, skip, head, nxt, counts):
    """The longest document of window w's linked members other than `skip` (0 if none)."""
    best = 0
    d = head[w]
    while d >= 0:
        if d != skip and counts[d] > best:
            best = counts[d]
        d = nxt[d]
    return best


@njit(cache=True, inline="always")
def _still_cut(v, wa, fa, ma, wb, fb, mb, fill, largest, pinned, seq_len):
    """Does the trainer still close window v before window v + 1 once windows wa and wb hold fa / fb tokens
    and their longest movable documents are ma / mb? (A window holding a long document's piece opens
    with that document, which always closes the one before.)"""
    if v < 0 or v + 1 >= fill.shape[0] or pinned[v + 1]:
        return True
    f = fa if v == wa else (fb if v == wb else fill[v])
    m = ma if v + 1 == wa else (mb if v + 1 == wb else largest[v + 1])
    return f + m > seq_len


@njit(cache=True)
def _anneal(labels, counts, window_of, pinned, tokens, docs, min_unique, fill, tau, seq_len, iterations,
            t_start, t_end, seed, max_gap, forward=False, trades_only=False, fixed_openers=False, per_step=False):
    """Simulated annealing over which window each movable document sits in; windows keep being cut where
    they are and the unique clusters summed over windows stay at least min_unique (docs: per window, its
    documents per cluster). With max_gap > 0 a document only goes to a window at most that many windows
    away (forward: only to later windows); trades_only: no document moves alone; fixed_openers: a window's
    longest document stays; per_step: each step keeps its two windows' unique clusters; t_start 0: never
    uphill. Returns the summed largest deviation over windows at the end."""
    np.random.seed(seed)
    unique = 0
    for w in range(docs.shape[0]):
        for c in range(docs.shape[1]):
            unique += docs[w, c] > 0
    movable = np.flatnonzero(window_of >= 0)
    m = movable.shape[0]
    n_windows = fill.shape[0]
    dev = np.empty(n_windows)
    n_items = np.zeros(n_windows, dtype=np.int64)
    largest = np.zeros(n_windows, dtype=np.int64)
    head = np.full(n_windows, -1, dtype=np.int64)
    nxt = np.full(labels.shape[0], -1, dtype=np.int64)
    prv = np.full(labels.shape[0], -1, dtype=np.int64)
    for w in range(n_windows):
        dev[w] = _deviation(tokens[w], fill[w], tau, -1, 0, -1, 0)
        n_items[w] = 1 if pinned[w] else 0
    for i in range(m):
        d = movable[i]
        w = window_of[d]
        n_items[w] += 1
        largest[w] = max(largest[w], counts[d])
        nxt[d] = head[w]
        if head[w] >= 0:
            prv[head[w]] = d
        head[w] = d
    total = dev.sum()
    if m < 2:
        return total
    ratio = _cooling(t_start, t_end, iterations)
    temp = t_start
    for _ in range(iterations):
        temp *= ratio
        a = movable[np.random.randint(m)]
        wa = window_of[a]
        ca, sa = labels[a], counts[a]
        swap = np.random.random() < 0.5 or trades_only
        if fixed_openers and sa == largest[wa]:
            continue
        if max_gap > 0:
            wb = wa + (np.random.randint(1, max_gap + 1) if forward else np.random.randint(-max_gap, max_gap + 1))
            if wb < 0 or wb >= n_windows or wb == wa:
                continue
        if swap:
            if max_gap > 0:
                b = head[wb]
                for _ in range(np.random.randint(max(n_items[wb] - (1 if pinned[wb] else 0), 1))):
                    b = nxt[b]
                if b < 0:
                    continue
            else:
                b = movable[np.random.randint(m)]
            wb = window_of[b]
            cb, sb = labels[b], counts[b]
            if wa == wb or ca == cb or (fixed_openers and sb == largest[wb]):
                continue
        else:
            b = -1
            if max_gap == 0:
                wb = np.random.randint(n_windows)
            cb, sb = -1, 0
            if wb == wa or n_items[wa] < 2:
                continue
        fa = fill[wa] - sa + sb
        fb = fill[wb] - sb + sa
        if fa > seq_len or fb > seq_len:
            continue
        ma = _largest_without(wa, a, head, nxt, counts) if sa == largest[wa] else largest[wa]
        ma = max(ma, sb)
        mb = _largest_without(wb, b, head, nxt, counts) if swap and sb == largest[wb] else largest[wb]
        mb = max(mb, sa)
        if not (_still_cut(wa - 1, wa, fa, ma, wb, fb, mb, fill, largest, pinned, seq_len)
                and _still_cut(wa, wa, fa, ma, wb, fb, mb, fill, largest, pinned, seq_len)
                and _still_cut(wb - 1, wa, fa, ma, wb, fb, mb, fill, largest, pinned, seq_len)
                and _still_cut(wb, wa, fa, ma, wb, fb, mb, fill, largest, pinned, seq_len)):
            continue
        gained = (docs[wb, ca] == 0) - (docs[wa, ca] == 1)
        if swap:
            gained += (docs[wa, cb] == 0) - (docs[wb, cb] == 1)
        if unique + gained < min_unique or (per_step and gained < 0):
            continue
        da = _deviation(tokens[wa], fill[wa], tau, ca, sa, cb, sb)
        db = _deviation(tokens[wb], fill[wb], tau, cb, sb, ca, sa)
        delta = da + db - dev[wa] - dev[wb]
        if _refused(delta, temp):
            continue
        tokens[wa, ca] -= sa
        tokens[wb, ca] += sa
        docs[wa, ca] -= 1
        docs[wb, ca] += 1
        if swap:
            tokens[wb, cb] -= sb
            tokens[wa, cb] += sb
            docs[wb, cb] -= 1
            docs[wa, cb] += 1
        unique += gained
        fill[wa], fill[wb] = fa, fb
        largest[wa], largest[wb] = ma, mb
        dev[wa], dev[wb] = da, db
        total += delta
        for d, w_from, w_to in ((a, wa, wb), (b, wb, wa)):
            if d < 0:
                continue
            # unlink from w_from, link at the head of w_to
            if prv[d] >= 0:
                nxt[prv[d]] = nxt[d]
            else:
                head[w_from] = nxt[d]
            if nxt[d] >= 0:
                prv[nxt[d]] = prv[d]
            prv[d] = -1
            nxt[d] = head[w_to]
            if head[w_to] >= 0:
                prv[head[w_to]] = d
            head[w_to] = d
            window_of[d] = w_to
        if not swap:
            n_items[wa] -= 1
            n_items[wb] += 1
    return total


@njit(cache=True, inline="always")
def _add_split(tokens, docs, w0, c, start, t, sign, seq_len):
    """Add (sign 1) or take out (-1) a document of cluster c at stream offset `start`, packing split, in
    the window rows from w0 on: its tokens in every window they reach; a document without tokens is
    present in the window of the token before it."""
    if t == 0:
        docs[max(start - 1, 0) // seq_len - w0, c] += sign
        return
    for w in range(start // seq_len, (start + t - 1) // seq_len + 1):
        piece = min(start + t, (w + 1) * seq_len) - max(start, w * seq_len)
        tokens[w - w0, c] += sign * piece
        docs[w - w0, c] += sign


@njit(cache=True)
def _anneal_split(labels, counts, seq, min_unique, tau, seq_len, n_clusters, iterations, max_gap, max_windows,
                  t_start, t_end, seed):
    """Simulated annealing over the order itself, packing split: swap the documents at positions i and
    j <= i + max_gap when the stretch between them spans at most max_windows windows (only those
    windows change), keeping the unique clusters summed over windows at least min_unique. Works on
    `seq` in place; returns the summed largest deviation over windows at the end."""
    np.random.seed(seed)
    n = seq.shape[0]
    offset = np.zeros(n + 1, dtype=np.int64)
    for p in range(n):
        offset[p + 1] = offset[p] + counts[seq[p]]
    total_tokens = offset[n]
    n_windows = max((total_tokens + seq_len - 1) // seq_len, 1)
    tokens = np.zeros((n_windows, n_clusters), dtype=np.int64)
    docs = np.zeros((n_windows, n_clusters), dtype=np.int64)
    for p in range(n):
        _add_split(tokens, docs, 0, labels[seq[p]], offset[p], counts[seq[p]], 1, seq_len)
    fill = np.empty(n_windows, dtype=np.int64)
    dev = np.empty(n_windows)
    unique = 0
    for w in range(n_windows):
        fill[w] = min(seq_len, total_tokens - w * seq_len)
        dev[w] = _deviation(tokens[w], fill[w], tau, -1, 0, -1, 0)
        for c in range(n_clusters):
            unique += docs[w, c] > 0
    total = dev.sum()
    if n < 2:
        return total
    ratio = _cooling(t_start, t_end, iterations)
    temp = t_start
    for _ in range(iterations):
        temp *= ratio
        i = np.random.randint(n - 1)
        j = min(i + 1 + np.random.randint(max_gap), n - 1)
        a, b = seq[i], seq[j]
        if labels[a] == labels[b] and counts[a] == counts[b]:
            continue
        w0 = max(offset[i] - 1, 0) // seq_len
        w1 = max(offset[j + 1] - 1, 0) // seq_len
        if w1 - w0 + 1 > max_windows:
            continue
        new_tokens = tokens[w0:w1 + 1].copy()
        new_docs = docs[w0:w1 + 1].copy()
        for p in range(i, j + 1):
            _add_split(new_tokens, new_docs, w0, labels[seq[p]], offset[p], counts[seq[p]], -1, seq_len)
        at = offset[i]
        for p in range(i, j + 1):
            d = b if p == i else (a if p == j else seq[p])
            _add_split(new_tokens, new_docs, w0, labels[d], at, counts[d], 1, seq_len)
            at += counts[d]
        gained = 0
        delta = 0.0
        for w in range(w0, w1 + 1):
            for c in range(n_clusters):
                gained += (new_docs[w - w0, c] > 0) - (docs[w, c] > 0)
            delta += _deviation(new_tokens[w - w0], fill[w], tau, -1, 0, -1, 0) - dev[w]
        if unique + gained < min_unique:
            continue
        if _refused(delta, temp):
            continue
        seq[i], seq[j] = b, a
        for p in range(i, j + 1):
            offset[p + 1] = offset[p] + counts[seq[p]]
        for w in range(w0, w1 + 1):
            tokens[w] = new_tokens[w - w0]
            docs[w] = new_docs[w - w0]
            dev[w] = _deviation(tokens[w], fill[w], tau, -1, 0, -1, 0)
        unique += gained
        total += delta
    return total


def _write_order(counts, window_of, first_window, n_windows) -> np.ndarray:
    """The searched windows as an order: in their old sequence, a document of a window or more at its first
    window, each window's other documents longest first, documents without tokens at the end."""
    movable = np.flatnonzero(window_of >= 0)
    movable = movable[np.lexsort((-counts[movable], window_of[movable]))]
    long_docs = np.flatnonzero(first_window >= 0)
    long_docs = long_docs[np.argsort(first_window[long_docs], kind="stable")]
    # Every document sorted by (window, long documents before the window's others, longest first).
    window = np.concatenate([first_window[long_docs], window_of[movable]])
    rank = np.concatenate([np.zeros(long_docs.size), np.ones(movable.size)])
    docs = np.concatenate([long_docs, movable])
    key = np.lexsort((np.arange(docs.size), rank, window))
    empty = np.flatnonzero((window_of < 0) & (first_window < 0))
    return np.concatenate([docs[key], empty])


def search_cell(labels, counts, k, seq_len, packing, iterations_per_doc, min_diversity, seed=SEED,
                t_start=T_START, max_gap=0, restrict=None) -> dict:
    """Search from `paced`'s order for `iterations_per_doc` x N steps, keeping the mean unique clusters per
    window at least min_diversity (or paced's, if lower)."""
    labels = labels.astype(np.int64)
    counts = counts.astype(np.int64)
    tau = global_token_shares(labels, counts, k)
    start = ORDERINGS["paced"](labels, counts, k, OrderingOptions(seq_len=seq_len, packing=packing, seed=seed))
    paced_metrics = window_metrics(labels, counts, k, seq_len, packing, start)
    n_windows = paced_metrics["windows"]
    min_unique = round(paced_metrics["diversity"] * n_windows)
    if np.isfinite(min_diversity):
        min_unique = min(int(np.ceil(min_diversity * n_windows)), min_unique)
    iterations = int(iterations_per_doc * labels.size)
    started = time.perf_counter()
    if packing == "whole":
        window_of, first_window, pinned, tokens, docs, fill = _windows_whole(labels, counts, start, seq_len, k)
        total = _anneal(labels, counts, window_of, pinned, tokens, docs, min_unique, fill, tau, seq_len, iterations,
                        t_start, T_END, seed, max_gap, **(restrict or {}))
        found = _write_order(counts, window_of, first_window, fill.size)
    else:
        found = start.copy()
        docs_per_window = labels.size / n_windows
        total = _anneal_split(labels, counts, found, min_unique, tau, seq_len, k, iterations,
                              int(min(max(2 * docs_per_window, 2), SPLIT_MAX_GAP)), SPLIT_MAX_WINDOWS,
                              t_start, T_END, seed)
    seconds = time.perf_counter() - started
    assert np.array_equal(np.sort(found), np.arange(labels.size))
    found_metrics = window_metrics(labels, counts, k, seq_len, packing, found)
    return {"found_metrics": found_metrics, "paced": paced_metrics["uniformity"],
            "searched_windows": int(n_windows), "searched_objective": float(total / n_windows),
            "found": found_metrics["uniformity"], "found_windows": found_metrics["windows"],
            "bound": float(uniformity_lower_bound(labels, counts, seq_len, k, packing)),
            "iterations": iterations, "seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, required=True, help="the folder eval_corpora.py built and labelled")
    parser.add_argument("--quality", type=Path,
                        default=ROOT / "benchmarks" / "results_ordering_quality_2026-11-26_leaders.json",
                        help="a bench_ordering_quality.py result: its random and stratified figures are the criteria's "
                             "yardsticks, its misses the default cells (default: %(default)s)")
    parser.add_argument("--iterations-per-doc", type=float, default=400,
                        help="steps of the search per document (default %(default)s)")
    parser.add_argument("--synthetic-docs", type=int, default=100_000,
                        help="documents of each synthetic corpus (default %(default)s, as the quality bench)")
    parser.add_argument("--cells", nargs="*", help="corpus:seq_len to run (default: every cell paced misses U in, in --quality)")
    parser.add_argument("--packing", choices=("whole", "split"), help="only this packing model (default: both)")
    parser.add_argument("--t-start", type=float, default=T_START,
                        help=f"starting temperature (default {T_START}; {T_END}: rarely uphill; 0: never)")
    parser.add_argument("--max-window-gap", type=int, default=0,
                        help="packing whole: move a document at most this many windows (default 0: anywhere)")
    parser.add_argument("--forward-only", action="store_true", help="packing whole: partners only in later windows")
    parser.add_argument("--trades-only", action="store_true", help="packing whole: no document moves alone")
    parser.add_argument("--fixed-openers", action="store_true", help="packing whole: each window's longest document stays")
    parser.add_argument("--per-step-diversity", action="store_true",
                        help="packing whole: each step keeps its two windows' unique clusters, as paced's rules do")
    parser.add_argument("--keep-paced-diversity", action="store_true",
                        help="keep paced's unique clusters per window (default: down to stratified's - 0.05)")
    parser.add_argument("--out", type=Path, help="a JSON of the settings and every cell's result")
    args = parser.parse_args()
    whole_only = {"--max-window-gap": args.max_window_gap != 0, "--forward-only": args.forward_only,
                  "--trades-only": args.trades_only, "--fixed-openers": args.fixed_openers,
                  "--per-step-diversity": args.per_step_diversity}
    given = [flag for flag, on in whole_only.items() if on]
    if given and args.packing != "whole":
        parser.error(f"{', '.join(given)}: packing whole only; add --packing whole (the split search ignores them)")

    quality = json.loads(args.quality.read_text())["corpora"]
    wanted = None if args.cells is None else {(c.split(":")[0], int(c.split(":")[1])) for c in args.cells}
    corpora = load_corpora(args.corpora, args.synthetic_docs)
    rows = []
    missing = set() if wanted is None else wanted - {(n, c["seq_len"]) for n in corpora
                                                     for c in quality.get(n, {}).get("cells", [])}
    if missing:
        parser.error(f"--cells {' '.join(f'{n}:{L}' for n, L in sorted(missing))}: no such corpus and length in "
                     f"--corpora {args.corpora} and --quality {args.quality.name}")
    for name, (labels, counts, k) in corpora.items():
        for cell in quality.get(name, {}).get("cells", []):
            if args.packing and cell["packing"] != args.packing:
                continue
            random_u = cell["metrics"]["random"]["uniformity"]
            if wanted is not None:
                if (name, cell["seq_len"]) not in wanted:
                    continue
            elif cell["metrics"]["paced"]["uniformity"] <= UNIFORMITY_RATIO * random_u:
                continue
            row = {"corpus": name, "seq_len": cell["seq_len"], "packing": cell["packing"], "random": random_u,
                   **search_cell(labels, counts, k, cell["seq_len"], cell["packing"], args.iterations_per_doc,
                                 np.inf if args.keep_paced_diversity
                                 else cell["metrics"]["stratified"]["diversity"] - DIVERSITY_MARGIN + 0.005,
                                 t_start=args.t_start, max_gap=args.max_window_gap,
                                 restrict={"forward": args.forward_only, "trades_only": args.trades_only,
                                           "fixed_openers": args.fixed_openers,
                                           "per_step": args.per_step_diversity})}
            found_metrics = row.pop("found_metrics")
            row["found_criteria"] = criteria(found_metrics["diversity"], found_metrics["uniformity"],
                                             found_metrics["boundary_shift"],
                                             cell["metrics"]["stratified"]["diversity"], random_u,
                                             cell["metrics"]["random"]["boundary_shift"])
            row["found_diversity_vs_stratified"] = round(found_metrics["diversity"]
                                                         - cell["metrics"]["stratified"]["diversity"], 3)
            row["found_shift_over_random"] = round(found_metrics["boundary_shift"]
                                                   / cell["metrics"]["random"]["boundary_shift"], 3)
            for key in ("paced", "found", "bound", "searched_objective"):
                row[f"{key}_over_random"] = round(row[key] / random_u, 4)
            rows.append(row)
            print(f"{name:15s} {cell['seq_len']:>7,} {cell['packing']:5s}  bound {row['bound_over_random']:.3f}  "
                  f"found {row['found_over_random']:.3f} (search {row['searched_objective_over_random']:.3f}, "
                  f"{row['found_windows']:,} / {row['searched_windows']:,} windows)  "
                  f"paced {row['paced_over_random']:.3f}  found D {row['found_diversity_vs_stratified']:+.2f} "
                  f"B {row['found_shift_over_random']:.2f}  {row['seconds']} s", flush=True)
    if args.out:
        settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()
                    if key != "out"}
        args.out.write_text(json.dumps({"settings": settings, "iterations_per_doc": args.iterations_per_doc,
                                        "cells": rows}, indent=1))


if __name__ == "__main__":
    main()
