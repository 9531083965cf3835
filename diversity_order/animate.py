"""Videos of the curated ordering being built, frame by frame.

Bar video: a colour strip along the token axis (the curated prefix bright on the left, the
documents not yet placed, in input order, dimmed on the right) over a per-window diversity
chart that grows as windows complete, with the input order's mean as a dashed reference.
UMAP video: every point grey, lit in its cluster colour at the frame where it is placed.

Unlike the original toolkit (a fresh matplotlib figure and a PNG per frame), the static parts are
drawn once with matplotlib and every frame is painted into a numpy RGB array and streamed to
ffmpeg as rawvideo (libx264, yuv420p, crf 18). ffmpeg is the one on PATH, else the binary
shipped by the ``imageio-ffmpeg`` package.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .arrays import check_labels, check_order, check_token_counts, load_npy
from .atomic import atomic_open, give_plain_permissions
from .caches import ids_digest, records_digest, sidecar_paths
from .defaults import DEFAULT_N_CLUSTERS, DEFAULT_ORDERING, DEFAULT_SEED, DEFAULT_SEQ_LEN
from .diversity import summarize_windows, window_diversity
from .errors import UserError

log = logging.getLogger(__name__)

DIM_TOWARD = np.array([235, 235, 235], dtype=np.float32)  # unplaced documents: blended toward light grey
DIM_KEEP = 0.25  # share of the cluster colour an unplaced document keeps
CURVE_RGB = np.array([214, 39, 40], dtype=np.uint8)


# ---------------------------------------------------------------- inputs

@dataclass
class AnimationInputs:
    labels: np.ndarray  # int64 cluster per document, input order
    order: np.ndarray  # int64 permutation: position i holds input document order[i]
    token_counts: np.ndarray  # int64 per document, input order
    n_clusters: int
    seq_len: int
    source: str  # where labels/order came from
    packing: str = "whole"  # the curate run's --packing (packing.py)
    token_counts_file: Path | None = None  # the file the counts came from (its records' fingerprints lie beside it)


def _resolve_beside(meta_path: Path, recorded: str) -> Path:
    """A path recorded in the metadata: as written, else relative to the metadata's folder."""
    p = Path(recorded)
    if p.is_file():
        return p
    for candidate in (meta_path.parent / p, meta_path.parent / p.name):
        if candidate.is_file():
            return candidate
    return p


def read_meta(meta_path: Path) -> dict:
    meta_path = Path(meta_path)
    if meta_path.is_dir():
        found = sorted(meta_path.glob("*_meta.json"))
        raise UserError(f"--meta {meta_path}: is a folder; give a curate run's metadata file"
                        + (f" (e.g. {found[0]})" if found else " (B_meta.json beside its --output B.jsonl)"))
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise UserError(f"--meta {meta_path}: file not found") from None
    except OSError as exc:
        raise UserError(f"--meta {meta_path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"--meta {meta_path}: not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UserError(f"--meta {meta_path}: expected a JSON object")
    if meta.get("complete") is False:
        raise UserError(f"--meta {meta_path}: {meta.get('note', 'the run that wrote it did not finish')}")
    if not {"sequence_length", "order_file", "labels_file"} & set(meta):  # (a packed export's or a report's JSON)
        raise UserError(f"--meta {meta_path}: not a curate run's metadata (it names no order, labels or "
                        "sequence length); give the B_meta.json beside a curate run's --output B.jsonl")
    for key, kind, what in _META_FIELDS:
        value = meta.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)
                                  or (kind is int and value < _META_MINIMUM[key])):
            raise UserError(f"--meta {meta_path}: its {key} is {json.dumps(value)[:60]}, not {what} (edited or damaged?); "
                            "run curate_dataset.py again for its metadata")
    return meta


# What animate reads from a curate run's metadata, and what each must be (a hand-edited "abc" was a traceback; a
# -5 was blamed on the token counts).
_META_FIELDS = (("sequence_length", int, "a whole number of at least 1"), ("n_clusters", int, "a whole number of at least 1"),
                ("total_tokens", int, "a whole number of at least 0"),
                ("special_tokens_per_document", int, "a whole number of at least 0"),
                ("labels_file", str, "a path"), ("order_file", str, "a path"), ("token_counts_file", str, "a path"),
                ("packing", str, "a packing model's name"))
