"""Per-rank peak memory of curate_dataset.py under torchrun (labels-only path), at a given N.

    .venv/bin/python benchmarks/bench_torchrun.py --docs 1000000 [--ranks 2] [--timeout 3000]

Builds ``--docs`` short documents (4-6 consecutive non-blank lines of the standard library's
sources, ~50 tokens each, grouped by file: the "bad" order) unless the file exists, removes the
run's caches so every rank tokenizes and embeds its share, and runs

    torchrun --standalone --nproc-per-node R benchmarks/bench_torchrun.py --rank-entry DIR -- <curate flags>

where each rank runs the real script in-process and then records its own peak resident memory
(``ru_maxrss``, file-backed pages included) and the peak of its anonymous memory (``RssAnon``,
sampled every 0.2 s: what the process holds itself, without the pages of files it maps). Rank 0's
metadata adds its peak after each stage. Prints one Markdown row per rank and appends the run to
``benchmarks/results_torchrun.json``. Run it at 1M and 5M: a rank that held vectors would grow by
N x 576 x 4 bytes (2.3 KB per document); the labels-only path grows by its per-document arrays.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results_torchrun.json"


def stdlib_lines() -> list[list[str]]:
    """The non-blank lines (8+ characters) of each standard-library source file, file by file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            lines = [line.rstrip() for line in path.read_text(errors="replace").splitlines() if len(line.strip()) >= 8]
        except OSError:
            continue
        if lines:
            files.append(lines)
    return files


def build_corpus(target: Path, docs: int) -> None:
    """Pass p cuts every file into groups of 4 + p % 3 lines (shifted by p % 4); from the 4th pass on
    each document also gets one line from elsewhere, so later passes are not copies of earlier ones."""
    files = stdlib_lines()
    everything = [line for lines in files for line in lines]
    written, passes = 0, 0
    tmp = target.with_suffix(".partial")
    with open(tmp, "w") as out:
        while written < docs:
            size, shift = 4 + passes % 3, passes % 4
            for lines in files:
                for start in range(shift, len(lines), size):
                    if written >= docs:
                        break
                    text = "\n".join(lines[start : start + size])
                    if passes >= 4:
                        text += "\n" + everything[(written * 7919 + passes) % len(everything)]
                    out.write(json.dumps({"text": text, "id": written}) + "\n")
                    written += 1
            passes += 1
    tmp.rename(target)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _frames(frame) -> list:
    """The frames of a stack, innermost first."""
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


