"""The demo corpus in every input format: same labels and order as the JSONL run; time and peak RSS per run.

    .venv/bin/python benchmarks/bench_formats.py [--work /tmp/formats] [--records 0]

Converts demo/stdlib.jsonl to one Parquet file, a 4-file save_to_disk folder, 4 Parquet files read
by a glob, and chat conversations (with the same conversations rendered by the chat template as a
plain JSONL baseline); runs curate_dataset.py on each (a fresh process each, caches not shared:
every run has its own folder and cache registry) and compares labels, order and curated rows. Also a --packing split
--count-special-tokens eos --export-packed run, whose exported sequences are checked against the
run's per-window diversity. Results: benchmarks/results_formats.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _convert(work: Path, records: list[dict], model: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from diversity_order.tokenizer import DocumentTokenizer

    for name in ("jsonl", "parquet", "datasets", "glob", "chat", "rendered", "split"):
        (work / name).mkdir(parents=True, exist_ok=True)
    (work / "jsonl" / "demo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records), work / "parquet" / "demo.parquet", row_group_size=1000)
    pq.write_table(pa.Table.from_pylist(records), work / "split" / "demo.parquet", row_group_size=1000)
    datasets.Dataset.from_list(records).save_to_disk(str(work / "datasets" / "demo_ds"), num_shards=4)
    step = -(-len(records) // 4)
    (work / "glob" / "parts").mkdir(exist_ok=True)
    for i in range(4):
        pq.write_table(pa.Table.from_pylist(records[i * step:(i + 1) * step]), work / "glob" / "parts" / f"p{i}.parquet")
    tokenizer = DocumentTokenizer(model)
    with open(work / "chat" / "chat.jsonl", "w") as chat, open(work / "rendered" / "rendered.jsonl", "w") as rendered:
        for r in records:
            messages = [{"role": "user", "content": r["name"]}, {"role": "assistant", "content": r["text"]}]
            chat.write(json.dumps({"messages": messages}) + "\n")
            rendered.write(json.dumps({"text": tokenizer.render_chat(messages)}) + "\n")


def _run(work: Path, name: str, args: list[str], model: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "curate_dataset.py"), "--model-dir", str(model), "--no-plot", "--no-progress",
           *args]
    started = time.perf_counter()
    # Each run its own cache registry: no run reuses another's embeddings, so every run embeds.
    registry = work / name / ".cache_registry"
    done = subprocess.run(cmd, cwd=work / name, capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", DIVERSITY_ORDER_CACHE_DIR=str(registry)))
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return {"seconds": round(time.perf_counter() - started, 1), "command": " ".join(cmd[1:])}


def main() -> None:

    p = argparse.ArgumentParser()
    p.add_argument("--work", type=Path, default=Path("/tmp/formats_bench"))
    p.add_argument("--records", type=int, default=0, help="first N records of the demo corpus (0 = all)")
    args = p.parse_args()
    model = ROOT / "demo" / "SmolLM2-135M"
    lines = (ROOT / "demo" / "stdlib.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in (lines[: args.records] if args.records else lines)]
    work = args.work
    _convert(work, records, model)
    runs = {
        "jsonl": ["--input", "demo.jsonl", "--output", "c.jsonl"],
        "parquet": ["--input", "demo.parquet", "--output", "c.parquet"],
        "datasets": ["--input", "demo_ds", "--output", "c_ds"],
        "glob": ["--input", "parts/*.parquet", "--output", "c.jsonl", "--output-shards", "4"],
        "chat": ["--input", "chat.jsonl", "--text-field", "messages", "--output", "c.jsonl"],
        "rendered": ["--input", "rendered.jsonl", "--output", "c.jsonl"],
        "split": ["--input", "demo.parquet", "--output", "c.parquet", "--packing", "split", "--seq-len", "2048",
                  "--count-special-tokens", "eos", "--export-packed", "packed"],
    }
    results = {name: _run(work, name, flags, model) for name, flags in runs.items()}
    check(work, results)
    out = ROOT / "benchmarks" / "results_formats.json"
    out.write_text(json.dumps({"records": len(records), "runs": results}, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def check(work: Path, results: dict) -> None:
    """The equalities, and each run's own peak RSS (its B_meta.json)."""
    import numpy as np

    for name in results:
        meta = next((work / name).glob("c*_meta.json"))
        meta = json.loads(meta.read_text())
        results[name]["peak_rss_mb"] = round(max(meta["peak_rss_mb"].values()))
        results[name]["stage_seconds"] = {stage: round(seconds, 1) for stage, seconds in meta["timings_seconds"].items()}

    def load(name: str, what: str, stem: str = "c"):
        return np.load(work / name / f"{stem}_{what}.npy")

    stems = {"datasets": "c_ds"}
    for name in ("parquet", "datasets", "glob"):
        results[name]["same_labels_and_order_as_jsonl"] = bool(
            np.array_equal(load("jsonl", "labels"), load(name, "labels", stems.get(name, "c")))
            and np.array_equal(load("jsonl", "order"), load(name, "order", stems.get(name, "c"))))
    results["chat"]["same_labels_and_order_as_rendered"] = bool(
        np.array_equal(load("chat", "labels"), load("rendered", "labels"))
        and np.array_equal(load("chat", "order"), load("rendered", "order")))
    # Parquet rows converted to JSON objects: the JSONL run's records, in its order (the bytes differ
    # only in how the converter escapes non-ASCII characters).
    shards = [json.loads(line) for f in sorted(glob.glob(str(work / "glob" / "c-*-of-00004.jsonl")))
              for line in Path(f).read_text().splitlines()]
    curated = [json.loads(line) for line in (work / "jsonl" / "c.jsonl").read_text().splitlines()]
    results["glob"]["shards_hold_the_jsonl_runs_records_in_order"] = shards == curated
    results["split"].update(_check_packed(work / "split"))


def _check_packed(folder: Path) -> dict:
    import datasets
    import numpy as np

    from diversity_order.diversity import window_counts

    labels, order = np.load(folder / "c_labels.npy"), np.load(folder / "c_order.npy")
    counts = np.load(folder / "demo_token_counts.npy") + 1  # --count-special-tokens eos
    data = datasets.load_dataset("parquet", data_files=sorted(glob.glob(str(folder / "packed" / "packed-*.parquet"))),
                                 split="train")
    unique, _ = window_counts(labels, counts, 2048, order, "split")
    recomputed = [len(set(labels[rows].tolist())) for rows in data["document_rows"]]
    meta = json.loads((folder / "c_meta.json").read_text())
    return {"packed_sequences": len(data), "run_windows": int(unique.size),
            "packed_diversity_equals_run_windows": recomputed == unique[: len(data)].tolist(),
            "packed_mean": round(float(np.mean(recomputed)), 4),
            "run_reported_mean": meta["token_window_diversity"]["curated"]["mean"]}


if __name__ == "__main__":
    main()