_META_MINIMUM = {"sequence_length": 1, "n_clusters": 1, "total_tokens": 0, "special_tokens_per_document": 0}


def load_inputs(token_counts: Path | None, embeddings: Path | None = None, meta: Path | None = None,
                labels: Path | None = None, order: Path | None = None, n_clusters: int | None = None,
                seq_len: int | None = None, seed: int = DEFAULT_SEED, ordering: str = DEFAULT_ORDERING,
                packing: str = "whole") -> AnimationInputs:
    """Labels and order as a curate run saved them (``--meta``, or ``--labels``/``--order``);
    k-means on the embeddings and ``ordering`` (a cluster ordering of the registry) only for what is
    not given. ``token_counts`` None: the file ``--meta`` names (``token_counts_file``)."""
    from_meta = token_counts is None
    if token_counts is None:
        recorded = read_meta(meta).get("token_counts_file") if meta is not None else None
        if not recorded:
            raise UserError("--token-counts is required (A_token_counts.npy beside the curate run's input), unless "
                            "--meta is of a run that names it")
        token_counts = _resolve_beside(Path(meta), recorded)
    counts = check_token_counts(load_npy(token_counts, "--token-counts"), f"--token-counts {token_counts}")
    n = counts.size
    if n == 0:
        raise UserError(f"--token-counts {token_counts}: no documents")
    meta_k = None
    digests: dict = {}  # the run's digests of its records, labels and order (runs since 2026-11-28)
    given = {"labels": labels is not None, "order": order is not None}
    if meta is not None:
        m = read_meta(meta)
        digests = m.get("digests") if isinstance(m.get("digests"), dict) else {}
        if labels is None and m.get("labels_file"):
            labels = _resolve_beside(Path(meta), m["labels_file"])
        if order is None and m.get("order_file"):
            order = _resolve_beside(Path(meta), m["order_file"])
        meta_k = m.get("n_clusters")
        if seq_len is None and m.get("sequence_length"):
            seq_len = int(m["sequence_length"])
        elif m.get("sequence_length") and seq_len != m["sequence_length"]:
            log.warning("--seq-len %i: the windows shown are of %i tokens, not the %i of the curate run of --meta %s "
                        "(its statistics are of those)", seq_len, seq_len, m["sequence_length"], meta)
        packing = m.get("packing") or packing
        # The curate run counted the tokens its trainer adds per document (--count-special-tokens).
        counts = counts + int(m.get("special_tokens_per_document") or 0)
        # Token counts of another corpus with as many documents would pass every other check and draw
        # windows that run never had.
        recorded = m.get("total_tokens")
        if recorded is not None and int(counts.sum()) != int(recorded) and from_meta:
            raise UserError(f"--meta {meta}: its token counts file {token_counts} holds {int(counts.sum()):,} tokens "
                            f"now, but that run counted {int(recorded):,}: a later run over changed records (or with "
                            "another chat template) rewrote it; run curate_dataset.py again for the labels and order "
                            "of these records")
        if recorded is not None and int(counts.sum()) != int(recorded):
            raise UserError(f"--token-counts {token_counts}: {int(counts.sum()):,} tokens, but the curate run of "
                            f"--meta {meta} counted {int(recorded):,}; pass the token counts of that run's input "
                            f"({m.get('token_counts_file') or 'X_token_counts.npy beside it'})")
        _check_counts_records(Path(token_counts), digests.get("records"), meta, from_meta)
        if labels is None:
            raise UserError(f"--meta {meta}: no labels_file recorded (an older curate run?); pass --labels")
    seq_len = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    if seq_len < 1:
        raise UserError(f"--seq-len {seq_len}: must be at least 1")

    if labels is not None:
        lab = check_labels(load_npy(labels, "--labels"), n, f"--labels {labels}")
        _check_run_file("labels", labels, lab, digests.get("labels"), meta, given["labels"])
        k = max(int(lab.max()) + 1, int(meta_k or 0))
        if n_clusters is not None and n_clusters != k:  # (k-means' k: the labels are given)
            log.warning("--n-clusters %i not used: the labels of %s give K = %i", n_clusters, labels, k)
        source = f"labels from {labels}"
    else:
        if embeddings is None:
            raise UserError("give --embeddings (to cluster), or the labels a curate run saved (--meta or --labels)")
        from .clustering import kmeans_labels

        emb = load_npy(embeddings, "--embeddings")
        if emb.ndim != 2 or emb.shape[0] != n:
            raise UserError(f"--embeddings {embeddings}: shape {emb.shape}, but --token-counts has {n} documents")
        k = DEFAULT_N_CLUSTERS if n_clusters is None else n_clusters
        if not 1 <= k <= n:
            raise UserError(f"--n-clusters {k}: must be between 1 and the number of documents ({n})")
        emb = np.asarray(emb, dtype=np.float32)
        bad = ~np.isfinite(emb).all(axis=1)
        if bad.any():
            log.warning("%d embedding row(s) are NaN/inf; they become zero vectors for clustering", int(bad.sum()))
            emb = np.where(bad[:, None], 0, emb)
        log.warning("Re-clustering the embeddings (k=%i, no PCA): the clusters may differ from the curate run's; "
                    "pass --meta B_meta.json (or --labels/--order) to show exactly what was written", k)
        lab = kmeans_labels(emb, k, seed)
        source = f"k-means (k={k}) on {embeddings}"
    if order is not None:
        if ordering != DEFAULT_ORDERING:
            log.warning("--ordering %s not used: the order is read from %s", ordering, order)
        ordr = check_order(load_npy(order, "--order"), n, f"--order {order}")
        _check_run_file("order", order, ordr, digests.get("order"), meta, given["order"])
        source += f", order from {order}"
    else:
        from .orderings import CLUSTER_ORDERINGS, ORDERINGS, OrderingOptions

        if ordering not in CLUSTER_ORDERINGS:
            raise UserError(f"--ordering {ordering}: choose a cluster ordering ({', '.join(CLUSTER_ORDERINGS)})")
        ordr = ORDERINGS[ordering](lab, counts, k, OrderingOptions(seed=seed, seq_len=seq_len, packing=packing))
        source += f", {ordering} order recomputed"
    return AnimationInputs(lab, ordr, counts, int(k), int(seq_len), source, packing, Path(token_counts))


