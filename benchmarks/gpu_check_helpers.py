"""Small steps of benchmarks/gpu_check.sh (one subcommand each); run from the repository root.

    python3 benchmarks/gpu_check_helpers.py info
    python3 benchmarks/gpu_check_helpers.py site-pth DIR            # DIR importable even where PYTHONPATH is replaced
    python3 benchmarks/gpu_check_helpers.py model SRC DST [--tiny]  # random-weight model shaped by SRC/config.json
    python3 benchmarks/gpu_check_helpers.py corpus OUT.jsonl [--docs N]
    python3 benchmarks/gpu_check_helpers.py json-tail STDOUT.txt OUT.json
    python3 benchmarks/gpu_check_helpers.py compare OUT.json A.npy B.npy [C.npy ...]
    python3 benchmarks/gpu_check_helpers.py forced-pg [--curate] [--stop-at-batch N] -- ARGS...   # extract (or curate)
        with a 1-process group joined; --stop-at-batch: SIGTERM to torchrun as the tokenizer starts batch N
    python3 benchmarks/gpu_check_helpers.py compare-curated OUT.json A.parquet B.parquet   # two curate runs' outputs
    python3 benchmarks/gpu_check_helpers.py chat-corpus TEXT.jsonl OUT.jsonl [--docs 600]   # conversations, two role styles
    python3 benchmarks/gpu_check_helpers.py batch-rates OUT.json BATCH_SIZE LOG [BATCH_SIZE LOG ...]
    python3 benchmarks/gpu_check_helpers.py cluster-base OUT.npy [--rows 50000 --dim 576 --centres 60]
    python3 benchmarks/gpu_check_helpers.py summary OUT_DIR STEPS.tsv [PYTEST_JUNIT.xml]

Nothing here needs the real SmolLM2 weights: the model is built with random weights from its
config and tokenizer files (throughput is measured, not embedding quality).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
               "generation_config.json", "special_tokens_map.json")


def info() -> None:
    import platform

    out = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}
    for name in ("numpy", "torch", "transformers", "tokenizers", "safetensors", "sklearn", "numba", "accelerate",
                 "orjson", "xxhash", "pyarrow", "zstandard", "faiss", "xdist", "hypothesis", "pytest"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            out[name] = f"missing ({type(exc).__name__})"
    import torch

    out["cuda_available"] = torch.cuda.is_available()
    out["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        out["device_name"] = torch.cuda.get_device_name(0)
        out["device_count"] = torch.cuda.device_count()
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        free, total = torch.cuda.mem_get_info(0)
        out["gpu_memory_gib"] = {"free": round(free / 2**30, 1), "total": round(total / 2**30, 1)}
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
    import torch.distributed as dist

    out["nccl_available"] = dist.is_nccl_available()
    out["gloo_available"] = dist.is_gloo_available()
    print(json.dumps(out, indent=1))


def site_pth(folder: str) -> None:
    """Tests start subprocesses with PYTHONPATH=<repo root> (replacing ours): a .pth file in a site
    folder keeps ``folder`` (the wheels installed with --target) importable there too."""
    import site

    folder = str(Path(folder).resolve())
    candidates = []
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    candidates += site.getsitepackages()
    for target in candidates:
        try:
            Path(target).mkdir(parents=True, exist_ok=True)
            (Path(target) / "zz_gpu_check_site.pth").write_text(folder + "\n")
        except OSError as exc:
            print(f"{target}: not writable ({exc.strerror})")
            continue
        print(f"{folder} added to every interpreter's path through {target}/zz_gpu_check_site.pth")
        return
    print(f"no writable site folder: subprocesses that replace PYTHONPATH will not see {folder}")


def model(src: str, dst: str, tiny: bool = False) -> None:
    """A model folder shaped like ``src`` (its config and tokenizer files) with seeded random
    weights, saved as bfloat16 safetensors; ``tiny`` keeps 2 layers (CPU dry runs)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    src_path, dst_path = Path(src), Path(dst)
    dst_path.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    config = AutoConfig.from_pretrained(src_path, local_files_only=True)
    if tiny:
        config.num_hidden_layers = 2
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        net = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    net.save_pretrained(dst_path)
    for name in SMALL_FILES:
        if (src_path / name).is_file() and not (name in ("config.json", "generation_config.json")
                                                and (dst_path / name).is_file()):
            shutil.copy2(src_path / name, dst_path / name)
    params = sum(p.numel() for p in net.parameters())
    files = {p.name: p.stat().st_size for p in sorted(dst_path.iterdir())}
    print(json.dumps({"model": str(dst_path), "params": params, "layers": config.num_hidden_layers,
                      "built_on": device, "seconds": round(time.perf_counter() - started, 1), "files": files}))


