"""Whole pipeline, ours vs the reference toolkit, in one run: wall time and peak RSS.

    .venv/bin/python benchmarks/bench_vs_reference.py --reference-dir DIR [--docs 20000 100000]
        [--input JSONL] [--model demo/SmolLM2-135M] [--repeats 1] [--out benchmarks/results_vs_reference.json]
        [--only-ours] [--ours-dir OTHER_CHECKOUT]

The reference is eous/diversity-ordered-training (public; bring it with ``git clone``). Nothing
of it is copied into this repository: at run time its ``curate_dataset.py`` is copied into the
run's folder under ``--work`` with its one CUDA line (``device = f"cuda:{args.gpu}"``) rewritten to ``"cpu"``,
and run from there.

Both tools run as subprocesses of this script on the same JSONL, the same model folder, the same
K and seed, ``--seq-len 131072``, ``--no-plot`` (both have it), with cold caches (each run gets a
fresh folder; both write their token-count cache beside the input, so the input is symlinked into
it). Wall time is measured around the child, peak RSS is the child's ``ru_maxrss`` from
``os.wait4``. After the runs, both outputs are checked to hold the same number of records, to be
permutations of the input, and to count the same total tokens.

Without ``--input``, a mixed corpus is built per size (see ``build_mixed_corpus``), deterministic
for a given Python and virtual environment; its SHA-256 is recorded next to the results.
Our run is also profiled: per-stage seconds and peak RSS from its metadata, the embed loop's
tokens/s from its log, and where import time goes (``-X importtime`` of a small run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_CUDA_LINE = 'device = f"cuda:{args.gpu}"'
SEQ_LEN = 131072
TARGET_SPEEDUP = {20_000: 3.0, 100_000: 5.0}


# --- the corpus ---------------------------------------------------------------------------------
# Kept small and separate so a shared corpus builder can replace it.


def _corpus_sources() -> dict[str, list[Path]]:
    """Files of three kinds, each list in a fixed (sorted) order: stdlib code, installed packages'
    code, and installed packages' prose (READMEs, licences, package metadata)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    purelib = Path(sysconfig.get_paths()["purelib"])
    stdlib_code = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    package_code = sorted(purelib.rglob("*.py"))
    prose = sorted(p for p in purelib.rglob("*") if p.is_file() and
                   (p.suffix in (".md", ".rst", ".txt") or p.name in ("METADATA", "LICENSE", "LICENSE.txt")))
    return {"stdlib": stdlib_code, "site-packages": package_code, "docs": prose}


def build_mixed_corpus(target: Path, docs: int, seed: int = 0, max_chunks_per_file: int = 24) -> dict:
    """Write ``docs`` JSONL records cut from real text of mixed kinds and lengths; return a description.

    Files are taken in turn from each source (so sources interleave at file granularity), and
    each file is cut from its start into consecutive pieces with log-normal lengths (median 400
    characters, from 16 to 32,000), at most ``max_chunks_per_file`` per file. Pieces of one
    file stay together: the input order is grouped by topic, as real dumps are.
    """
    rng = np.random.default_rng(seed)
    sources = _corpus_sources()
    cursors = {name: 0 for name in sources}
    written = 0
    per_source = {name: 0 for name in sources}
    tmp = target.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        while written < docs:
            progressed = False
            for name, files in sources.items():
                if written >= docs or cursors[name] >= len(files):
                    continue
                path = files[cursors[name]]
                cursors[name] += 1
                progressed = True
                try:
                    text = path.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                start = 0
                for _ in range(max_chunks_per_file):
                    if start >= len(text) or written >= docs:
                        break
                    size = int(np.clip(rng.lognormal(np.log(400), 1.1), 16, 32_000))
                    piece = text[start : start + size]
                    start += size
                    if not piece.strip():
                        continue
                    out.write(json.dumps({"text": piece, "source": name, "id": written}) + "\n")
                    written += 1
                    per_source[name] += 1
            if not progressed:
                raise SystemExit(f"only {written} documents could be cut from this environment's files")
    tmp.replace(target)
    return {"path": str(target), "docs": written, "bytes": target.stat().st_size, "sha256": _sha256(target),
            "per_source": per_source, "builder": "build_mixed_corpus", "seed": seed}