def _check_counts_records(token_counts: Path, recorded: str | None, meta: Path, from_meta: bool) -> None:
    """The token counts are of the records the run of ``meta`` ordered, by the fingerprints beside them against the
    digest the run recorded: the counts file is shared by every run over the input, and a later run over the same
    records reordered rewrites it with as many tokens (every document then drawn with another one's count)."""
    if not isinstance(recorded, str):
        return
    try:
        fingerprints = np.load(sidecar_paths(token_counts)[0])
    except (OSError, ValueError):
        return  # copied without them: the total was checked
    if records_digest(fingerprints) == recorded:
        return
    if from_meta:
        raise UserError(f"--meta {meta}: its token counts file {token_counts} is of other records now (or of the same "
                        "in another order, by the fingerprints beside it): a later run over changed records rewrote "
                        "it; run curate_dataset.py again for the labels and order of these records")
    raise UserError(f"--token-counts {token_counts}: the counts of other records than those the curate run of --meta "
                    f"{meta} ordered (or of the same in another order, by the fingerprints beside it)")


def _check_run_file(what: str, path: Path, values: np.ndarray, recorded: str | None, meta: Path | None,
                    given: bool) -> None:
    """The labels or order read are those the run of ``meta`` wrote, by the digest it recorded: one named by the
    metadata and changed since is an error (another run wrote over it); one given is shown, with a warning."""
    if meta is None or not isinstance(recorded, str) or ids_digest(values) == recorded:
        return
    if not given:
        raise UserError(f"--meta {meta}: its {what} file {path} is not the one that run wrote (another run wrote "
                        f"over it); run curate_dataset.py again")
    log.warning("--%s %s: not the %s the curate run of --meta %s wrote; shown with that run's token counts and "
                "settings", what, path, what, meta)


