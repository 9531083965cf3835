"""How well each ordering balances a --balance-field (the records' sources), against a random shuffle.

    .venv/bin/python benchmarks/bench_balance_field.py --corpora CORPORA [--out benchmarks/results_balance_field.json]

For every real evaluation corpus (built and labelled by eval_corpora.py; each record has its "source", the
package or file it came from): the sources' token-share uniformity (mean over windows of the largest
|source share - global share|) and boundary shift (first vs last 5% of tokens), as `ordering_quality`
measures them for clusters, under random (seed 42), stratified, balanced and token-balanced (both given
the sources as --balance-field) and paced (which does not read it). Two category sets: the sources as they
are (74-207 of them, each inside few clusters) and the sources hashed into 4 groups (categories that cut
across clusters). At 4,096 tokens packed split and 16,384 packed whole. Prints a table per corpus and, at the
end, how many cells each ordering beats the shuffle in, and its median ratio to the shuffle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import eval_corpora  # noqa: E402

from diversity_order import diversity  # noqa: E402
from diversity_order.orderings import ORDERINGS, OrderingOptions  # noqa: E402

ORDERS = ("random", "stratified", "balanced", "token-balanced", "paced")
READS_FIELD = {"balanced", "token-balanced"}
CELLS = ((4096, "split"), (16384, "whole"))
GROUPS = 4  # the hashed category set


def categories(sources: list[str], hashed: bool) -> np.ndarray:
    names = [str(zlib.crc32(s.encode()) % GROUPS) for s in sources] if hashed else sources
    ids = {name: i for i, name in enumerate(dict.fromkeys(names))}
    return np.array([ids[name] for name in names], dtype=np.int64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", type=Path, required=True, help="eval_corpora.py's output folder")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_balance_field.json")
    args = p.parse_args()
    results = []
    for name in eval_corpora.CORPORA:
        labels, counts = eval_corpora.load(args.corpora, name)
        with open(args.corpora / f"{name}.jsonl", encoding="utf-8") as handle:
            sources = [json.loads(line)["source"] for line in handle if line.strip()]
        n_clusters = int(labels.max()) + 1
        for hashed in (False, True):
            ids = categories(sources, hashed)
            k = int(ids.max()) + 1
            for seq_len, packing in CELLS:
                plain = OrderingOptions(seq_len=seq_len, packing=packing, seed=42)
                with_field = replace(plain, balance_fields=("source",), balance_groups=ids[:, None])
                row = {"corpus": name, "categories": k, "hashed": hashed, "seq_len": seq_len, "packing": packing}
                for order_name in ORDERS:
                    order = ORDERINGS[order_name](labels, counts, n_clusters,
                                                  with_field if order_name in READS_FIELD else plain)
                    q = diversity.ordering_quality(ids, counts, seq_len, order, k, packing=packing)
                    row[order_name] = {"uniformity": q["uniformity_mean"], "boundary_shift": q["boundary_shift"]}
                results.append(row)
                print(f"{name:15s} {k:4d} categories {seq_len:6,} {packing:5s} | " + " | ".join(
                    f"{o} U {row[o]['uniformity']:.3f} B {row[o]['boundary_shift']:.3f}" for o in ORDERS), flush=True)
    print("\n| ordering | reads the field | source U below the shuffle's | median U / shuffle | source B below the "
          "shuffle's | median B / shuffle |\n|---|---|---:|---:|---:|---:|")
    for order_name in ORDERS[1:]:
        u = [r[order_name]["uniformity"] / r["random"]["uniformity"] for r in results]
        b = [r[order_name]["boundary_shift"] / max(r["random"]["boundary_shift"], 1e-12) for r in results]
        print(f"| {order_name} | {'yes' if order_name in READS_FIELD else 'no'} | {sum(x < 1 for x in u)} of {len(u)} "
              f"| {statistics.median(u):.2f} | {sum(x < 1 for x in b)} of {len(b)} | {statistics.median(b):.2f} |")
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
