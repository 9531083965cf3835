"""Where token-share uniformity comes from: windows a single document dominates, and the rest.

    .venv/bin/python benchmarks/bench_uniformity_sources.py --corpora CORPORA [--threshold 0.3]
        [--out benchmarks/results_uniformity_sources.json]

For the demo and every real evaluation corpus (built and labelled by eval_corpora.py) x seq-len x packing model of
bench_ordering_quality.py, packs `paced`'s order (seed 42) and a random shuffle (seed 0) and splits
each order's windows in two: those where one document's piece holds at least ``--threshold`` of
the window's ``seq_len`` tokens, and the others. Such a window's uniformity (max over clusters of
|share - global share|) is at least that piece's share minus its cluster's global share, whatever
the order; the order only decides which windows the large pieces share. Prints, per cell: U of
paced / U of the shuffle; the share of windows with a large piece under each; the share of each
order's total U those windows carry; and paced / shuffle on the other windows alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from numba import njit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import eval_corpora  # noqa: E402
from bench_ordering_quality import PACKINGS, SEED, SEQ_LENS  # noqa: E402

from diversity_order import diversity  # noqa: E402
from diversity_order.orderings import ORDERINGS, OrderingOptions  # noqa: E402


@njit(cache=True)
def largest_piece_share(tokens, seq_len, n_windows, split):
    """Per packed window, the largest share of ``seq_len`` one document's piece holds (packing as packing.py)."""
    largest = np.zeros(n_windows)
    window, fill = 0, 0
    for t in tokens:
        if not split and fill > 0 and fill + t > seq_len:
            window, fill = window + 1, 0
        rest = t
        while rest > 0:
            if fill == seq_len:
                window, fill = window + 1, 0
            piece = min(rest, seq_len - fill)
            if window < n_windows:
                largest[window] = max(largest[window], piece / seq_len)
            fill, rest = fill + piece, rest - piece
    return largest


def cell(labels, counts, k, seq_len, packing, threshold) -> dict:
    out = {}
    orders = {"paced": ORDERINGS["paced"](labels, counts, k, OrderingOptions(seq_len=seq_len, packing=packing,
                                                                            seed=SEED)),
              "random": np.random.default_rng(0).permutation(labels.size)}
    for name, order in orders.items():
        deviation = diversity.window_share_deviation(labels, counts, seq_len, order, k, packing)
        large = largest_piece_share(counts[order], seq_len, deviation.size, packing == "split") >= threshold
        out[name] = {"uniformity": float(deviation.mean()), "windows_with_a_large_piece": float(large.mean()),
                     "their_share_of_u": float(deviation[large].sum() / max(deviation.sum(), 1e-12)),
                     "uniformity_of_the_other_windows": float(deviation[~large].mean()) if (~large).any() else 0.0}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", type=Path, required=True, help="eval_corpora.py's output folder")
    p.add_argument("--threshold", type=float, default=0.3, help="a large piece holds at least this share of a window")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_uniformity_sources.json")
    args = p.parse_args()
    results = []
    print("| corpus | seq-len | packing | U paced / random | windows with a large piece (paced, random) "
          "| their share of U (paced, random) | paced / random on the other windows |\n|---|---:|---|---:|---|---|---:|")
    for name in ("demo", *eval_corpora.CORPORA):
        labels, counts = eval_corpora.load(args.corpora, name)
        k = int(labels.max()) + 1
        for seq_len in SEQ_LENS:
            for packing in PACKINGS:
                r = cell(labels, counts, k, seq_len, packing, args.threshold)
                a, b = r["paced"], r["random"]
                print(f"| {name} | {seq_len:,} | {packing} | {a['uniformity'] / b['uniformity']:.2f} "
                      f"| {a['windows_with_a_large_piece']:.0%}, {b['windows_with_a_large_piece']:.0%} "
                      f"| {a['their_share_of_u']:.0%}, {b['their_share_of_u']:.0%} "
                      f"| {a['uniformity_of_the_other_windows'] / max(b['uniformity_of_the_other_windows'], 1e-12):.2f} |",
                      flush=True)
                results.append({"corpus": name, "seq_len": seq_len, "packing": packing, "threshold": args.threshold,
                                **r})
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