def _corpus_description(corpus: Path) -> dict:
    """The description saved beside a corpus built earlier, if the corpus is still the one described."""
    try:
        info = json.loads(corpus.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return {}
    return info if corpus.is_file() and corpus.stat().st_size == info.get("bytes") else {}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- running one tool ---------------------------------------------------------------------------


def patched_reference(reference_dir: Path, folder: Path) -> Path:
    """A copy of the reference's curate_dataset.py whose device is the CPU (it hard-codes CUDA)."""
    source = (reference_dir / "curate_dataset.py").read_text(encoding="utf-8")
    if source.count(REFERENCE_CUDA_LINE) != 1:
        raise SystemExit(f"{reference_dir}/curate_dataset.py: expected one line {REFERENCE_CUDA_LINE!r} to patch; "
                         "is this eous/diversity-ordered-training?")
    script = folder / "reference_curate_dataset_cpu.py"
    script.write_text(source.replace(REFERENCE_CUDA_LINE, 'device = "cpu"  # patched by bench_vs_reference.py'),
                      encoding="utf-8")
    return script


def run_measured(cmd: list[str], log_path: Path, env: dict) -> dict:
    """Run ``cmd``; wall seconds and the child's peak RSS (MB). Raises with the log's tail on failure."""
    started = time.perf_counter()
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=log_path.parent)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"{' '.join(cmd)} failed ({process.returncode}):\n{tail}")
    # CPU seconds (user + system, all threads) move less than wall time when other work shares
    # the machine; the load average says whether it did.
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux reports KB
            "load_average_1min_after": round(os.getloadavg()[0], 2)}


def _fresh_run_dir(work: Path, name: str, corpus: Path) -> tuple[Path, Path]:
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    data = folder / "input.jsonl"
    data.symlink_to(corpus.resolve())  # both tools put their token-count cache beside the input
    return folder, data


def run_reference(reference_dir: Path, python: str, corpus: Path, model: Path, k: int, seed: int, work: Path,
                  env: dict, tag: str) -> dict:
    folder, data = _fresh_run_dir(work, f"reference_{tag}", corpus)
    script = patched_reference(reference_dir, folder)
    output = folder / "curated.jsonl"
    cmd = [python, str(script), "--input", str(data), "--output", str(output), "--model-dir", str(model),
           "--n-clusters", str(k), "--seed", str(seed), "--seq-len", str(SEQ_LEN), "--no-plot"]
    result = run_measured(cmd, folder / "run.log", env)
    meta = json.loads((folder / "curated_meta.json").read_text())
    result.update(output=str(output), total_tokens=meta["total_tokens"],
                  diversity_curated_mean=meta["token_window_diversity"]["curated"]["mean"],
                  similarity=meta["similarity_stats"])
    return result


def run_ours(ours_dir: Path, python: str, corpus: Path, model: Path, k: int, seed: int, work: Path, env: dict,
             tag: str) -> dict:
    folder, data = _fresh_run_dir(work, f"ours_{tag}", corpus)
    output = folder / "curated.jsonl"
    cmd = [python, str(ours_dir / "curate_dataset.py"), "--input", str(data), "--output", str(output),
           "--model-dir", str(model), "--n-clusters", str(k), "--seed", str(seed), "--seq-len", str(SEQ_LEN),
           "--no-plot", "--no-progress", "--device", "cpu"]
    result = run_measured(cmd, folder / "run.log", env)
    meta = json.loads((folder / "curated_meta.json").read_text())
    stages = meta["timings_seconds"]
    log_text = (folder / "run.log").read_text(errors="replace")
    embed = re.search(r"Embedded (\d+) documents, ([\d,]+) tokens, in ([\d.]+) s \((\d+) tokens/s", log_text)
    result.update(output=str(output), total_tokens=meta["total_tokens"],
                  diversity_curated_mean=meta["token_window_diversity"]["curated"]["mean"],
                  similarity=meta["similarity_stats"], stages_s=stages, stage_peak_rss_mb=meta["peak_rss_mb"],
                  stages_side_by_side=meta.get("stages_side_by_side", []),
                  outside_stages_s=round(result["wall_s"] - stages_wall_s(stages, meta.get("stages_side_by_side", [])), 2),
                  embed_loop=None if embed is None else {"seconds": float(embed.group(3)),
                                                         "tokens_per_s": int(embed.group(4))})
    return result


