"""Benchmarks: ordering, window statistics and shallow embedding, each against a plain baseline.

    .venv/bin/python benchmarks/bench_core.py [--corpus demo/stdlib.jsonl --model demo/SmolLM2-135M]
                                               [--max-n 10000000] [--out benchmarks/results.json]

Baselines run in the same process on the same data: the plain Python loops of
tests/reference_impl.py (what the reference does) for ordering and windows, and a
per-document loop that does what the reference's embedder does (encode one document, look up
its rows, mean, normalise, then encode it again to count). Loop baselines run on a prefix
small enough to finish, and their per-document rate is compared with ours on the same prefix.
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
sys.path.insert(0, str(ROOT / "tests"))

from diversity_order.diversity import window_diversity  # noqa: E402
from diversity_order.orderings import OrderingOptions, stratified_order  # noqa: E402
from reference_impl import ref_stratified_order, ref_window_diversity  # noqa: E402


def timed(fn, *args, repeat=1, **kwargs):
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - started)
    return best, result


def synthetic(n: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    # Skewed cluster sizes and a heavy-tailed length distribution, source-grouped.
    labels = np.sort(rng.choice(k, size=n, p=rng.dirichlet(np.ones(k) * 0.5)))
    counts = np.minimum(rng.lognormal(6, 1.2, size=n).astype(np.int64), 200_000)
    return labels, counts


def bench_ordering(max_n: int) -> list[dict]:
    rows = []
    stratified_order(*synthetic(100, 5), 5)  # compile outside the timings
    for k, sizes in ((30, [10**4, 10**5, 10**6, 10**7]), (1000, [10**5, 10**6])):
        for n in sizes:
            if n > max_n:
                continue
            labels, counts = synthetic(n, k)
            seconds, order = timed(stratified_order, labels, counts, k, OrderingOptions(), repeat=1 if n >= 10**6 else 3)
            row = {"what": "ordering (stratified)", "n": n, "k": k, "ours_s": round(seconds, 4)}
            # The loop baseline runs on a smaller input drawn the same way (same K and skew).
            loop_n = min(n, 20_000 if k == 30 else 2_000)
            small_labels, small_counts = synthetic(loop_n, k)
            loop_s, loop_order = timed(ref_stratified_order, small_labels.tolist(), small_counts.tolist(), k)
            ours_prefix_s, ours_prefix = timed(stratified_order, small_labels, small_counts, k, OrderingOptions(), repeat=3)
            assert ours_prefix.tolist() == loop_order
            row.update(loop_n=loop_n, loop_s=round(loop_s, 3), ours_on_loop_n_s=round(ours_prefix_s, 5),
                       speedup=round(loop_s / ours_prefix_s, 1), loop_extrapolated_s=round(loop_s * n / loop_n, 1))
            rows.append(row)
            print(row, flush=True)
    return rows


def bench_windows(max_n: int) -> list[dict]:
    rows = []
    window_diversity(*synthetic(100, 5), 1000)
    for n in (10**5, 10**6, 10**7):
        if n > max_n:
            continue
        labels, counts = synthetic(n, 30)
        seconds, out = timed(window_diversity, labels, counts, 131072, repeat=3)
        loop_n = min(n, 10**6)
        loop_s, loop_out = timed(ref_window_diversity, labels[:loop_n].tolist(), counts[:loop_n].tolist(), 131072)
        ours_prefix_s, ours_prefix = timed(window_diversity, labels[:loop_n], counts[:loop_n], 131072, repeat=3)
        assert ours_prefix.tolist() == loop_out
        row = {"what": "window diversity", "n": n, "ours_s": round(seconds, 4), "loop_n": loop_n,
               "loop_s": round(loop_s, 3), "speedup": round(loop_s / ours_prefix_s, 1)}
        rows.append(row)
        print(row, flush=True)
    return rows


def bench_embedding(corpus: Path, model: Path, limit: int) -> list[dict]:
    import torch
    from safetensors import safe_open

    from diversity_order.embed import embed_and_count
    from diversity_order.embedding_table import load_embedding_table
    from diversity_order.records import iter_text_batches, scan_jsonl
    from diversity_order.tokenizer import DocumentTokenizer

    index = scan_jsonl(corpus, progress=False)
    rows_all = np.arange(min(limit, len(index)))
    texts = [t for _, batch in iter_text_batches(index, rows_all) for t in batch]
    tokenizer = DocumentTokenizer(model)
    table = load_embedding_table(model).weight
    torch.set_num_threads(torch.get_num_threads())

    tok_s, (flat, lengths) = timed(lambda: _encode_all(tokenizer, texts), repeat=2)
    tokens = int(lengths.sum())
    ours_s, (vectors, counts, _) = timed(embed_and_count, index, rows_all, tokenizer, table, progress=False, repeat=2)
    assert int(counts.sum()) == tokens

    # The reference's way: one document at a time, encoded twice, arithmetic in the table dtype.
    hf = tokenizer._hf
    with safe_open(str(load_embedding_table(model).file), "pt") as f:
        native = f.get_tensor(load_embedding_table(model).tensor_name)
    loop_docs = texts[: max(1, len(texts) // 4)]

    def per_document():
        out = []
        for text in loop_docs:
            ids = hf.encode(text, add_special_tokens=False)
            if ids:
                v = native[torch.tensor(ids).clamp(0, native.shape[0] - 1)].mean(0)
                out.append((v / v.norm()).float())
            len(hf.encode(text, add_special_tokens=False))
        return out

    loop_s, _ = timed(per_document)
    loop_tokens = int(lengths[: len(loop_docs)].sum())
    row = {
        "what": "tokenize + shallow embed", "documents": len(texts), "tokens": tokens,
        "tokenizer_only_tokens_per_s": round(tokens / tok_s), "ours_tokens_per_s": round(tokens / ours_s),
        "ours_vs_tokenizer": round(tok_s / ours_s, 3),
        "per_document_loop_tokens_per_s": round(loop_tokens / loop_s),
        "speedup_vs_per_document_loop": round((tokens / ours_s) / (loop_tokens / loop_s), 1),
        "torch_threads": torch.get_num_threads(),
    }
    print(row, flush=True)
    return [row]


def _encode_all(tokenizer, texts, batch=1024):
    flats, lengths = [], []
    for lo in range(0, len(texts), batch):
        f, n = tokenizer.encode_batch(texts[lo : lo + batch])
        flats.append(f)
        lengths.append(n)
    return np.concatenate(flats), np.concatenate(lengths)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=ROOT / "demo" / "stdlib.jsonl")
    p.add_argument("--model", type=Path, default=ROOT / "demo" / "SmolLM2-135M")
    p.add_argument("--max-n", type=int, default=10**7)
    p.add_argument("--embed-limit", type=int, default=10**9)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_core.json")
    args = p.parse_args()
    results = {"machine": f"{platform.machine()}, {platform.processor() or '?'}, "
                          f"{__import__('os').cpu_count()} cores, Python {platform.python_version()}"}
    results["ordering"] = bench_ordering(args.max_n)
    results["windows"] = bench_windows(args.max_n)
    if args.corpus.exists() and (args.model / "config.json").exists():
        results["embedding"] = bench_embedding(args.corpus, args.model, args.embed_limit)
    else:
        print(f"skipping embedding benchmark: run `make model corpus` first ({args.corpus}, {args.model})")
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {args.out}")


if __name__ == "__main__":
    main()
