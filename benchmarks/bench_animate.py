#!/usr/bin/env python3
"""Time the bar video: 600 frames for 100K documents (K=30, 1280x720, libx264 crf 18).

Run: .venv/bin/python benchmarks/bench_animate.py [--docs 100000 --frames 600 --preset medium]
Reports the frame painting alone (no encoder) and the full render + encode, in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from diversity_order import animate  # noqa: E402
from diversity_order.orderings import stratified_order  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--clusters", type=int, default=30)
    p.add_argument("--frames", type=int, default=600)
    p.add_argument("--seq-len", type=int, default=131072)
    p.add_argument("--preset", default="medium")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    labels = np.sort(rng.integers(0, args.clusters, args.docs))  # grouped by topic, as raw data often is
    counts = rng.lognormal(6.5, 1.0, args.docs).astype(np.int64) + 1
    order = stratified_order(labels, counts, args.clusters)
    inputs = animate.AnimationInputs(labels, order, counts, args.clusters, args.seq_len, "synthetic")
    ffmpeg = animate.find_ffmpeg()

    t0 = time.perf_counter()
    bars = animate.BarFrames(inputs, 1280, 720)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in bars.frames(args.frames):
        pass
    paint = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        bars = animate.BarFrames(inputs, 1280, 720)
        n = animate.write_video(Path(tmp) / "bar.mp4", bars.frames(args.frames), args.frames, 1280, 720, 30, ffmpeg,
                                args.preset, Path(tmp) / "bar.png")
        total = time.perf_counter() - t0
        size = (Path(tmp) / "bar.mp4").stat().st_size
    print(json.dumps({"docs": args.docs, "frames": n, "clusters": args.clusters, "preset": args.preset,
                      "setup_s": round(setup, 2), "paint_only_s": round(paint, 2),
                      "paint_fps": round(args.frames / paint, 1), "render_and_encode_s": round(total, 2),
                      "video_mb": round(size / 1e6, 2), "ffmpeg": ffmpeg}, indent=2))


if __name__ == "__main__":
    main()