def corpus(out: str, docs: int = 5000) -> None:
    """A JSONL of ~``docs`` documents cut from this interpreter's standard library sources (pieces
    of up to 6,000 characters): the stand-in for demo/stdlib.jsonl where that file did not travel."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    written = 0
    with open(out, "w") as f:
        for path in sorted(root.rglob("*.py")):
            if "site-packages" in path.parts or "test" in path.parts:
                continue
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for lo in range(0, len(text), 6000):
                piece = text[lo : lo + 6000]
                if piece.strip():
                    f.write(json.dumps({"text": piece}) + "\n")
                    written += 1
                if written >= docs:
                    print(f"{out}: {written} documents")
                    return
    print(f"{out}: {written} documents")


def chat_corpus(src: str, out: str, docs: int = 600) -> None:
    """The first ``docs`` records of a text JSONL as conversations (user: the record's number, assistant: its
    text); the last quarter name their roles ShareGPT's way (human/gpt), as a second source of a mix might."""
    with open(src) as f, open(out, "w") as g:
        for i, line in zip(range(docs), f):
            user, assistant = ("human", "gpt") if i >= docs * 3 // 4 else ("user", "assistant")
            g.write(json.dumps({"messages": [{"role": user, "content": f"Explain piece {i}."},
                                             {"role": assistant, "content": json.loads(line)["text"]}]}) + "\n")
    print(f"{out}: {min(docs, i + 1)} conversations")


def json_tail(stdout_file: str, out: str) -> None:
    """The last JSON object printed in ``stdout_file`` (bench_deep prints one, indented), to ``out``."""
    text = Path(stdout_file).read_text()
    decoder = json.JSONDecoder()
    found = None
    for i, ch in enumerate(text):
        if ch == "{" and (i == 0 or text[i - 1] == "\n"):
            try:
                found, _ = decoder.raw_decode(text[i:])
            except ValueError:
                continue
    if found is None:
        sys.exit(f"no JSON object in {stdout_file}")
    Path(out).write_text(json.dumps(found, indent=1) + "\n")
    print(json.dumps(found))


def compare(out: str, paths: list[str]) -> None:
    """Each of ``paths[1:]`` against ``paths[0]``: shape, NaN rows, max |difference|, min cosine."""
    import numpy as np

    first = np.load(paths[0])
    rows = {"reference": paths[0], "shape": list(first.shape), "nan_rows": int(np.isnan(first).any(1).sum()),
            "against": []}
    ok = True
    for path in paths[1:]:
        other = np.load(path)
        row = {"path": path, "shape": list(other.shape)}
        if other.shape != first.shape:
            row["error"] = "shapes differ"
            ok = False
        else:
            both = ~(np.isnan(first).any(1) | np.isnan(other).any(1))
            a, b = first[both].astype(np.float64), other[both].astype(np.float64)
            cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
            row.update(rows_compared=int(both.sum()), nan_rows=int((~np.isfinite(other)).any(1).sum()),
                       identical=bool(np.array_equal(first, other, equal_nan=True)),
                       max_abs_diff=float(np.abs(a - b).max()) if a.size else 0.0,
                       min_cosine=float(cos.min()) if cos.size else 1.0)
            ok &= row["min_cosine"] > 0.999
        rows["against"].append(row)
    rows["agree"] = ok
    Path(out).write_text(json.dumps(rows, indent=1) + "\n")
    print(json.dumps(rows, indent=1))
    if not ok:
        sys.exit(1)


