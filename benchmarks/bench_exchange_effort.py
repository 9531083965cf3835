"""What more effort in `paced`'s rule 5 (trades between nearby windows) buys, on the whole evaluation suite.

    .venv/bin/python benchmarks/bench_exchange_effort.py --corpora CORPORA \
        --baseline benchmarks/results_ordering_quality_2026-11-25_rule6.json \
        [--effort PASSES TRIES SPAN_WINDOWS ...] [--out benchmarks/results_exchange_effort.json]

For each effort setting (passes of the sweep x partners drawn per document x windows' worth of
documents they are drawn from; a partner's window at most 4 x SPAN_WINDOWS on, as in the package)
and every cell of bench_ordering_quality.py: `paced`'s greedy (rules 1-4, seed 42), the sweeps (each
pass seeded anew), then rule 6 packing split. The D, U and B verdicts use the baseline run's
stratified and random-shuffle figures for the same cell (same corpora, same labels). Prints, per
setting, the cells meeting each criterion (tuning and held-out corpora apart), the U of each cell
`paced` misses, and the time of the sweeps alone on 1M documents (`uneven-sizes`, whole 16,384,
best of 3). The package's setting is 1 8 8.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ordering_quality import SEED, load_corpora, verdict, window_metrics  # noqa: E402

from diversity_order.diversity import BOUNDARY_FRACTION, global_token_shares  # noqa: E402
from diversity_order.orderings import OrderingOptions  # noqa: E402
from diversity_order.orderings.exchange import _sweep  # noqa: E402
from diversity_order.orderings.paced import paced_greedy_order  # noqa: E402
from diversity_order.orderings.recut import recut_pass  # noqa: E402
from diversity_order.packing import SPLIT, packing_model  # noqa: E402
from diversity_order.synthetic import skewed_corpus  # noqa: E402


def sweeps(order, labels, counts, seq_len, shares, model, effort) -> np.ndarray:
    passes, tries, span = effort
    for number in range(passes):
        doc = order.copy()
        order = _sweep(doc, labels[doc], counts[doc], seq_len, model, shares, SEED + number, tries, span, 4 * span,
                       BOUNDARY_FRACTION)
    return order


def effortful_paced(labels, counts, k, seq_len, packing, effort) -> np.ndarray:
    model = packing_model(packing)
    shares = global_token_shares(labels, counts, k)
    order = paced_greedy_order(labels, counts, k, OrderingOptions(seq_len=seq_len, packing=packing, seed=SEED))
    order = sweeps(order, labels, counts, seq_len, shares, model, effort)
    return recut_pass(order, labels, counts, seq_len, shares) if model == SPLIT else order


def sweep_seconds(effort, n_docs=1_000_000) -> float:
    labels, counts, k = skewed_corpus("uneven-sizes", n_docs, seed=1)
    labels, counts = np.asarray(labels, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    shares = global_token_shares(labels, counts, k)
    order = paced_greedy_order(labels, counts, k, OrderingOptions(seq_len=16384, packing="whole", seed=SEED))
    model = packing_model("whole")
    sweeps(order[:2000], labels, counts, 16384, shares, model, (1, 1, 1))  # compile outside the timing
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        sweeps(order, labels, counts, 16384, shares, model, effort)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", type=Path, required=True, help="eval_corpora.py's output folder")
    p.add_argument("--baseline", type=Path, required=True, help="a bench_ordering_quality.py results JSON")
    p.add_argument("--effort", nargs=3, type=int, action="append", metavar=("PASSES", "TRIES", "SPAN_WINDOWS"))
    p.add_argument("--synthetic-docs", type=int, default=100_000)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_exchange_effort.json")
    args = p.parse_args()
    efforts = [tuple(e) for e in (args.effort or [[1, 8, 8], [4, 8, 8], [4, 32, 32], [8, 64, 64]])]
    baseline = json.loads(args.baseline.read_text())["corpora"]
    corpora = load_corpora(args.corpora, args.synthetic_docs)
    results = []
    for effort in efforts:
        cells = []
        for name, (labels, counts, k) in corpora.items():
            labels, counts = np.asarray(labels, dtype=np.int64), np.asarray(counts, dtype=np.int64)
            for base in baseline[name]["cells"]:
                seq_len, packing = base["seq_len"], base["packing"]
                order = effortful_paced(labels, counts, k, seq_len, packing, effort)
                metrics = window_metrics(labels, counts, k, seq_len, packing, order)
                random = base["metrics"]["random"]
                cells.append({"corpus": name, "role": baseline[name]["role"], "seq_len": seq_len, "packing": packing,
                              "u_over_random": metrics["uniformity"] / random["uniformity"],
                              "verdict": verdict(metrics, base["metrics"]["stratified"], random)})
        seconds = sweep_seconds(effort)
        results.append({"passes": effort[0], "tries": effort[1], "span_windows": effort[2],
                        "sweep_seconds_1m": round(seconds, 3), "cells": cells})
        print(f"passes {effort[0]} x tries {effort[1]} x span {effort[2]} windows: sweeps on 1M documents "
              f"{seconds:.2f} s")
        for role in ("tuning", "held-out"):
            mine = [c for c in cells if c["role"] == role]
            met = {c: sum(x["verdict"][c] for x in mine) for c in ("D", "U", "B")}
            print(f"  {role}: {len(mine)} cells, D {met['D']}, U {met['U']}, B {met['B']}, "
                  f"all three {sum(all(x['verdict'].values()) for x in mine)}")
        print("  U misses: " + ", ".join(f"{c['corpus']} {c['seq_len']} {c['packing']} {c['u_over_random']:.3f}"
                                         for c in cells if not c["verdict"]["U"]), flush=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
