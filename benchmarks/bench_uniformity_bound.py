"""How close the lower bound on U (``diversity.uniformity_lower_bound``) comes to the best order, and where
it proves a criterion out of reach.

    .venv/bin/python benchmarks/bench_uniformity_bound.py [--cases 300] [--corpora CORPORA]
        [--quality benchmarks/results_ordering_quality_2026-11-25_rule7.json] [--out results.json]

1. Small inputs: CASES random inputs (1-6 documents of 1-3 clusters, lengths up to 5, 20 or 45
   tokens, seq_len 2-16, seeded), every order tried; per packing model the 10th/50th/90th percentile
   of bound / best order's U over the cases where the best is above 0, how often the bound equals the
   best (within the bound's threshold grid), and that it never exceeds it.
2. With --corpora (bench_ordering_quality.py's corpora) and --quality (a results JSON of that script,
   for the random shuffles' U): per cell the bound / random, and the cells where it is above the U
   criterion's 0.8 (no order of those documents meets it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import permutations
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from diversity_order.diversity import BOUND_GRID, uniformity_lower_bound, window_share_deviation  # noqa: E402
from diversity_order.ordering_report import uniformity_out_of_reach  # noqa: E402

N_CLUSTERS = 3


def small_cases(n_cases: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ratios = {"whole": [], "split": []}
    equal = {"whole": 0, "split": 0}
    for _ in range(n_cases):
        n_docs = int(rng.integers(1, 7))
        labels = rng.integers(0, int(rng.integers(1, N_CLUSTERS + 1)), n_docs)
        counts = rng.integers(0, int(rng.choice([5, 20, 45])), n_docs)
        seq_len = int(rng.integers(2, 17))
        for packing in ratios:
            bound = uniformity_lower_bound(labels, counts, seq_len, N_CLUSTERS, packing)
            best = min(window_share_deviation(labels, counts, seq_len, np.array(order), N_CLUSTERS, packing).mean()
                       for order in permutations(range(n_docs)))
            assert bound <= best + 1e-12, (labels.tolist(), counts.tolist(), seq_len, packing, bound, best)
            if best > 0:
                ratios[packing].append(bound / best)
                equal[packing] += int(bound >= best - 2.0 / BOUND_GRID)
    return {packing: {"cases": len(v), "bound_over_best_p10_p50_p90": np.percentile(v, [10, 50, 90]).round(3).tolist(),
                      "equal_to_best": equal[packing]} for packing, v in ratios.items()}


def suite_cells(corpora_dir: Path, quality_json: Path, synthetic_docs: int) -> list[dict]:
    from bench_ordering_quality import load_corpora

    quality = json.loads(quality_json.read_text())["corpora"]
    rows = []
    for name, (labels, counts, k) in load_corpora(corpora_dir, synthetic_docs).items():
        for cell in quality.get(name, {}).get("cells", []):
            start = time.perf_counter()
            bound = uniformity_lower_bound(labels, counts, cell["seq_len"], k, cell["packing"])
            seconds = time.perf_counter() - start
            random_u = cell["metrics"]["random"]["uniformity"]
            rows.append({"corpus": name, "seq_len": cell["seq_len"], "packing": cell["packing"],
                         "bound_over_random": round(bound / random_u, 4),
                         "paced_over_random": round(cell["metrics"]["paced"]["uniformity"] / random_u, 4),
                         "out_of_reach": uniformity_out_of_reach(bound, random_u), "seconds": round(seconds, 4)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--corpora", type=Path)
    parser.add_argument("--quality", type=Path,
                        default=ROOT / "benchmarks" / "results_ordering_quality_2026-11-25_rule7.json")
    parser.add_argument("--synthetic-docs", type=int, default=100_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = {"small_cases": small_cases(args.cases)}
    print(json.dumps(results["small_cases"], indent=1), flush=True)
    if args.corpora:
        results["cells"] = suite_cells(args.corpora, args.quality, args.synthetic_docs)
        for row in results["cells"]:
            print(f"{row['corpus']:16s} {row['seq_len']:>7,d} {row['packing']:5s} bound {row['bound_over_random']:.3f}"
                  f" paced {row['paced_over_random']:.3f} x random{'  OUT OF REACH' if row['out_of_reach'] else ''}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