def check_projection_records(projection: Path, inputs: AnimationInputs) -> None:
    """A 2-D projection of as many other records (the same ones reordered or edited, then a run with --no-plot,
    which leaves the earlier run's projection) passed the row-count check and drew each point in another
    record's colour. Where both files have their records' fingerprints beside them, they must be the same."""
    if inputs.token_counts_file is None:
        return
    try:
        theirs = np.load(sidecar_paths(projection)[0])
        ours = np.load(sidecar_paths(inputs.token_counts_file)[0])
    except (OSError, ValueError):
        return  # no fingerprints to compare (files copied without them): the row count was checked
    if theirs.shape == ours.shape and not np.array_equal(theirs, ours):
        differ = int(np.count_nonzero(theirs != ours))
        raise UserError(f"--umap {projection}: a projection of other records ({differ:,} of its {theirs.size:,} rows "
                        f"are not those of {inputs.token_counts_file.name}, by the fingerprints beside each): a curate "
                        "run with --no-plot leaves the last projection; run curate_dataset.py without --no-plot to "
                        "write it for these")


# ---------------------------------------------------------------- encoder

def find_ffmpeg(explicit: str | None = None) -> str:
    """``explicit``, else ffmpeg on PATH, else imageio-ffmpeg's bundled binary."""
    if explicit:
        found = shutil.which(explicit)
        if not found:
            raise UserError(f"--ffmpeg {explicit}: not found or not executable")
        return found
    found = shutil.which("ffmpeg")
    if found:
        return found
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except ImportError:
        pass
    except RuntimeError as exc:  # the package is there but has no binary for this platform
        raise UserError(f"no ffmpeg found: imageio-ffmpeg has no usable binary here ({exc}); "
                        "put ffmpeg on PATH or pass --ffmpeg") from None
    raise UserError("no ffmpeg found: pip install imageio-ffmpeg (ships a binary), put ffmpeg on PATH, "
                    "or pass --ffmpeg PATH")


