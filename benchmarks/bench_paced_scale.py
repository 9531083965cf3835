"""`paced` alone at scale: wall time and the process's peak memory for one order of N synthetic documents.

    .venv/bin/python benchmarks/bench_paced_scale.py --docs 10000000 --packing whole [--seq-len 16384]

The `uneven-sizes` synthetic corpus (K = 30, heavy-tailed lengths) of ``--docs`` documents; one run
after a warm-up on 5,000 documents (numba compiles outside the timing). Run each packing in its own
process: the peak resident memory is the process's, reported next to what the corpus itself took.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from diversity_order.orderings import ORDERINGS, OrderingOptions  # noqa: E402
from diversity_order.synthetic import skewed_corpus  # noqa: E402


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=10_000_000)
    p.add_argument("--packing", choices=("whole", "split"), default="whole")
    p.add_argument("--seq-len", type=int, default=16384)
    args = p.parse_args()
    labels, counts, k = skewed_corpus("uneven-sizes", args.docs, seed=1)
    after_corpus = peak_mb()
    options = OrderingOptions(seq_len=args.seq_len, packing=args.packing, seed=42)
    ORDERINGS["paced"](labels[:5000], counts[:5000], k, options)
    started = time.perf_counter()
    order = ORDERINGS["paced"](labels, counts, k, options)
    seconds = time.perf_counter() - started
    assert order.size == labels.size
    print(f"paced, {args.docs:,} documents, packing {args.packing}, seq-len {args.seq_len:,}: {seconds:.1f} s, "
          f"peak RSS {peak_mb():.0f} MB ({after_corpus:.0f} MB after generating the corpus)")


if __name__ == "__main__":
    main()