def stages_wall_s(stages: dict, side_by_side: list[str]) -> float:
    """Wall time the stages cover: stages run side by side overlap, so that group counts once, as its longest."""
    alone = sum(seconds for name, seconds in stages.items() if name not in side_by_side)
    return alone + max((stages[name] for name in side_by_side if name in stages), default=0.0)


def _sorted_lines_digest(path: Path) -> tuple[int, str]:
    """Record count and a digest of the sorted records: equal for any two permutations of one file."""
    with open(path, "rb") as handle:
        lines = [line.rstrip(b"\n") for line in handle if line.strip()]
    lines.sort()
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line + b"\n")
    return len(lines), digest.hexdigest()


def check_outputs(corpus: Path, reference: dict | None, ours: dict) -> dict:
    n_in, want = _sorted_lines_digest(corpus)
    n_ours, ours_digest = _sorted_lines_digest(Path(ours["output"]))
    if reference is None:
        if (n_ours, ours_digest) != (n_in, want):
            raise SystemExit(f"our output is not a permutation of the input ({n_ours} of {n_in} records)")
        return {"records_input": n_in, "records_ours": n_ours, "ours_permutation_of_input": True}
    n_ref, ref_digest = _sorted_lines_digest(Path(reference["output"]))
    checks = {"records_input": n_in, "records_reference": n_ref, "records_ours": n_ours,
              "same_record_count": n_ref == n_ours == n_in,
              "both_permutations_of_input": ref_digest == ours_digest == want,
              "same_total_tokens": reference["total_tokens"] == ours["total_tokens"]}
    if not (checks["same_record_count"] and checks["both_permutations_of_input"]):
        raise SystemExit(f"outputs disagree: {checks}")
    return checks


# --- import profile -----------------------------------------------------------------------------


def import_profile(ours_dir: Path, python: str, model: Path, work: Path, env: dict, top: int = 12) -> dict:
    """Where our import time goes: ``-X importtime`` of a real run on a 300-document corpus.

    Every import a run makes, by top-level package (cumulative microseconds of each package's
    outermost import), so lazily imported libraries are counted in the stage that pulls them in.
    """
    corpus = work / "importtime_corpus.jsonl"
    if not corpus.exists():
        build_mixed_corpus(corpus, 300)
    folder, data = _fresh_run_dir(work, "ours_importtime", corpus)
    cmd = [python, "-X", "importtime", str(ours_dir / "curate_dataset.py"), "--input", str(data), "--output",
           str(folder / "curated.jsonl"), "--model-dir", str(model), "--n-clusters", "5", "--no-plot",
           "--no-progress", "--device", "cpu"]
    started = time.perf_counter()
    completed = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=folder)
    wall = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"import profile run failed:\n{completed.stderr[-3000:]}")
    per_package: dict[str, int] = {}
    for line in completed.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if match and len(match.group(3)) == 1:  # outermost imports only: their cumulative time counts once
            package = match.group(4).split(".")[0]
            per_package[package] = per_package.get(package, 0) + int(match.group(2))
    total = sum(per_package.values())
    ranked = sorted(per_package.items(), key=lambda item: -item[1])
    return {"run_wall_s": round(wall, 2), "total_import_s": round(total / 1e6, 2),
            "by_package_s": {name: round(us / 1e6, 2) for name, us in ranked[:top]},
            "others_s": round(sum(us for _, us in ranked[top:]) / 1e6, 2)}


# --- report -------------------------------------------------------------------------------------