def rank_entry(report_dir: Path, curate_args: list[str]) -> int:
    """One torchrun rank: the real script in this process, then this rank's memory figures (also
    written every 10 s while it runs, so a run stopped by --timeout still reports its peaks so far)."""
    sys.path.insert(0, os.environ.get("BENCH_TORCHRUN_CODE", str(ROOT)))
    rank = int(os.environ.get("RANK", "0"))
    peak_anon = [0]
    peak_where = [""]  # what the main thread was running when the anonymous peak was sampled
    main_thread = threading.get_ident()
    done = threading.Event()
    started = time.perf_counter()

    def note_peak() -> None:
        anon = _status_kb("RssAnon")
        if anon > peak_anon[0]:
            peak_anon[0] = anon
            frame = sys._current_frames().get(main_thread)
            peak_where[0] = " < ".join(f"{Path(f.f_code.co_filename).stem}.{f.f_code.co_name}:{f.f_lineno}"
                                       for f in _frames(frame)[:1] + [f for f in _frames(frame)[1:]
                                                                       if "diversity_order" in f.f_code.co_filename][:5])

    def report(code=None) -> None:
        note_peak()
        (report_dir / f"rank{rank}.json").write_text(json.dumps({
            "rank": rank, "exit": code, "finished": code is not None,
            "seconds": round(time.perf_counter() - started, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "peak_anon_mb": round(peak_anon[0] / 1024), "peak_anon_at": peak_where[0]}))

    def sample() -> None:
        ticks = 0
        while not done.wait(0.2):
            note_peak()
            ticks += 1
            if ticks % 50 == 0:
                report()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    import curate_dataset
    from diversity_order.cli import run_main

    code = run_main(curate_dataset.main, curate_args)
    done.set()
    sampler.join()
    report(code)
    return code


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--model", type=Path, default=ROOT / "demo" / "SmolLM2-135M")
    p.add_argument("--work", type=Path, default=Path("/tmp/diversity_order_bench_torchrun"))
    p.add_argument("--timeout", type=float, default=3000, help="seconds before the run is stopped")
    p.add_argument("--extra", nargs="*", default=[], help="extra curate_dataset.py flags")
    p.add_argument("--keep-caches", action="store_true", help="reuse the embeddings from an earlier run")
    p.add_argument("--code", type=Path, default=ROOT,
                   help="the checkout whose curate_dataset.py runs (e.g. an older one, to compare)")
    args = p.parse_args()
    work = args.work / f"docs_{args.docs}"
    work.mkdir(parents=True, exist_ok=True)
    data = work / "d.jsonl"
    if not data.exists():
        started = time.perf_counter()
        build_corpus(data, args.docs)
        print(f"built {data} ({data.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s", flush=True)
    if not args.keep_caches:
        for cache in [*work.glob("c_embeddings*"), *work.glob("d_token_counts*"), work / "registry"]:
            shutil.rmtree(cache) if cache.is_dir() else cache.unlink(missing_ok=True)
    reports = work / "ranks"
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir()
    curate = ["--input", str(data), "--output", str(work / "c.jsonl"), "--model-dir", str(args.model),
              "--seq-len", "131072", "--no-plot", "--no-progress", *args.extra]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
           str(Path(__file__).resolve()), "--rank-entry", str(reports), "--", *curate]
    env = dict(os.environ, HF_HUB_OFFLINE="1", DIVERSITY_ORDER_CACHE_DIR=str(work / "registry"),
               BENCH_TORCHRUN_CODE=str(args.code.resolve()))
    print(" ".join(cmd), flush=True)
    started = time.perf_counter()
    launcher = subprocess.Popen(cmd, env=env, start_new_session=True)  # its own group: stopped with its ranks
    try:
        launcher.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGTERM)
        try:
            launcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
    wall = time.perf_counter() - started
    ranks = [json.loads(path.read_text()) for path in sorted(reports.glob("rank*.json"))]
    if launcher.returncode != 0:
        print(f"torchrun stopped (exit {launcher.returncode}) after {wall:.0f} s; each rank's peaks so far:")
        for r in ranks:
            print(f"rank {r['rank']}: peak RSS {r['peak_rss_mb']} MB, peak anonymous {r['peak_anon_mb']} MB "
                  f"after {r['seconds']} s")
        sys.exit(1)
    meta = json.loads((work / "c_meta.json").read_text())
    print(f"\n{args.docs:,} documents, {meta['total_tokens']:,} tokens, {data.stat().st_size / 1e9:.2f} GB JSONL, "
          f"{args.ranks} ranks, wall {wall:.0f} s; one rank's share of the vectors would be "
          f"{args.docs * 576 * 4 / args.ranks / 2**20:.0f} MB")
    print("| rank | peak RSS (MB) | peak anonymous RSS (MB) | seconds |\n|---|---|---|---|")
    for r in ranks:
        print(f"| {r['rank']} | {r['peak_rss_mb']} | {r['peak_anon_mb']} | {r['seconds']} |")
    for r in ranks:
        print(f"rank {r['rank']}'s anonymous peak was sampled in {r.get('peak_anon_at') or '?'}")
    print("\nrank 0 by stage:\n| stage | seconds | peak RSS after (MB) |\n|---|---|---|")
    for stage, seconds in meta["timings_seconds"].items():
        print(f"| {stage} | {seconds:.1f} | {meta['peak_rss_mb'][stage]:.0f} |")
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    results.append({"docs": args.docs, "ranks": args.ranks, "code": str(args.code.resolve()),
                    "tokens": meta["total_tokens"], "wall_seconds": round(wall),
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores", "per_rank": ranks,
                    "rank0_stages": {s: {"seconds": round(t, 1), "peak_rss_mb": meta["peak_rss_mb"][s]}
                                     for s, t in meta["timings_seconds"].items()},
                    "command": " ".join(["benchmarks/bench_torchrun.py", "--docs", str(args.docs),
                                         "--ranks", str(args.ranks), *(["--code", str(args.code)] if args.code != ROOT else []),
                                         *(f"--extra={flag}" for flag in args.extra)])})
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rank-entry":
        separator = sys.argv.index("--")
        sys.exit(rank_entry(Path(sys.argv[2]), sys.argv[separator + 1 :]))
    main()
