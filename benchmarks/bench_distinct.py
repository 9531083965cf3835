"""Benchmark: distinct values of per-record arrays (row numbers, fingerprints), ``arrays.distinct`` against
numpy's ``np.unique`` on the same data, in the same process.

    .venv/bin/python benchmarks/bench_distinct.py [--sizes 1000000 10000000] [--out results.json]

numpy 2.4's ``np.unique`` hashes (C++ set) when asked only for the values; on millions of distinct integers
that was far slower than sorting. The caches count the rows a rerun reuses with it, and the input check of
overlapping files dedupes each file's fingerprints.
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

from diversity_order.arrays import distinct  # noqa: E402


def timed(fn, values) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    result = fn(values)
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for size in args.sizes:
        for name, values in (("row numbers (a permutation)", rng.permutation(size)),
                             ("fingerprints (random uint64)", rng.integers(0, 2**63, size, dtype=np.uint64)),
                             ("cluster labels (30 values)", rng.integers(0, 30, size))):
            numpy_seconds, expected = timed(np.unique, values)
            ours_seconds, found = timed(distinct, values)
            assert np.array_equal(expected, found)
            rows.append({"size": size, "values": name, "np_unique_s": round(numpy_seconds, 3),
                         "distinct_s": round(ours_seconds, 3), "ratio": round(ours_seconds / numpy_seconds, 4)})
            print(f"{size:>11,} {name:<30} np.unique {numpy_seconds:7.2f} s  distinct {ours_seconds:6.2f} s  "
                  f"ratio {ours_seconds / numpy_seconds:.3f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"numpy": np.__version__, "machine": platform.platform(),
                                        "processor": platform.processor(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
