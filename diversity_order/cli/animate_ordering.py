"""Animate how the curated order is built: a colour-bar video and, with --umap, a point-cloud video.

Bar video (OUTPUT): each frame shows the documents along the token axis, the curated prefix
bright on the left and the documents not yet placed, in input order, dimmed on the right, over
a per-window diversity chart that grows as windows complete (dashed: the input order's mean).
UMAP video (OUTPUT_umap.mp4, with --umap B_umap2d.npy): every point grey, lit in its cluster
colour when placed. A PNG of each video's last frame is written beside it.

Pass --meta B_meta.json (or --labels/--order) to show exactly the clusters and order a curate
run wrote; without them the embeddings are re-clustered (as the original toolkit always does).
Needs ffmpeg: the one on PATH, else the binary of the imageio-ffmpeg package.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from ..defaults import DEFAULT_N_CLUSTERS, DEFAULT_ORDERING, DEFAULT_SEED, DEFAULT_SEQ_LEN
from . import ArgumentParser, add_output_flags, run_command, setup_logging

log = logging.getLogger("diversity_order")
# libx264's presets, fastest first.
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from ..orderings import CLUSTER_ORDERINGS

    p = ArgumentParser(description=__doc__, prog="animate_ordering.py")
    p.add_argument("--embeddings", type=Path, default=None,
                   help="N x D embeddings (B_embeddings.npy); needed only to re-cluster when no labels are given")
    p.add_argument("--token-counts", type=Path, default=None,
                   help="token count per document (A_token_counts.npy; default: the file --meta names)")
    p.add_argument("--umap", type=Path, default=None, help="N x 2 projection (B_umap2d.npy): also write OUTPUT_umap.mp4")
    p.add_argument("--meta", type=Path, default=None,
                   help="B_meta.json of a curate run: use its saved labels, order, and sequence length")
    p.add_argument("--labels", type=Path, default=None, help="cluster per document (B_labels.npy); overrides --meta's")
    p.add_argument("--order", type=Path, default=None, help="curated permutation (B_order.npy); overrides --meta's")
    p.add_argument("--n-clusters", type=int, default=None, help=f"k when re-clustering (default: {DEFAULT_N_CLUSTERS})")
    p.add_argument("--seq-len", type=int, default=None,
                   help=f"training sequence length in tokens (default: --meta's, else {DEFAULT_SEQ_LEN})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"k-means and ordering seed when recomputing (default: {DEFAULT_SEED})")
    p.add_argument("--ordering", default=DEFAULT_ORDERING, choices=list(CLUSTER_ORDERINGS),
                   help=f"ordering to recompute when no --order/--meta order is given (default: {DEFAULT_ORDERING})")
    p.add_argument("--n-frames", type=int, default=600, help="frames per video (default: 600)")
    p.add_argument("--fps", type=int, default=30, help="frames per second (default: 30)")
    p.add_argument("--output", type=Path, default=Path("ordering_animation.mp4"),
                   help="bar video path (default: ordering_animation.mp4)")
    p.add_argument("--size", default="1280x720", help="bar video size WxH, even (default: 1280x720)")
    p.add_argument("--umap-size", default="1080x1080", help="UMAP video size WxH, even (default: 1080x1080)")
    p.add_argument("--preset", default="medium", choices=X264_PRESETS, metavar="PRESET",
                   help=f"x264 preset, one of {', '.join(X264_PRESETS)}: faster encodes, bigger files (default: medium)")
    p.add_argument("--ffmpeg", default=None, help="ffmpeg binary (default: ffmpeg on PATH, else imageio-ffmpeg's)")
    add_output_flags(p, progress=False)
    return p.parse_args(argv)


def _size(text: str, flag: str) -> tuple[int, int]:
    from ..animate import even
    from ..errors import UserError

    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise UserError(f"{flag} {text}: expected WIDTHxHEIGHT, e.g. 1280x720") from None
    if w < 320 or h < 240:
        raise UserError(f"{flag} {text}: at least 320x240")
    if (even(w), even(h)) != (w, h):
        log.warning("%s %s: %ix%i, as H.264 needs even sizes", flag, text, even(w), even(h))
    return even(w), even(h)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.verbose)
    from .. import animate
    from ..arrays import load_npy
    from ..defaults import MAX_SEED
    from ..errors import MAX_COUNT, UserError, check_range
    from ..outputs import check_not_folders, check_plain_output, check_writable_folder

    check_range(args.n_frames, "--n-frames", 1, MAX_COUNT)
    check_range(args.fps, "--fps", 1, MAX_COUNT)
    check_range(args.seed, "--seed", 0, MAX_SEED)
    if args.output.is_dir():
        raise UserError(f"--output {args.output}: is a folder; give the video's path (e.g. "
                        f"{args.output / 'ordering_animation.mp4'})")
    if args.output.suffix and args.output.suffix.lower() != ".mp4":
        raise UserError(f"--output {args.output}: the video is an H.264 MP4; give a name ending in .mp4")
    width, height = _size(args.size, "--size")
    ffmpeg = animate.find_ffmpeg(args.ffmpeg)
    log.info("Encoder: %s", ffmpeg)
    inputs = animate.load_inputs(args.token_counts, args.embeddings, args.meta, args.labels, args.order,
                                 args.n_clusters, args.seq_len, args.seed, args.ordering)
    log.info("%d documents, K=%i, seq_len=%i; %s", inputs.labels.size, inputs.n_clusters, inputs.seq_len, inputs.source)
    names = animate.output_names(args.output)
    check_writable_folder(names["bar"].parent, "--output")
    check_not_folders(dict(zip(animate.OUTPUT_ROLES, names.values())), "--output", args.output)
    for name in names.values():
        check_plain_output(name, "--output")
    cloud = None
    if args.umap is not None:  # checked before any video is encoded
        import numpy as np

        uw, uh = _size(args.umap_size, "--umap-size")
        cloud = animate.UmapFrames(inputs, np.asarray(load_npy(args.umap, "--umap")), uw, uh)
        animate.check_projection_records(args.umap, inputs)

    started = time.perf_counter()
    bars = animate.BarFrames(inputs, width, height)
    frames = animate.write_video(names["bar"], bars.frames(args.n_frames), args.n_frames, width, height, args.fps,
                                 ffmpeg, args.preset, names["bar_preview"])
    log.info("Bar video: %s (%d frames at %d fps: %.1f s long, %ix%i; made in %.1f s), preview %s", names["bar"],
             frames, args.fps, frames / args.fps, width, height, time.perf_counter() - started, names["bar_preview"])
    if cloud is not None:
        started = time.perf_counter()
        frames = animate.write_video(names["umap"], cloud.frames(args.n_frames), args.n_frames, uw, uh, args.fps,
                                     ffmpeg, args.preset, names["umap_preview"])
        log.info("UMAP video: %s (%d frames at %d fps: %.1f s long, %ix%i; made in %.1f s), preview %s",
                 names["umap"], frames, args.fps, frames / args.fps, uw, uh, time.perf_counter() - started,
                 names["umap_preview"])
    return 0


def console() -> int:
    """The ``animate-ordering`` command."""
    return run_command(main)
