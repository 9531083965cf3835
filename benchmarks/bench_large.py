"""Large inputs: peak memory end to end, sample-fit vs full-fit k-means, float16 vs float32 caches.

    .venv/bin/python benchmarks/bench_large.py corpus --docs 1000000 --out /tmp/large/short_1M.jsonl
    .venv/bin/python benchmarks/bench_large.py run --input /tmp/large/short_1M.jsonl [--baseline /work/main] \
        [--extra=--memory-budget=512M]
    .venv/bin/python benchmarks/bench_large.py kmeans --n 1000000 --budget 1G
    .venv/bin/python benchmarks/bench_large.py dtype
    .venv/bin/python benchmarks/bench_large.py tokenize --input /tmp/large/short_1M.jsonl
    .venv/bin/python benchmarks/bench_large.py --work /tmp/large/deep load --input /tmp/large/short_10M.jsonl \
        --rows 2000000 --dim 2880

``corpus`` writes short documents (~``--chars`` characters, consecutive lines of the Python
standard library's own sources, so real code and prose) as JSONL. ``run`` runs curate_dataset.py
under ``/usr/bin/time -v`` (peak RSS of the whole process) with ``--no-plot``, cold (the token-count
and embedding caches an earlier run left are removed first), prints each stage's
time and the peak RSS after it, and with ``--baseline FOLDER`` runs that checkout's script on the
same input and compares the curated bytes, labels and order. ``kmeans`` compares MiniBatchKMeans
fitted on all rows in memory with the out-of-core path (fitted on the sample --memory-budget
allows, every row assigned from the file) on real SmolLM2 vectors of the demo corpus resampled
with noise to ``--n`` rows. ``dtype`` runs the demo corpus with --embedding-dtype float32 and
float16 and reports 1 - cosine between the cached vectors and whether the labels change.
``tokenize`` times the Rust tokenizer alone on the input's texts (``encode_batch_fast``, all
cores, the time of the encode calls only): the floor the end-to-end run is compared against.
``load`` writes a ``--rows`` x ``--dim`` float32 ``.npy`` (a deep model's width; K seeded
centres plus noise, written a block at a time) beside the input's first ``--rows`` records and
runs ``--load-embeddings`` with ``--pca-components 100`` on it, reporting as ``run`` does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEMO = ROOT / "demo"


def write_corpus(target: Path, docs: int, chars: int) -> None:
    """``docs`` documents of consecutive stdlib source lines joined until ~``chars`` characters (cycled)."""
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(target, "w") as out:
        while written < docs:
            for source in sources:
                try:
                    lines = [line.strip() for line in source.read_text(errors="replace").splitlines() if line.strip()]
                except OSError:
                    continue
                piece = []
                for line in lines:
                    piece.append(line)
                    if sum(map(len, piece)) >= chars:
                        out.write(json.dumps({"text": " ".join(piece), "id": written}) + "\n")
                        written, piece = written + 1, []
                        if written >= docs:
                            return


def run_curate(repo: Path, data: Path, out: Path, extra: list[str]) -> dict:
    cmd = ["/usr/bin/time", "-v", sys.executable, str(repo / "curate_dataset.py"), "--input", str(data),
           "--output", str(out), "--model-dir", str(DEMO / "SmolLM2-135M"), "--no-plot", "--no-progress", *extra]
    print("$", " ".join(cmd), flush=True)
    # The run's log goes to a file beside its output, so a run of an hour can be watched (tail -f).
    log_file = out.with_name(out.stem + "_run.log")
    print("  log:", log_file, flush=True)
    started = time.perf_counter()
    with open(log_file, "w") as log:
        done = subprocess.run(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(repo)),
                              stdout=subprocess.DEVNULL, stderr=log)
    wall = time.perf_counter() - started
    stderr = log_file.read_text()
    if done.returncode:
        sys.exit(f"{repo}: exit {done.returncode}\n{stderr[-4000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr).group(1))
    meta = json.loads(Path(str(out)[: -len(".jsonl")] + "_meta.json").read_text())
    plans = [line.split("INFO", 1)[1].strip() for line in stderr.splitlines()
             if " in memory: " in line or " out of core: " in line]
    return {"repo": str(repo), "wall_s": round(wall, 1), "peak_rss_mb": round(peak_kb / 1024), "plans": plans,
            "stages": {stage: {"seconds": round(seconds, 1), "peak_rss_after_mb": round(meta["peak_rss_mb"][stage])}
                       for stage, seconds in meta["timings_seconds"].items()},
            "documents": meta["input_count"], "tokens": meta["total_tokens"]}


def cold(data: Path, out: Path) -> None:
    """Remove the caches a run on ``data`` writing ``out`` would reuse (token counts beside the input,
    embeddings beside the output), so each measured run computes everything."""
    from diversity_order import caches, outputs

    for role in ("token_counts", "embeddings"):
        files = caches.files_for(outputs.output_paths(data, out)[role])
        for path in (files.data, files.fingerprints, files.marker):
            path.unlink(missing_ok=True)


def cmd_run(args) -> None:
    cold(args.input, args.work / "ours.jsonl")
    rows = [run_curate(ROOT, args.input, args.work / "ours.jsonl", args.extra)]
    if args.baseline:
        cold(args.input, args.work / "baseline.jsonl")
        rows.append(run_curate(args.baseline, args.input, args.work / "baseline.jsonl", args.extra))
        same = {"curated_bytes": (args.work / "ours.jsonl").read_bytes() == (args.work / "baseline.jsonl").read_bytes()}
        for name in ("labels", "order"):
            same[name] = bool(np.array_equal(np.load(args.work / f"ours_{name}.npy"),
                                             np.load(args.work / f"baseline_{name}.npy")))
        rows[0]["identical_to_baseline"] = same
    for row in rows:
        print(f"\n{row['repo']}: {row['documents']:,} documents, {row['tokens']:,} tokens, wall {row['wall_s']} s, "
              f"peak RSS {row['peak_rss_mb']:,} MB")
        for plan in row["plans"]:
            print("  ", plan)
        print("| stage | seconds | peak RSS after (MB) |\n|---|---|---|")
        for stage, value in row["stages"].items():
            print(f"| {stage} | {value['seconds']} | {value['peak_rss_after_mb']:,} |")
    if args.baseline:
        print("identical to the baseline:", rows[0]["identical_to_baseline"])
    if args.results:
        args.results.write_text(json.dumps(rows, indent=2) + "\n")


def _inertia(x, labels: np.ndarray, k: int) -> float:
    """Sum of squared distances to the cluster means, a block at a time (x may be a file)."""
    from diversity_order import matrix

    d = matrix.shape(x)[1]
    sums, sizes = np.zeros((k, d)), np.bincount(labels, minlength=k)
    for lo, hi, block in matrix.blocks(x):
        np.add.at(sums, labels[lo:hi], block.astype(np.float64))
    means = sums / np.maximum(sizes, 1)[:, None]
    return float(sum(((block - means[labels[lo:hi]]) ** 2).sum() for lo, hi, block in matrix.blocks(x)))


def cmd_kmeans(args) -> None:
    from diversity_order import clustering, matrix

    base = np.load(DEMO / "out" / "stdlib_curated_embeddings.npy")
    rng = np.random.default_rng(0)
    path = args.work / f"resampled_{args.n}.npy"
    with open(path, "w+b") as handle:  # built a block at a time: the bench itself stays small
        rows = matrix.create_npy(handle, (args.n, base.shape[1]), np.float32)
        for lo in range(0, args.n, 100_000):
            hi = min(lo + 100_000, args.n)
            x = base[rng.integers(0, base.shape[0], hi - lo)] + rng.normal(0, 0.01, (hi - lo, base.shape[1]))
            rows[np.arange(lo, hi)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    file = matrix.MatrixFile.open(path)
    plan = clustering.plan_for(file, matrix.parse_size(args.budget))
    print(plan.reason, flush=True)
    results = []
    for name, fit_sample in (("full fit in memory (faithful)", 0), (f"sample fit ({plan.sample:,} rows)", plan.sample)):
        started = time.perf_counter()
        labels = clustering.kmeans_labels(file, args.k, 42, "sklearn", fit_sample)
        seconds = time.perf_counter() - started
        results.append({"fit": name, "fit_rows": fit_sample or args.n, "seconds": round(seconds, 1),
                        "inertia": round(_inertia(file, labels, args.k), 1)})
        print(results[-1], flush=True)
    results[1]["inertia_vs_full"] = round(results[1]["inertia"] / results[0]["inertia"], 4)
    print(json.dumps(results, indent=2))
    path.unlink()
    if args.results:
        args.results.write_text(json.dumps({"n": args.n, "k": args.k, "budget": args.budget, "results": results},
                                           indent=2) + "\n")


def cmd_dtype(args) -> None:
    out = {}
    for dtype in ("float32", "float16"):
        target = args.work / f"demo_{dtype}.jsonl"
        run_curate(ROOT, DEMO / "stdlib.jsonl", target, ["--embedding-dtype", dtype])
        out[dtype] = (np.load(args.work / f"demo_{dtype}_embeddings.npy").astype(np.float64),
                      np.load(args.work / f"demo_{dtype}_labels.npy"))
    (a, la), (b, lb) = out["float32"], out["float16"]
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    nonzero = norms > 0
    gap = 1 - (a * b).sum(1)[nonzero] / norms[nonzero]
    result = {"documents": int(a.shape[0]), "mean_1_minus_cos": float(gap.mean()), "max_1_minus_cos": float(gap.max()),
              "labels_changed": int((la != lb).sum())}
    print(json.dumps(result, indent=2))


def cmd_tokenize(args) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(DEMO / "SmolLM2-135M" / "tokenizer.json"))
    documents = tokens = 0
    encoding = 0.0
    with open(args.input, "rb") as handle:
        while True:
            texts = [json.loads(line)["text"] for line in itertools.islice(handle, 100_000) if line.strip()]
            if not texts:
                break
            for at in range(0, len(texts), args.batch):
                started = time.perf_counter()
                encoded = tokenizer.encode_batch_fast(texts[at: at + args.batch], add_special_tokens=False)
                encoding += time.perf_counter() - started
                tokens += sum(len(e.ids) for e in encoded)
            documents += len(texts)
    result = {"input": str(args.input), "documents": documents, "tokens": tokens, "batch": args.batch,
              "encode_seconds": round(encoding, 1), "tokens_per_second": round(tokens / encoding)}
    print(json.dumps(result, indent=2))
    if args.results:
        args.results.write_text(json.dumps(result, indent=2) + "\n")


def cmd_load(args) -> None:
    from diversity_order import matrix

    data = args.work / f"first_{args.rows}.jsonl"
    with open(args.input, "rb") as source, open(data, "wb") as out:
        out.writelines(itertools.islice(source, args.rows))
    vectors = args.work / f"deep_{args.rows}x{args.dim}.npy"
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(30, args.dim)).astype(np.float32)
    started = time.perf_counter()
    with open(vectors, "w+b") as handle:
        rows = matrix.create_npy(handle, (args.rows, args.dim), np.float32)
        for lo in range(0, args.rows, 20_000):
            hi = min(lo + 20_000, args.rows)
            block = centres[rng.integers(0, 30, hi - lo)]
            block += rng.standard_normal(block.shape, dtype=np.float32) * 2
            rows[np.arange(lo, hi)] = block
    print(f"wrote {vectors} ({vectors.stat().st_size / 1e9:.1f} GB) in {time.perf_counter() - started:.0f} s",
          flush=True)
    row = run_curate(ROOT, data, args.work / "deep_curated.jsonl",
                     ["--load-embeddings", str(vectors), "--pca-components", "100", *args.extra])
    print(json.dumps(row, indent=2))
    if args.results:
        args.results.write_text(json.dumps({"rows": args.rows, "dim": args.dim, "run": row}, indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/diversity_order_large"))
    sub = p.add_subparsers(dest="command", required=True)
    corpus = sub.add_parser("corpus")
    corpus.add_argument("--docs", type=int, default=1_000_000)
    corpus.add_argument("--chars", type=int, default=200, help="~characters per document (200 is ~50 tokens)")
    corpus.add_argument("--out", type=Path, required=True)
    run = sub.add_parser("run")
    run.add_argument("--input", type=Path, required=True)
    run.add_argument("--baseline", type=Path, default=None, help="another checkout to run on the same input")
    run.add_argument("--results", type=Path, default=None)
    run.add_argument("--extra", nargs="*", default=[], help="more curate_dataset.py flags")
    kmeans = sub.add_parser("kmeans")
    kmeans.add_argument("--n", type=int, default=1_000_000)
    kmeans.add_argument("--k", type=int, default=30)
    kmeans.add_argument("--budget", default="1G", help="--memory-budget for the out-of-core fit's sample size")
    kmeans.add_argument("--results", type=Path, default=None)
    sub.add_parser("dtype")
    load = sub.add_parser("load")
    load.add_argument("--input", type=Path, required=True)
    load.add_argument("--rows", type=int, default=2_000_000)
    load.add_argument("--dim", type=int, default=2880)
    load.add_argument("--results", type=Path, default=None)
    load.add_argument("--extra", nargs="*", default=[], help="more curate_dataset.py flags")
    tokenize = sub.add_parser("tokenize")
    tokenize.add_argument("--input", type=Path, required=True)
    tokenize.add_argument("--batch", type=int, default=1024, help="texts per encode_batch_fast call")
    tokenize.add_argument("--results", type=Path, default=None)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.command == "corpus":
        write_corpus(args.out, args.docs, args.chars)
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e9:.2f} GB)")
    else:
        {"run": cmd_run, "kmeans": cmd_kmeans, "dtype": cmd_dtype, "tokenize": cmd_tokenize, "load": cmd_load}[args.command](args)


if __name__ == "__main__":
    main()