def forced_pg(argv: list[str], script: str = "extract", stop_at_batch: int = 0) -> int:
    """extract_deep_embeddings (or curate_dataset) with the process group joined although torchrun
    started one process.

    ``distributed.launched_by_torchrun()`` is False for WORLD_SIZE=1, so ``torchrun --nproc_per_node 1``
    alone never calls init_process_group: this joins it anyway (NCCL on CUDA, gloo on CPU), the
    way a multi-rank run does. curate_dataset also takes the ranks' path (``scale_out``), so every
    collective a multi-rank curate run makes runs on this machine's backend, with one rank."""
    sys.path.insert(0, str(ROOT))
    from diversity_order import distributed
    from diversity_order.cli import run_main

    if script == "curate":
        from diversity_order.cli.curate_dataset import main
    else:
        from diversity_order.cli.extract_deep_embeddings import main

    distributed.launched_by_torchrun = lambda: True
    if script == "curate":
        # One rank would take the single-process path (a context is active from two ranks up): this one takes the
        # ranks' path (scale_out), so every collective a multi-rank run makes runs on this machine's backend.
        distributed.DistContext.active = property(lambda self: True)
    if stop_at_batch:
        import signal

        from diversity_order.tokenizer import DocumentTokenizer

        real, calls = DocumentTokenizer.encode_texts, []

        def stopped(self, texts):  # a scheduler's preemption: torchrun passes the SIGTERM on to the ranks
            calls.append(len(texts))
            if len(calls) == stop_at_batch:
                os.kill(os.getppid(), signal.SIGTERM)
                time.sleep(60)
            return real(self, texts)

        DocumentTokenizer.encode_texts = stopped
    import torch.distributed as dist

    joined, real_init = [], dist.init_process_group

    def init(*args, **kwargs):  # curate leaves the group itself before it returns
        real_init(*args, **kwargs)
        joined.append(dist.get_backend())

    dist.init_process_group = init
    code = run_main(main, argv)
    if dist.is_initialized():
        dist.destroy_process_group()
    if joined:
        print(f"process group joined: backend {joined[0]}, world size 1", flush=True)
    elif code == 0:
        print("process group NOT joined", flush=True)
        code = 3
    return code


