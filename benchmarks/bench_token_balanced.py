"""token-balanced with a --balance-field of many categories: each step scoring every pool on one core against
scoring them in runs on every core (``token_share.PARALLEL_POOLS``), in one process, the orders checked equal.

    .venv/bin/python benchmarks/bench_token_balanced.py [--docs 100000 400000] [--categories 200] [--out FILE]

The synthetic ``uneven-sizes`` corpus (K = 30, 10 length bins) with a field of ``--categories`` categories drawn
at random per document: pools = (cluster, length bin, category) combinations that occur. Prints, per size,
the pools, both times (one warm-up on 3,000 documents first, so numba's compile is not timed) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diversity_order.orderings import OrderingOptions  # noqa: E402
from diversity_order.orderings.token_share import PARALLEL_POOLS, length_bins, token_balanced_order  # noqa: E402
from diversity_order.synthetic import skewed_corpus  # noqa: E402

ONE_CORE = 1 << 62  # parallel_pools past any pool count: every step scores on one core


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, nargs="+", default=[100_000, 400_000])
    p.add_argument("--categories", type=int, default=200)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rows = []
    for n in args.docs:
        labels, counts, k = skewed_corpus("uneven-sizes", n, seed=0)
        field = np.random.default_rng(1).integers(0, args.categories, n)
        options = OrderingOptions(balance_groups=field)
        warm = OrderingOptions(balance_groups=field[:3000])
        for pools in (ONE_CORE, 1):
            token_balanced_order(labels[:3000], counts[:3000], k, warm, parallel_pools=pools)
        seconds, orders = {}, {}
        for name, pools in (("one core", ONE_CORE), ("every core", PARALLEL_POOLS)):
            started = time.perf_counter()
            orders[name] = token_balanced_order(labels, counts, k, options, parallel_pools=pools)
            seconds[name] = time.perf_counter() - started
        assert np.array_equal(orders["one core"], orders["every core"]), "the two scorings chose different orders"
        bins = length_bins(counts, options.length_bins)
        n_pools = len(np.unique(np.stack([labels, bins, field], axis=1), axis=0))
        row = {"docs": n, "categories": args.categories, "pools": n_pools,
               "one_core_s": round(seconds["one core"], 2), "every_core_s": round(seconds["every core"], 2),
               "ratio": round(seconds["every core"] / seconds["one core"], 3), "orders_equal": True}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"threads": numba.get_num_threads(), "cpus": os.cpu_count(), "parallel_pools": PARALLEL_POOLS,
              "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