class VideoWriter:
    """Streams RGB uint8 frames (H x W x 3, even sizes) to ffmpeg; the MP4 appears atomically on close."""

    def __init__(self, path: Path, width: int, height: int, fps: int, ffmpeg: str, preset: str = "medium"):
        if width % 2 or height % 2:
            raise ValueError("frame width and height must be even for yuv420p")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.shape = (height, width, 3)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".mp4", dir=self.path.parent)
        os.close(fd)
        give_plain_permissions(self.tmp)  # mkstemp makes 0600; give the video a plain file's mode
        self.log = tempfile.TemporaryFile()
        cmd = [ffmpeg, "-y", "-hide_banner", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
               "-s", f"{width}x{height}", "-r", str(fps), "-i", "-", "-an", "-c:v", "libx264", "-preset", preset,
               "-crf", "18", "-pix_fmt", "yuv420p", "-movflags", "+faststart", "-f", "mp4", self.tmp]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.log)
        self.frames = 0

    def _error(self) -> UserError:
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace").strip().splitlines()[-3:]
        return UserError(f"ffmpeg failed writing {self.path}: {' | '.join(tail) or 'no message'}")

    def write(self, frame: np.ndarray) -> None:
        assert frame.shape == self.shape and frame.dtype == np.uint8
        try:
            self.proc.stdin.write(np.ascontiguousarray(frame).data)
        except (BrokenPipeError, OSError):
            self.proc.wait()
            self.abort()
            raise self._error() from None
        self.frames += 1

    def close(self) -> None:
        self.proc.stdin.close()
        if self.proc.wait() != 0:
            error = self._error()
            self.abort()
            raise error
        os.replace(self.tmp, self.path)
        self.log.close()

    def abort(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def save_png(path: Path, frame: np.ndarray) -> None:
    from PIL import Image

    with atomic_open(path, "wb") as handle:
        Image.fromarray(frame).save(handle, format="PNG")


# ---------------------------------------------------------------- frames

def placed_per_frame(n_docs: int, n_frames: int) -> np.ndarray:
    """Documents placed at each frame: evenly spaced, the last frame all of them."""
    return np.round(np.arange(1, n_frames + 1) * n_docs / n_frames).astype(np.int64)


def _figure(width: int, height: int):
    from .plots import pyplot

    plt = pyplot()
    fig = plt.figure(figsize=(width / 100, height / 100), dpi=100)
    return plt, fig


def _render(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _inner_box(ax, height: int) -> tuple[int, int, int, int]:
    """Pixel rows/cols (top, bottom, left, right; exclusive ends) inside an axes' (or a legend's) frame."""
    box = ax.get_window_extent()
    left, right = int(np.ceil(box.x0)) + 1, int(np.floor(box.x1)) - 1
    top, bottom = height - int(np.floor(box.y1)) + 1, height - int(np.ceil(box.y0)) - 1
    return top, bottom, left, right


def _rgb(colors: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(colors)[:, :3] * 255).astype(np.uint8)


def chart_top(n_clusters: int, most_in_a_window: float) -> float:
    """The diversity chart's top value: K, unless no window comes within two thirds of it; then the most
    clusters any window holds."""
    return n_clusters if most_in_a_window * 1.5 >= n_clusters else max(most_in_a_window, 1.0)


class BarFrames:
    """Paints the bar video's frames: a static matplotlib background, then per frame the
    colour strip and the curve of completed windows, straight into an RGB array."""

    def __init__(self, inputs: AnimationInputs, width: int = 1280, height: int = 720):
        from .plots import cluster_colors

        self.inputs = inputs
        labels, counts, order = inputs.labels, inputs.token_counts, inputs.order
        self.n = labels.size
        k = inputs.n_clusters
        bright = _rgb(cluster_colors(k))
        self.bright = bright
        self.dim = np.round(bright * DIM_KEEP + DIM_TOWARD * (1 - DIM_KEEP)).astype(np.uint8)
        self.before = window_diversity(labels, counts, inputs.seq_len, packing=inputs.packing)
        self.after = window_diversity(labels, counts, inputs.seq_len, order, packing=inputs.packing)
        sb, sa = summarize_windows(self.before), summarize_windows(self.after)
        self.summary_before, self.summary_after = sb, sa
        self.total_tokens = int(counts.sum())
        self.n_axis = max(self.before.size, self.after.size)

        plt, fig = _figure(width, height)
        gs = fig.add_gridspec(2, 1, height_ratios=[1, 3], left=0.06, right=0.98, top=0.88, bottom=0.09, hspace=0.28)
        ax_bar = fig.add_subplot(gs[0])
        ax_bar.set_xticks([])
        ax_bar.set_yticks([])
        ax_bar.set_title("Documents along the token axis: placed (bright, curated order) | "
                         "not yet placed (dimmed, input order)", fontsize=10)
        ax = fig.add_subplot(gs[1])
        ax.set_xlim(0, self.n_axis)
        # No window holds more than K clusters: the band above the top holds the legend, in one row, clear of the
        # curve (drawn into the frames over the background, it ran through a legend inside the chart). Where windows
        # hold far fewer clusters than K (K = 1,000 at 4,096 tokens; sparse label ids), K is left off the chart,
        # which it would flatten.
        top = chart_top(k, max(float(self.before.max(initial=0)), float(self.after.max(initial=0))))
        ax.set_ylim(0, top * 1.2 + 1)
        ax.plot(np.arange(self.before.size) + 0.5, self.before, color="0.8", lw=0.8, label="input order, per window")
        ax.axhline(sb["mean"], color="0.3", ls="--", lw=1.2, label=f"input order mean {sb['mean']:.2f}")
        if top == k:
            ax.axhline(k, color="0.6", ls=":", lw=1, label=f"K = {k}")
        ax.plot([], [], color=CURVE_RGB / 255, lw=2, label=f"curated order (final mean {sa['mean']:.2f})")
        ax.legend(loc="upper center", ncol=4, fontsize=8, framealpha=0.9)
        ax.set_xlabel(f"training window ({inputs.seq_len:,} tokens each)")
        ax.set_ylabel("unique clusters in window")
        fig.suptitle(f"Building the curated order: {self.n:,} documents, {self.total_tokens:,} tokens, K = {k} "
                     f"— mean diversity {sb['mean']:.2f} -> {sa['mean']:.2f}", fontsize=12)
        self.background = _render(fig)
        self.bar_box = _inner_box(ax_bar, height)
        self.chart_box = _inner_box(ax, height)
        self.legend_box = _inner_box(ax.get_legend(), height)
        self.chart_ylim = ylim = ax.get_ylim()
        plt.close(fig)

        # Token axis: column j shows the document covering token position (j + 0.5) * total / W.
        top, bottom, left, right = self.bar_box
        self.bar_width = right - left
        self.positions = (np.arange(self.bar_width) + 0.5) * max(self.total_tokens, 1) / self.bar_width
        self.curated_ends = np.cumsum(counts[order])
        self.input_ends = np.cumsum(counts)
        self._curve_mask(ylim)

    def _curve_mask(self, ylim) -> None:
        """The full curated curve as a boolean image (chart rows x columns), plus the first
        window each column shows: a frame reveals the columns whose windows are complete."""
        top, bottom, left, right = self.chart_box
        h, w = bottom - top, right - left
        values = self.after.astype(np.float64)
        n_win = values.size
        cols = np.arange(w)
        first = np.floor(cols * self.n_axis / w).astype(np.int64)
        last = np.maximum(np.floor((cols + 1) * self.n_axis / w).astype(np.int64), first + 1)
        valid = first < n_win
        first_c, last_c = np.minimum(first, n_win - 1), np.minimum(last, n_win)
        lo = np.minimum.reduceat(values, first_c) if n_win else np.zeros(w)
        hi = np.maximum.reduceat(values, first_c) if n_win else np.zeros(w)
        # reduceat runs to the next start; clip to this column's own windows where it ran past.
        single = last_c - first_c <= 1
        lo, hi = np.where(single, values[first_c], lo), np.where(single, values[first_c], hi)
        prev_last = np.concatenate([[values[first_c[0]]], values[np.maximum(last_c - 1, 0)][:-1]])
        lo, hi = np.minimum(lo, prev_last), np.maximum(hi, prev_last)

        def to_row(v):
            return np.clip(np.round((ylim[1] - v) / (ylim[1] - ylim[0]) * (h - 1)), 0, h - 1).astype(np.int64)

        r_top, r_bottom = to_row(hi) - 1, to_row(lo) + 1  # 3 px thick at flat stretches
        rows = np.arange(h)[:, None]
        mask = (rows >= r_top[None, :]) & (rows <= r_bottom[None, :]) & valid[None, :]
        self.curve = mask
        self.col_first_window = np.where(valid, first, np.iinfo(np.int64).max)

    def complete_windows(self, placed: int) -> int:
        """Windows of the curated order that are final once ``placed`` documents are packed."""
        if placed >= self.n:
            return self.after.size
        if placed == 0:
            return 0
        prefix = window_diversity(self.inputs.labels, self.inputs.token_counts, self.inputs.seq_len,
                                  self.inputs.order[:placed], packing=self.inputs.packing)
        return max(prefix.size - 1, 0)  # the last window may still grow

    def frame(self, placed: int, unplaced_mask: np.ndarray) -> np.ndarray:
        """``unplaced_mask``: bool per input document, True while not yet placed."""
        out = self.background.copy()
        labels, counts = self.inputs.labels, self.inputs.token_counts
        # Bar: curated prefix, then the rest in input order.
        rest = np.flatnonzero(unplaced_mask)
        prefix_tokens = int(self.curated_ends[placed - 1]) if placed else 0
        in_prefix = self.positions < prefix_tokens
        strip = np.empty((self.bar_width, 3), dtype=np.uint8)
        idx = np.minimum(np.searchsorted(self.curated_ends, self.positions[in_prefix], side="right"), self.n - 1)
        strip[in_prefix] = self.bright[labels[self.inputs.order[idx]]]
        if rest.size:
            rest_ends = prefix_tokens + np.cumsum(counts[rest])
            idx = np.minimum(np.searchsorted(rest_ends, self.positions[~in_prefix], side="right"), rest.size - 1)
            strip[~in_prefix] = self.dim[labels[rest[idx]]]
        else:
            strip[~in_prefix] = self.bright[labels[self.inputs.order[-1]]]
        top, bottom, left, right = self.bar_box
        out[top:bottom, left:right] = strip[None, :, :]
        # Chart: columns whose windows are complete.
        done = int(np.searchsorted(self.col_first_window, self.complete_windows(placed), side="left"))
        if done:
            top, bottom, left, right = self.chart_box
            region = out[top:bottom, left:left + done]
            region[self.curve[:, :done]] = CURVE_RGB
        return out

    def frames(self, n_frames: int):
        unplaced = np.ones(self.n, dtype=bool)
        done = 0
        for placed in placed_per_frame(self.n, n_frames):
            unplaced[self.inputs.order[done:placed]] = False
            done = placed
            yield self.frame(int(placed), unplaced)


class UmapFrames:
    """Paints the UMAP video: all points grey, each lit in its cluster colour once placed."""

    def __init__(self, inputs: AnimationInputs, projection: np.ndarray, width: int = 1080, height: int = 1080):
        from .plots import UNPLACED_RGB, cloud_frame, cluster_colors

        xy = np.asarray(projection, dtype=np.float64)
        n = inputs.labels.size
        if xy.ndim != 2 or xy.shape[1:] != (2,):
            raise UserError(f"--umap: expected {n} x 2 coordinates (B_umap2d.npy), found shape {xy.shape}: not a "
                            "2-D projection (embeddings are N x their width); give the B_umap2d.npy a curate run "
                            "with plots wrote")
        if xy.shape[0] != n:
            raise UserError(f"--umap: expected {n} x 2 coordinates (B_umap2d.npy), found shape {xy.shape}: a "
                            "curate run over other records wrote it (a run with --no-plot leaves the last one's); "
                            "run curate_dataset.py without --no-plot to write it for these")
        self.inputs = inputs
        self.n = n
        self.colors = _rgb(cluster_colors(inputs.n_clusters))
        plt, fig = _figure(width, height)
        ax = fig.add_axes([0.03, 0.03, 0.94, 0.9])
        finite = np.isfinite(xy).all(1)
        lo, hi = cloud_frame(xy[finite], inputs.labels[finite]) if finite.any() else (np.zeros(2), np.ones(2))
        pad = np.maximum((hi - lo) * 0.05, 1e-9)
        ax.set_xlim(lo[0] - pad[0], hi[0] + pad[0])
        ax.set_ylim(lo[1] - pad[1], hi[1] + pad[1])
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{n:,} documents lit in cluster colour as the curated order places them (K = {inputs.n_clusters})",
                     fontsize=12)
        self.background = _render(fig)
        pix = ax.transData.transform(np.where(finite[:, None], xy, 0))
        plt.close(fig)
        top, bottom, left, right = _inner_box(ax, height)
        self.radius = 1 if n > 20000 else 2 if n > 2000 else 3
        r = self.radius
        cols = np.round(pix[:, 0]).astype(np.int64)
        rows = np.round(height - pix[:, 1]).astype(np.int64)
        inside = finite & (cols >= left + r) & (cols < right - r) & (rows >= top + r) & (rows < bottom - r)
        self.rows, self.cols, self.inside = rows, cols, inside
        self.canvas = self.background.copy()
        self._paint(np.flatnonzero(inside), np.asarray(UNPLACED_RGB, dtype=np.uint8))

    def _paint(self, docs: np.ndarray, colour: np.ndarray) -> None:
        docs = docs[self.inside[docs]]
        if not docs.size:
            return
        r = self.radius
        offsets = np.arange(-r + 1, r) if r > 1 else np.array([0])
        for dy in offsets:
            for dx in offsets:
                self.canvas[self.rows[docs] + dy, self.cols[docs] + dx] = colour

    def frames(self, n_frames: int):
        done = 0
        order, labels = self.inputs.order, self.inputs.labels
        for placed in placed_per_frame(self.n, n_frames):
            new = order[done:placed]
            done = placed
            if new.size:
                docs = new[self.inside[new]]
                self._paint(docs, self.colors[labels[docs]])
            yield self.canvas


def even(x: int) -> int:
    return max(2, int(x) // 2 * 2)


def write_video(path: Path, frames, n_frames: int, width: int, height: int, fps: int, ffmpeg: str,
                preset: str = "medium", preview: Path | None = None) -> int:
    """Encode ``frames`` to ``path``; the last frame also goes to ``preview`` (PNG)."""
    last = None
    with VideoWriter(path, width, height, fps, ffmpeg, preset) as writer:
        for frame in frames:
            writer.write(frame)
            last = frame
    if preview is not None and last is not None:
        save_png(preview, last)
    return writer.frames


# What each of ``output_names``' files is, in its order, for messages.
OUTPUT_ROLES = ("bar video", "bar video's preview", "UMAP video", "UMAP video's preview")


def output_names(output: Path) -> dict[str, Path]:
    stem = output.with_suffix("") if output.suffix.lower() == ".mp4" else output
    return {"bar": output if output.suffix else output.with_suffix(".mp4"),
            "bar_preview": Path(f"{stem}.png"),
            "umap": Path(f"{stem}_umap.mp4"),
            "umap_preview": Path(f"{stem}_umap.png")}