def compare_curated(out: str, first: str, second: str) -> None:
    """Two curate runs (their --output names, Parquet): the same order, labels and rows (every shard, in order)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def load(output: str) -> dict:
        stem = Path(output).with_suffix("")
        meta = json.loads(Path(f"{stem}_meta.json").read_text())
        shards = [Path(f) for f in meta["output_files"]]
        return {"order": np.load(f"{stem}_order.npy"), "labels": np.load(f"{stem}_labels.npy"),
                "table": pa.concat_tables([pq.read_table(f) for f in shards]),
                "shards": [f.name for f in shards], "schemas": {str(pq.read_schema(f)) for f in shards}}

    a, b = load(first), load(second)
    result = {"a": first, "b": second, "shards_a": a["shards"], "shards_b": b["shards"],
              "rows": [a["table"].num_rows, b["table"].num_rows],
              "order_equal": bool(np.array_equal(a["order"], b["order"])),
              "labels_equal": bool(np.array_equal(a["labels"], b["labels"])),
              "one_schema_each": len(a["schemas"]) == 1 and len(b["schemas"]) == 1,
              "tables_equal": bool(a["table"].equals(b["table"]))}
    result["agree"] = all(result[k] for k in ("order_equal", "labels_equal", "one_schema_each", "tables_equal"))
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    if not result["agree"]:
        sys.exit(1)


def cluster_base(out: str, rows: int = 50_000, dim: int = 576, centres: int = 60) -> None:
    """Unit rows around ``centres`` random directions with uneven sizes and spreads (a stand-in for
    real embeddings; bench_cluster.py resamples it with noise to --n rows)."""
    import numpy as np

    rng = np.random.default_rng(0)
    means = rng.normal(size=(centres, dim))
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    weights = rng.pareto(1.5, centres) + 0.2
    which = rng.choice(centres, rows, p=weights / weights.sum())
    spread = rng.uniform(0.02, 0.08, centres)[which, None]
    x = (means[which] + rng.normal(size=(rows, dim)) * spread).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(out, x)
    print(f"{out}: {rows} x {dim}, {centres} centres")


def batch_rates(out: str, pairs: list[str]) -> None:
    """From extract_deep_embeddings logs (BATCH_SIZE LOG pairs): each run's whole time and its batches' own
    time and tokens/s, read off its last line."""
    import re

    rows = []
    first = None
    for size, log in zip(pairs[::2], pairs[1::2]):
        text = Path(log).read_text() if Path(log).is_file() else ""
        whole = re.search(r"Deep embeddings: ([\d,]+) docs, ([\d,]+) tokens in ([\d.]+) s", text)
        alone = re.search(r"the batches alone: ([\d.]+) s, ([\d,]+) tokens/s", text)
        row = {"batch_size": int(size)}
        if whole and alone:
            row.update(docs=int(whole.group(1).replace(",", "")), tokens=int(whole.group(2).replace(",", "")),
                       seconds=float(whole.group(3)), batch_seconds=float(alone.group(1)),
                       batch_tokens_per_s=int(alone.group(2).replace(",", "")))
        else:
            row["error"] = "no last line (see the log)"
        # The batch size changes which documents share a padded batch, not what each one is: each run's
        # embeddings (e.npy beside its log) against the first run's, row by row.
        embeddings = Path(log).parent / "e.npy"
        if embeddings.is_file():
            import numpy as np

            rows_here = np.load(embeddings).astype(np.float64)
            if first is None:
                first = rows_here
            elif rows_here.shape == first.shape:
                norms = np.linalg.norm(rows_here, axis=1) * np.linalg.norm(first, axis=1)
                row["min_cosine_vs_first"] = float(np.min(np.sum(rows_here * first, axis=1) / np.maximum(norms, 1e-30)))
        rows.append(row)
    Path(out).write_text(json.dumps(rows, indent=1) + "\n")
    print(json.dumps(rows))


def _junit_counts(path: Path) -> dict | None:
    import xml.etree.ElementTree as ET

    if not path.is_file():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return {"error": "unreadable junit xml"}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["seconds"] = round(sum(float(s.get("time", 0)) for s in suites), 1)
    counts["failed"] = [f"{case.get('classname')}::{case.get('name')}" for s in suites for case in s.iter("testcase")
                        if case.find("failure") is not None or case.find("error") is not None][:30]
    return counts


def summary(out_dir: str, steps_file: str, junit: str | None = None) -> None:
    """One JSON of every step's exit code and seconds plus the results the steps wrote."""
    out_path = Path(out_dir)
    steps = []
    for line in Path(steps_file).read_text().splitlines():
        name, rc, seconds = line.split("\t")[:3]
        steps.append({"step": name, "rc": None if rc == "skipped" else int(rc), "skipped": rc == "skipped",
                      "seconds": float(seconds)})
    results = {}
    for path in sorted(out_path.glob("*.json")):
        if path.name != "gpu_check_summary.json":
            try:
                results[path.stem] = json.loads(path.read_text())
            except ValueError:
                results[path.stem] = "unreadable"
    tests = _junit_counts(Path(junit)) if junit else None
    if tests is not None:
        results["pytest"] = tests
    (out_path / "gpu_check_summary.json").write_text(json.dumps({"steps": steps, "results": results}, indent=1) + "\n")
    print(f"{'step':<28} {'rc':>8} {'seconds':>8}")
    for s in steps:
        print(f"{s['step']:<28} {'skipped' if s['skipped'] else s['rc']:>8} {s['seconds']:>8.1f}")
    for key in ("deep_512", "deep_2048"):
        r = results.get(key)
        if isinstance(r, dict):
            print(f"{key}: ours {r.get('ours_tokens_per_s')} tok/s, one at a time {r.get('one_at_a_time_tokens_per_s')} "
                  f"tok/s, speedup {r.get('speedup')}, min cosine {r.get('min_cosine_vs_plain')} ({r.get('device')}, "
                  f"{r.get('docs')} docs, {r.get('tokens')} tokens)")
    r = results.get("batch_sizes")
    if isinstance(r, list):
        for row in r:
            error = f" {row['error']}" if "error" in row else ""
            print(f"--batch-size {row['batch_size']}: batches {row.get('batch_seconds')} s, "
                  f"{row.get('batch_tokens_per_s')} tokens/s; whole run {row.get('seconds')} s{error}")
    r = results.get("extract_compare")
    if isinstance(r, dict):
        for row in r.get("against", []):
            print(f"extract vs {Path(row['path']).parent.name}: identical {row.get('identical')}, max |diff| "
                  f"{row.get('max_abs_diff')}, min cosine {row.get('min_cosine')}")
    r = results.get("curate_compare")
    if isinstance(r, dict):
        print(f"curate, one process vs torchrun with a forced group: rows {r.get('rows')}, order equal "
              f"{r.get('order_equal')}, labels equal {r.get('labels_equal')}, tables equal {r.get('tables_equal')}")
    if tests is not None:
        print(f"pytest: {tests}")
    r = results.get("cluster")
    if isinstance(r, list):
        for row in r:
            print(f"cluster {row['backend']} on {row.get('device', '?')}: {row['seconds']} s, n={row['n']}, k={row['k']}, "
                  f"inertia ratio {row.get('inertia_vs_first')}, speedup {row.get('speedup_vs_first')}")


