"""Packing whole: how full each order's sequences are, and how far its uniformity sits above what its grouping forces.

    .venv/bin/python benchmarks/bench_whole_packing.py --corpora CORPORA [--synthetic-docs 100000]
        [--out benchmarks/results_whole_packing.json]

For every corpus of bench_ordering_quality.py (the demo, eval_corpora.py's real corpora, the synthetic
ones) at each of its sequence lengths, documents packed whole, for `paced` (seed 42), `stratified`,
random shuffles (seeds 0-4, averaged) and `excess-best-fit` (below), per order:

- fill: tokens / (seq_len x windows), 1 - padding;
- U: mean over windows of max_k |share_k - tau_k| (the package's measure), and U weighted by each
  window's tokens (the uniformity an average training token sees);
- floor: mean over windows of max over the window's pieces of (piece / window tokens - tau of its
  cluster), a lower bound on each window's deviation that only the grouping sets (which documents
  share a window, not their order inside it);
- clusters per window.

`excess-best-fit` is the grouping behind the lower bound's numerator: pieces in order of excess
(piece / seq_len - tau), each into the open window with the least room that holds it, windows in a
seeded random order. It shows what putting the large pieces together does to U.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from pathlib import Path

import numpy as np
from numba import njit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ordering_quality import RANDOM_SEEDS, SEED, SEQ_LENS, load_corpora  # noqa: E402

from diversity_order import diversity  # noqa: E402
from diversity_order.orderings import ORDERINGS, OrderingOptions  # noqa: E402
from diversity_order.packing import WHOLE, n_pieces, piece_tokens, place  # noqa: E402


@njit(cache=True)
def _close(window_tokens, largest_excess, fill, shares, out, n_out):
    worst = 0.0
    for k in range(shares.shape[0]):
        worst = max(worst, abs(window_tokens[k] / fill - shares[k]))
        window_tokens[k] = 0
    out[n_out, 0] = worst
    out[n_out, 1] = fill
    floor = 0.0
    for j in range(largest_excess.shape[0]):  # (piece, cluster share) pairs of the window
        if largest_excess[j, 0] < 0:
            break
        floor = max(floor, largest_excess[j, 0] / fill - largest_excess[j, 1])
        largest_excess[j, 0] = -1.0
    out[n_out, 2] = floor
    return n_out + 1


@njit(cache=True)
def window_stats(labels, counts, seq_len, shares):
    """Per window (packing whole, as packing.py): deviation, tokens, grouping floor."""
    out = np.zeros((labels.shape[0] * 2 + 2, 3))
    pieces = np.full((labels.shape[0] + 1, 2), -1.0)  # the open window's pieces
    window_tokens = np.zeros(shares.shape[0])
    n_out, fill, n_open = 0, 0, 0
    for i in range(labels.shape[0]):
        c = labels[i]
        close_first, head, n_full, tail, close_last = place(fill, counts[i], seq_len, WHOLE)
        for p in range(-1, n_pieces(n_full, tail)):
            if ((p == -1 and close_first) or p > 0) and fill > 0:
                n_out = _close(window_tokens, pieces, fill, shares, out, n_out)
                fill, n_open = 0, 0
            if p >= 0:
                tokens = piece_tokens(p, head, n_full, tail, seq_len)
                window_tokens[c] += tokens
                fill += tokens
                pieces[n_open, 0] = tokens
                pieces[n_open, 1] = shares[c]
                n_open += 1
        if close_last and fill > 0:
            n_out = _close(window_tokens, pieces, fill, shares, out, n_out)
            fill, n_open = 0, 0
    if fill > 0:
        n_out = _close(window_tokens, pieces, fill, shares, out, n_out)
    return out[:n_out]


def excess_best_fit(labels, counts, seq_len, shares, seed) -> np.ndarray:
    long = counts >= seq_len
    piece = np.where(long, counts % seq_len, counts)
    rooms: list[tuple[int, int]] = []  # (room left, window), sorted
    windows: list[list[int]] = []
    for i in np.argsort(-(piece / seq_len - shares[labels]), kind="stable"):
        at = len(rooms) if long[i] else bisect.bisect_left(rooms, (int(piece[i]), -1))
        if at < len(rooms):
            room, w = rooms.pop(at)
            windows[w].append(int(i))
        else:  # a long document's remainder opens its own window, as packing whole does
            room, w = seq_len, len(windows)
            windows.append([int(i)])
        if room - piece[i] > 0:
            bisect.insort(rooms, (int(room - piece[i]), w))
    order = []
    for w in np.random.default_rng(seed).permutation(len(windows)):
        order += sorted(windows[w], key=lambda d: (not long[d], -piece[d]))  # a long document first
    return np.array(order, dtype=np.int64)


def measure(labels, counts, k, seq_len, shares, order) -> dict:
    stats = window_stats(labels[order], counts[order], seq_len, shares)
    deviation, tokens, floor = stats[:, 0], stats[:, 1], stats[:, 2]
    return {"fill": float(tokens.sum() / (seq_len * tokens.size)), "uniformity": float(deviation.mean()),
            "token_weighted_uniformity": float((deviation * tokens).sum() / tokens.sum()),
            "grouping_floor": float(floor.mean()), "windows": int(tokens.size),
            "diversity": float(diversity.window_diversity(labels, counts, seq_len, order, "whole").mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", type=Path, required=True, help="eval_corpora.py's output folder")
    p.add_argument("--synthetic-docs", type=int, default=100_000)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_whole_packing.json")
    args = p.parse_args()
    results = []
    print("| corpus | seq-len | fill: random / stratified / paced | U / random: paced (token-weighted) "
          "| paced: U, floor | random: U, floor | excess-best-fit: U / random, clusters (stratified) |")
    print("|---|---:|---|---|---|---|---|")
    for name, (labels, counts, k) in load_corpora(args.corpora, args.synthetic_docs).items():
        labels, counts = np.asarray(labels, dtype=np.int64), np.asarray(counts, dtype=np.int64)
        shares = diversity.global_token_shares(labels, counts, k)
        for seq_len in SEQ_LENS:
            options = OrderingOptions(seq_len=seq_len, packing="whole", seed=SEED)
            row = {name_: measure(labels, counts, k, seq_len, shares, ORDERINGS[name_](labels, counts, k, options))
                   for name_ in ("paced", "stratified")}
            shuffles = [measure(labels, counts, k, seq_len, shares, np.random.default_rng(s).permutation(labels.size))
                        for s in RANDOM_SEEDS]
            row["random"] = {key: float(np.mean([m[key] for m in shuffles])) for key in shuffles[0]}
            row["excess-best-fit"] = measure(labels, counts, k, seq_len, shares,
                                             excess_best_fit(labels, counts, seq_len, shares, 1))
            pc, st, rd, fit = row["paced"], row["stratified"], row["random"], row["excess-best-fit"]
            print(f"| {name} | {seq_len:,} | {rd['fill']:.3f} / {st['fill']:.3f} / {pc['fill']:.3f} "
                  f"| {pc['uniformity'] / rd['uniformity']:.3f} "
                  f"({pc['token_weighted_uniformity'] / rd['token_weighted_uniformity']:.3f}) "
                  f"| {pc['uniformity']:.4f}, {pc['grouping_floor']:.4f} | {rd['uniformity']:.4f}, "
                  f"{rd['grouping_floor']:.4f} | {fit['uniformity'] / rd['uniformity']:.3f}, "
                  f"{fit['diversity']:.2f} ({st['diversity']:.2f}) |", flush=True)
            results.append({"corpus": name, "seq_len": seq_len, "packing": "whole", **row})
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
