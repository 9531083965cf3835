"""Benchmark: every ordering's quality on the demo corpus and the skewed synthetic corpora, and run time at 1M documents.

    .venv/bin/python benchmarks/bench_orderings.py [--demo-labels demo/out/stdlib_curated_labels.npy
                                                    --demo-counts demo/stdlib_token_counts.npy]
                                                   [--synthetic-docs 100000] [--timing-docs 1000000]
                                                   [--out benchmarks/results_orderings.json]

Part 1 runs strategies.compare_strategies (the code behind --compare-strategies) at seq-len 4096,
16384 and 131072 on the demo corpus's labels and token counts (from `make demo`) and on each
corpus of diversity_order.synthetic, and checks the claim the README makes: balanced is at least
as diverse as stratified and more uniform, with less boundary shift, than a random shuffle.
Part 2 times each ordering on 1M synthetic documents (K=30), and at K=1000, against stratified
(the reference's algorithm) in the same run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diversity_order import ordering_report as strategies  # noqa: E402
from diversity_order import orderings as ordering  # noqa: E402
from diversity_order.synthetic import SKEWED_CORPORA, skewed_corpus  # noqa: E402

SEQ_LENS = [4096, 16384, 131072]
CLUSTER_ORDERINGS = list(ordering.CLUSTER_ORDERINGS)


def quality_part(corpora: dict) -> dict:
    results = {}
    for name, (labels, counts, k) in corpora.items():
        rows, _ = strategies.compare_strategies(labels, counts, k, SEQ_LENS, ordering.OrderingOptions(),
                                                CLUSTER_ORDERINGS)
        wins = strategies.verdicts(rows)
        results[name] = {"n_docs": int(labels.size), "n_clusters": k, "tokens": int(counts.sum()), "rows": rows,
                         "balanced_wins_at": [s for s, names in wins.items() if "balanced" in names]}
        print(strategies.markdown_table(rows, k, f"{name} ({labels.size:,} documents, {counts.sum():,} tokens)"))
        print(f"balanced wins at seq-len {results[name]['balanced_wins_at']} of {SEQ_LENS}\n", flush=True)
    return results


def timing_part(n_docs: int) -> list[dict]:
    out = []
    rng = np.random.default_rng(0)
    for k, names in ((30, CLUSTER_ORDERINGS + ["zigzag", "saw"]), (1000, ["stratified", "balanced", "bin-packing",
                                                                         "token-balanced"])):
        labels, counts, k = skewed_corpus("uneven-sizes" if k == 30 else "k1000", n_docs, seed=1)
        options = ordering.OrderingOptions(seq_len=16384, scores=rng.random(labels.size), jitter_window=64)
        ordering.ORDERINGS["stratified"](labels[:1000], counts[:1000], k, options.__class__(seq_len=16384))  # compile
        baseline = None
        for name in names:
            small = options.__class__(seq_len=16384, scores=options.scores[:2000], jitter_window=64)
            ordering.ORDERINGS[name](labels[:2000], counts[:2000], k, small)  # numba compile outside the timing
            started = time.perf_counter()
            order = ordering.ORDERINGS[name](labels, counts, k, options)
            seconds = time.perf_counter() - started
            assert order.size == labels.size
            baseline = seconds if name == "stratified" else baseline
            row = {"ordering": name, "n_docs": int(labels.size), "n_clusters": k, "seconds": round(seconds, 3),
                   "vs_stratified": round(seconds / baseline, 2) if baseline else None}
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo-labels", type=Path, default=ROOT / "demo/out/stdlib_curated_labels.npy")
    p.add_argument("--demo-counts", type=Path, default=ROOT / "demo/stdlib_token_counts.npy")
    p.add_argument("--synthetic-docs", type=int, default=100_000)
    p.add_argument("--timing-docs", type=int, default=1_000_000)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results_orderings.json")
    args = p.parse_args()

    corpora = {}
    if args.demo_labels.exists() and args.demo_counts.exists():
        labels = np.load(args.demo_labels).astype(np.int64)
        corpora["demo (stdlib)"] = (labels, np.load(args.demo_counts).astype(np.int64), int(labels.max()) + 1)
    else:
        print(f"no demo labels at {args.demo_labels} (run `make demo` first); synthetic corpora only")
    for name in SKEWED_CORPORA:
        corpora[name] = skewed_corpus(name, args.synthetic_docs)
    results = {"machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
               "python": platform.python_version(), "quality": quality_part(corpora),
               "timing": timing_part(args.timing_docs)}
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