def main() -> int:
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    command, rest = args[0], args[1:]
    if command == "info":
        info()
    elif command == "site-pth":
        site_pth(rest[0])
    elif command == "model":
        model(rest[0], rest[1], tiny="--tiny" in rest)
    elif command == "corpus":
        corpus(rest[0], int(rest[rest.index("--docs") + 1]) if "--docs" in rest else 5000)
    elif command == "chat-corpus":
        chat_corpus(rest[0], rest[1], int(rest[rest.index("--docs") + 1]) if "--docs" in rest else 600)
    elif command == "json-tail":
        json_tail(rest[0], rest[1])
    elif command == "compare":
        compare(rest[0], rest[1:])
    elif command == "forced-pg":
        own = rest[: rest.index("--")] if "--" in rest else []
        script = "curate" if "--curate" in own else "extract"
        stop = int(own[own.index("--stop-at-batch") + 1]) if "--stop-at-batch" in own else 0
        return forced_pg(rest[rest.index("--") + 1 :] if "--" in rest else rest, script, stop)
    elif command == "compare-curated":
        compare_curated(rest[0], rest[1], rest[2])
    elif command == "batch-rates":
        batch_rates(rest[0], rest[1:])
    elif command == "cluster-base":
        opts = dict(zip(rest[1::2], rest[2::2]))
        cluster_base(rest[0], int(opts.get("--rows", 50_000)), int(opts.get("--dim", 576)),
                     int(opts.get("--centres", 60)))
    elif command == "summary":
        summary(rest[0], rest[1], rest[2] if len(rest) > 2 else None)
    else:
        sys.exit(f"unknown command {command}\n{__doc__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