def markdown_table(rows: list[dict]) -> str:
    lines = ["| documents | tokens | reference wall | ours wall | speed-up | target | CPU s reference / ours | "
             "reference peak RSS | ours peak RSS | ours / reference RSS |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ref, ours = row["reference"], row["ours"]
        target = TARGET_SPEEDUP.get(row["docs"])
        lines.append(f"| {row['docs']:,} | {ours['total_tokens']:,} | {ref['wall_s']:.1f} s | {ours['wall_s']:.1f} s | "
                     f"**{row['speedup']:.2f}x** | {f'>= {target:g}x' if target else ''} | "
                     f"{ref['cpu_s']:.1f} / {ours['cpu_s']:.1f} ({row['cpu_ratio']:.2f}x) | "
                     f"{ref['peak_rss_mb']:,.0f} MB | {ours['peak_rss_mb']:,.0f} MB | {row['rss_ratio']:.2f} |")
    return "\n".join(lines)


def _stage_name(name: str) -> str:
    return "Writing the curated JSONL" if name.startswith("Writing ") else name  # the name holds the output path


def stage_table(rows: list[dict]) -> str:
    for row in rows:
        for key in ("stages_s", "stage_peak_rss_mb"):
            row["ours"][key] = {_stage_name(name): value for name, value in row["ours"][key].items()}
    names = list(dict.fromkeys(name for row in rows for name in row["ours"]["stages_s"]))
    header = "| stage | " + " | ".join(f"{row['docs']:,} docs" for row in rows) + " |"
    lines = [header, "|---|" + "---|" * len(rows)]
    lines.append("| before the first stage (imports, argument parsing) and after the last | " +
                 " | ".join(f"{row['ours']['outside_stages_s']:.2f} s" for row in rows) + " |")
    for name in names:
        cells = []
        for row in rows:
            seconds = row["ours"]["stages_s"].get(name)
            rss = row["ours"]["stage_peak_rss_mb"].get(name)
            beside = " beside" if name in map(_stage_name, row["ours"].get("stages_side_by_side", [])) else ""
            cells.append("" if seconds is None else f"{seconds:.2f} s{beside} ({rss:,.0f} MB)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| (\"beside\": ran at the same time as the other stages so marked; the wall counts the longest) |"
                 + " |" * len(rows))
    lines.append("| **wall (CPU)** | " + " | ".join(f"**{row['ours']['wall_s']:.2f} s** ({row['ours']['cpu_s']:.1f} s)"
                                                  for row in rows) + " |")
    lines.append("| peak RSS | " + " | ".join(f"{row['ours']['peak_rss_mb']:,.0f} MB" for row in rows) + " |")
    lines.append("| embed loop: tokens/s | " + " | ".join(
        f"{row['ours']['embed_loop']['tokens_per_s']:,}" if row["ours"]["embed_loop"] else "" for row in rows) + " |")
    return "\n".join(lines)


def machine() -> dict:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {}
    for name in ("torch", "transformers", "tokenizers", "sklearn", "numpy", "numba", "safetensors"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    return {"cpus": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "platform": platform.platform(), **versions}


def _describe_checkout(folder: Path) -> dict:
    def git(*cmd: str) -> str:
        done = subprocess.run(["git", "-C", str(folder), *cmd], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"dir": str(folder), "commit": git("rev-parse", "HEAD") or None,
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference-dir", required=True, type=Path, help="a checkout of eous/diversity-ordered-training")
    p.add_argument("--docs", type=int, nargs="+", default=[20_000, 100_000], help="corpus sizes (default: 20000 100000)")
    p.add_argument("--input", type=Path, default=None,
                   help="use this JSONL (its first N records per --docs size) instead of building a mixed corpus")
    p.add_argument("--model", type=Path, default=ROOT / "demo" / "SmolLM2-135M")
    p.add_argument("--n-clusters", type=int, default=30)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--only-ours", action="store_true",
                   help="skip the reference (to profile our stages, e.g. before and after a change)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each tool per size; the fastest counts")
    p.add_argument("--reference-python", default=sys.executable,
                   help="interpreter for the reference (default: this one; it needs numpy, torch, transformers, "
                        "safetensors, scikit-learn)")
    p.add_argument("--ours-dir", type=Path, default=ROOT,
                   help="checkout of this project to run as 'ours' (default: this one), e.g. an older commit")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench_vs_reference")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results_vs_reference.json")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    model = args.model.resolve()
    # No cache registry: a run would otherwise reuse the vectors an earlier run (or invocation) computed
    # for the same corpus under another folder, and time a cache hit.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DIVERSITY_ORDER_CACHE_DIR": ""}
    load_before = os.getloadavg()

    # Warm-up, untimed: both tools once on a small corpus, so neither pays first-run costs in the
    # timings (numba compiling our kernels into its on-disk cache, the OS reading libraries and
    # the model from disk). Our warm-up run also gives the import profile.
    ours_dir = args.ours_dir.resolve()
    import_profile(ours_dir, sys.executable, model, args.work, env)
    profile = import_profile(ours_dir, sys.executable, model, args.work, env)  # the second: files cached, kernels compiled
    if not args.only_ours:
        run_reference(args.reference_dir.resolve(), args.reference_python, args.work / "importtime_corpus.jsonl",
                      model, 5, args.seed, args.work, env, "warmup")

    rows = []
    for docs in args.docs:
        corpus = args.work / f"corpus_{docs}.jsonl"
        if args.input is not None:
            with open(args.input, "rb") as src, open(corpus, "wb") as dst:
                for i, line in enumerate(src):
                    if i >= docs:
                        break
                    dst.write(line)
            corpus_info = {"path": str(args.input), "docs": docs, "bytes": corpus.stat().st_size,
                           "sha256": _sha256(corpus), "builder": "first records of --input"}
        elif _corpus_description(corpus).get("builder") == "build_mixed_corpus":
            corpus_info = _corpus_description(corpus)  # built by an earlier run in this --work folder
        else:
            started = time.perf_counter()
            corpus_info = build_mixed_corpus(corpus, docs)
            corpus.with_suffix(".json").write_text(json.dumps(corpus_info))
            print(f"built {corpus} ({corpus_info['bytes'] / 1e6:.1f} MB, {corpus_info['per_source']}) "
                  f"in {time.perf_counter() - started:.1f} s", flush=True)
        best_ref = best_ours = None
        for _ in range(args.repeats):
            # Alternate, ours first, so a slow patch of a shared machine hits both.
            ours = run_ours(ours_dir, sys.executable, corpus, model, args.n_clusters, args.seed, args.work, env, f"{docs}")
            print(f"{docs:,} docs, ours:      {ours['wall_s']:.1f} s (cpu {ours['cpu_s']:.1f} s), "
                  f"{ours['peak_rss_mb']:,.0f} MB", flush=True)
            if args.only_ours:
                ref = None
                checks = check_outputs(corpus, None, ours)
            else:
                ref = run_reference(args.reference_dir.resolve(), args.reference_python, corpus, model,
                                    args.n_clusters, args.seed, args.work, env, f"{docs}")
                print(f"{docs:,} docs, reference: {ref['wall_s']:.1f} s (cpu {ref['cpu_s']:.1f} s), "
                      f"{ref['peak_rss_mb']:,.0f} MB", flush=True)
                checks = check_outputs(corpus, ref, ours)
            best_ours = ours if best_ours is None or ours["wall_s"] < best_ours["wall_s"] else best_ours
            if ref is not None and (best_ref is None or ref["wall_s"] < best_ref["wall_s"]):
                best_ref = ref
        row = {"docs": docs, "corpus": corpus_info, "reference": best_ref, "ours": best_ours, "checks": checks}
        if best_ref is not None:
            row.update(speedup=round(best_ref["wall_s"] / best_ours["wall_s"], 2),
                       cpu_ratio=round(best_ref["cpu_s"] / best_ours["cpu_s"], 2),
                       rss_ratio=round(best_ours["peak_rss_mb"] / best_ref["peak_rss_mb"], 2))
        rows.append(row)

    table = "" if args.only_ours else markdown_table(rows)
    stages = stage_table(rows)
    result = {"machine": machine(), "ours": _describe_checkout(ours_dir),
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()], "repeats": args.repeats,
              "n_clusters": args.n_clusters, "seed": args.seed, "seq_len": SEQ_LEN, "model": str(args.model),
              "reference_patch": f"{REFERENCE_CUDA_LINE!r} -> 'device = \"cpu\"' in a temp copy",
              "rows": rows, "import_profile": profile, "markdown_table": table, "markdown_stages": stages}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(("\n" + table if table else "") + "\n\nOur stages (seconds, peak RSS after the stage):\n\n" + stages)
    print(f"\nImports: {profile['total_import_s']} s in all; {profile['by_package_s']}")
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
