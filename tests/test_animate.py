"""animate_ordering: real MP4s (frame count, size, first dimmed / last bright), saved labels and order, errors."""

import json
import logging

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image

import animate_ordering
from diversity_order import animate
from diversity_order.errors import UserError
from diversity_order.orderings import OrderingOptions, balanced_order, stratified_order


def read_video(path):
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    return meta, [np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in reader]


@pytest.fixture
def run_files(tmp_path):
    rng = np.random.default_rng(0)
    n, k = 400, 5
    labels = np.repeat(np.arange(k), n // k)  # grouped by cluster: the 'bad' input order
    counts = rng.integers(10, 400, n)
    order = stratified_order(labels, counts, k)
    np.save(tmp_path / "B_labels.npy", labels)
    np.save(tmp_path / "B_order.npy", order)
    np.save(tmp_path / "A_token_counts.npy", counts)
    np.save(tmp_path / "B_umap2d.npy", rng.normal(size=(n, 2)).astype(np.float32) + labels[:, None])
    np.save(tmp_path / "B_embeddings.npy", (np.eye(k)[labels] + 0.01 * rng.normal(size=(n, k))).astype(np.float32))
    (tmp_path / "B_meta.json").write_text(json.dumps({
        "n_clusters": k, "sequence_length": 2000, "labels_file": "elsewhere/B_labels.npy",
        "order_file": str(tmp_path / "B_order.npy")}))
    return tmp_path, labels, counts, order


def saturation(pixels):
    p = pixels.reshape(-1, 3).astype(np.float64)
    return float((p.max(1) - p.min(1)).mean())


def test_videos_from_a_curate_run(run_files, caplog):
    tmp, labels, counts, order = run_files
    out = tmp / "anim.mp4"
    caplog.set_level(logging.INFO)
    rc = animate_ordering.main(["--token-counts", str(tmp / "A_token_counts.npy"), "--meta", str(tmp / "B_meta.json"),
                                "--umap", str(tmp / "B_umap2d.npy"), "--n-frames", "12", "--fps", "10",
                                "--size", "480x270", "--umap-size", "320x320", "--preset", "ultrafast",
                                "--output", str(out)])
    assert rc == 0
    meta, frames = read_video(out)
    assert len(frames) == 12 and meta["size"] == (480, 270) and meta["fps"] == pytest.approx(10)
    assert f"Bar video: {out} (12 frames at 10 fps: 1.2 s long, 480x270; made in " in caplog.text  # not its length
    # The bar geometry as the renderer lays it out; decoded frames match the rendered ones closely.
    inputs = animate.load_inputs(tmp / "A_token_counts.npy", meta=tmp / "B_meta.json")
    assert np.array_equal(inputs.order, order) and inputs.seq_len == 2000  # the saved order, not a recomputed one
    bars = animate.BarFrames(inputs, 480, 270)
    top, bottom, left, right = bars.bar_box
    first, last = frames[0][top + 2:bottom - 2, left + 2:right - 2], frames[-1][top + 2:bottom - 2, left + 2:right - 2]
    rendered = list(bars.frames(12))
    assert np.abs(frames[-1].astype(int) - rendered[-1]).mean() < 4
    # First frame: 1/12 placed, the rest dimmed; last frame: every document placed, all bright.
    assert saturation(last) > 2 * saturation(first)
    bright_strip = rendered[-1][top, left:right]
    assert np.isin(bright_strip.view([("", np.uint8)] * 3).ravel(), bars.bright.view([("", np.uint8)] * 3).ravel()).all()
    assert not np.array_equal(frames[0], frames[-1])
    with Image.open(tmp / "anim.png") as preview:
        assert preview.size == (480, 270)
        assert np.array_equal(np.asarray(preview), rendered[-1])
    meta_u, frames_u = read_video(tmp / "anim_umap.mp4")
    assert len(frames_u) == 12 and meta_u["size"] == (320, 320)
    assert saturation(frames_u[-1]) > saturation(frames_u[0]) + 1
    assert (tmp / "anim_umap.png").is_file()


def test_reclusters_without_labels_and_curve_grows(run_files, caplog):
    tmp, labels, counts, _ = run_files
    inputs = animate.load_inputs(tmp / "A_token_counts.npy", embeddings=tmp / "B_embeddings.npy", n_clusters=5,
                                 seq_len=2000)
    assert "Re-clustering" in caplog.text and inputs.n_clusters == 5
    bars = animate.BarFrames(inputs, 480, 270)
    frames = list(bars.frames(6))
    top, bottom, left, right = bars.chart_box
    red = [int((f[top:bottom, left:right] == animate.CURVE_RGB).all(-1).sum()) for f in frames]
    assert red == sorted(red) and red[0] < red[-1]
    assert bars.complete_windows(inputs.labels.size) == bars.after.size
    # The legend sits above K, where no window's curve can reach (it once lay inside the chart, under the curve):
    # a finished curve swinging between 0 and K clusters at every window crosses none of it.
    bars.after[:] = np.where(np.arange(bars.after.size) % 2, inputs.n_clusters, 0)
    bars._curve_mask(bars.chart_ylim)
    l_top, l_bottom, l_left, l_right = bars.legend_box
    assert top <= l_top < l_bottom <= bottom
    assert not bars.curve[l_top - top - 1:l_bottom - top + 1, max(l_left - left, 0):l_right - left].any()


def test_recomputes_the_chosen_ordering(run_files):
    tmp, labels, counts, _ = run_files
    inputs = animate.load_inputs(tmp / "A_token_counts.npy", labels=tmp / "B_labels.npy", seq_len=2000,
                                 ordering="balanced", seed=7)
    assert inputs.order.tolist() == balanced_order(labels, counts, 5, OrderingOptions(seed=7, seq_len=2000)).tolist()
    assert "balanced order recomputed" in inputs.source
    with pytest.raises(UserError, match="--ordering saw: choose a cluster ordering"):
        animate.load_inputs(tmp / "A_token_counts.npy", labels=tmp / "B_labels.npy", ordering="saw")


def test_placed_per_frame():
    assert animate.placed_per_frame(10, 5).tolist() == [2, 4, 6, 8, 10]
    assert animate.placed_per_frame(3, 6)[-1] == 3


def test_errors(run_files, monkeypatch):
    tmp, *_ = run_files
    counts = tmp / "A_token_counts.npy"
    with pytest.raises(UserError, match="give --embeddings"):
        animate.load_inputs(counts)
    np.save(tmp / "short.npy", np.arange(5))
    with pytest.raises(UserError, match="labels, but there are 400"):
        animate.load_inputs(counts, labels=tmp / "short.npy")
    np.save(tmp / "dup.npy", np.zeros(400, dtype=np.int64))
    with pytest.raises(UserError, match="not a permutation"):
        animate.load_inputs(counts, labels=tmp / "B_labels.npy", order=tmp / "dup.npy")
    # Another corpus's token counts with as many documents: refused against the run's recorded total.
    meta = json.loads((tmp / "B_meta.json").read_text())
    total = int(np.load(counts).sum())
    (tmp / "totals_meta.json").write_text(json.dumps(meta | {"labels_file": str(tmp / "B_labels.npy"),
                                                             "total_tokens": total}))
    assert animate.load_inputs(counts, meta=tmp / "totals_meta.json").token_counts.sum() == total
    np.save(tmp / "other_counts.npy", np.load(counts) + 1)
    with pytest.raises(UserError, match="but the curate run of --meta .* counted"):
        animate.load_inputs(tmp / "other_counts.npy", meta=tmp / "totals_meta.json")
    # Without --token-counts: the file the metadata names (as written, else beside it), or a one-line error.
    with pytest.raises(UserError, match="--token-counts is required"):
        animate.load_inputs(None, meta=tmp / "totals_meta.json")
    for recorded in (str(counts), "/moved/away/A_token_counts.npy"):
        (tmp / "named_meta.json").write_text(json.dumps(meta | {"labels_file": str(tmp / "B_labels.npy"),
                                                                "token_counts_file": recorded}))
        assert np.array_equal(animate.load_inputs(None, meta=tmp / "named_meta.json").token_counts, np.load(counts))
    # The file the metadata names, rewritten by a later run: not "pass the token counts of that run's input" (the
    # very file refused), but what happened.
    (tmp / "stale_meta.json").write_text(json.dumps(meta | {"labels_file": str(tmp / "B_labels.npy"),
                                                            "token_counts_file": str(tmp / "other_counts.npy"),
                                                            "total_tokens": total}))
    with pytest.raises(UserError, match="a later run over changed records .* rewrote it; run curate_dataset.py again"):
        animate.load_inputs(None, meta=tmp / "stale_meta.json")
    # A damaged or hand-edited field: one line naming it (a reviewer's "abc" was a ValueError traceback).
    for key, value in (("sequence_length", "abc"), ("n_clusters", 3.5), ("total_tokens", True), ("labels_file", 7)):
        (tmp / "edited_meta.json").write_text(json.dumps(meta | {key: value}))
        with pytest.raises(UserError, match=rf"--meta .*edited_meta.json: its {key} is .*, not a .* \(edited or "):
            animate.load_inputs(counts, meta=tmp / "edited_meta.json")
    monkeypatch.setattr(animate.shutil, "which", lambda name: None)
    monkeypatch.setitem(__import__("sys").modules, "imageio_ffmpeg", None)
    with pytest.raises(UserError, match="no ffmpeg found"):
        animate.find_ffmpeg()


def test_output_name_and_umap_rows_are_checked_before_any_video(run_files, capsys):
    tmp, *_ = run_files
    base = ["--token-counts", str(tmp / "A_token_counts.npy"), "--meta", str(tmp / "B_meta.json"), "--n-frames", "2",
            "--size", "320x240", "--umap-size", "320x320", "--preset", "ultrafast"]
    rc = animate_ordering.run_main(animate_ordering.main, base + ["--output", str(tmp / "e.gif")])
    assert rc == 2 and "give a name ending in .mp4" in capsys.readouterr().err
    np.save(tmp / "short_umap.npy", np.zeros((7, 2), np.float32))
    rc = animate_ordering.run_main(animate_ordering.main, base + ["--umap", str(tmp / "short_umap.npy"),
                                                                  "--output", str(tmp / "u.mp4")])
    err = capsys.readouterr().err
    assert rc == 2 and "--umap: expected 400 x 2 coordinates" in err and "without --no-plot" in err
    assert not (tmp / "u.mp4").exists()  # refused before the bar video was encoded
    np.save(tmp / "embeddings_given.npy", np.zeros((400, 16), np.float32))  # a new user's: the embeddings
    rc = animate_ordering.run_main(animate_ordering.main, base + ["--umap", str(tmp / "embeddings_given.npy"),
                                                                  "--output", str(tmp / "u.mp4")])
    err = capsys.readouterr().err
    assert rc == 2 and "found shape (400, 16): not a 2-D projection" in err and "other records" not in err
    # As many rows, but of other records (the same ones reordered, then a run with --no-plot): the fingerprints beside
    # the projection and beside the token counts differ. Before, each point was drawn in another record's colour.
    fingerprints = np.arange(400, dtype=np.uint64)
    np.save(tmp / "A_token_counts.fingerprints.npy", fingerprints)
    np.save(tmp / "B_umap2d.fingerprints.npy", fingerprints[::-1].copy())
    rc = animate_ordering.run_main(animate_ordering.main, base + ["--umap", str(tmp / "B_umap2d.npy"),
                                                                  "--output", str(tmp / "u.mp4")])
    err = capsys.readouterr().err
    assert rc == 2 and "a projection of other records (400 of its 400 rows are not those of A_token_counts.npy" in err
    assert not (tmp / "u.mp4").exists()
    (tmp / "a_file").write_text("")
    rc = animate_ordering.run_main(animate_ordering.main, base + ["--output", str(tmp / "a_file" / "v.mp4")])
    assert rc == 2 and "--output: cannot write in" in capsys.readouterr().err
    rc = animate_ordering.run_main(animate_ordering.main, base + ["--fps", "0", "--output", str(tmp / "f.mp4")])
    assert rc == 2 and capsys.readouterr().err.startswith("error: --fps 0: must be at least 1")


def test_folders_where_files_are_read_or_written_are_one_line(run_files, capsys):
    """--meta given a folder, an output video (or its preview) that is a folder, a packed export's JSON as --meta:
    tracebacks (the output ones after the videos were encoded) or a line about --token-counts. Now one line each,
    before any video; a folder given to --labels suggests the run's labels file, not its embeddings."""
    tmp, *_ = run_files
    base = ["--token-counts", str(tmp / "A_token_counts.npy"), "--n-frames", "2", "--size", "320x240",
            "--preset", "ultrafast"]

    def error(*argv):
        assert animate_ordering.run_main(animate_ordering.main, [*base, *map(str, argv)]) == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    assert error("--meta", tmp, "--output", tmp / "v.mp4") == (
        f"error: --meta {tmp}: is a folder; give a curate run's metadata file (e.g. {tmp / 'B_meta.json'})")
    (tmp / "packed.json").write_text(json.dumps({"seq_len": 2000, "sequences": 3}))
    assert error("--meta", tmp / "packed.json", "--output", tmp / "v.mp4").startswith(
        f"error: --meta {tmp / 'packed.json'}: not a curate run's metadata")
    (tmp / "w.png").mkdir()
    assert error("--meta", tmp / "B_meta.json", "--output", tmp / "w.mp4") == (
        f"error: --output {tmp / 'w.mp4'}: {tmp / 'w.png'} is a folder, where this run writes its bar video's "
        "preview; move it or choose another --output")
    assert not (tmp / "w.mp4").exists()
    assert error("--labels", tmp, "--order", tmp / "B_order.npy", "--output", tmp / "v.mp4") == (
        f"error: --labels {tmp}: is a folder; give the .npy file (e.g. {tmp / 'B_labels.npy'})")


def test_flags_a_video_would_take_otherwise_are_said(run_files, capsys, caplog):
    """A reviewer's --size 641x480 became 640x480 without a word, --seq-len over the run's was not said, a bad
    --preset was ffmpeg's own error after the frames were drawn, and a metadata file whose
    special_tokens_per_document was edited to -5 was blamed on the token counts."""
    tmp, *_ = run_files
    base = ["--token-counts", str(tmp / "A_token_counts.npy"), "--meta", str(tmp / "B_meta.json"), "--n-frames", "2",
            "--umap-size", "320x320", "--preset", "ultrafast"]
    with caplog.at_level(logging.INFO):
        assert animate_ordering.main(base + ["--size", "641x481", "--seq-len", "1000", "--output",
                                             str(tmp / "odd.mp4")]) == 0
    assert "--size 641x481: 640x480, as H.264 needs even sizes" in caplog.text
    assert read_video(tmp / "odd.mp4")[0]["size"] == (640, 480)
    assert (f"--seq-len 1000: the windows shown are of 1000 tokens, not the 2000 of the curate run of --meta "
            f"{tmp / 'B_meta.json'}") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert animate_ordering.main(base + ["--size", "320x240", "--seq-len", "2000", "--output",
                                             str(tmp / "same.mp4")]) == 0
    assert "the windows shown are of" not in caplog.text and "even sizes" not in caplog.text
    with pytest.raises(SystemExit) as stopped:
        animate_ordering.main(base + ["--preset", "quick", "--output", str(tmp / "p.mp4")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--preset" in err and "'quick'" in err and "ultrafast" in err and "Traceback" not in err
    assert not (tmp / "p.mp4").exists()
    meta = json.loads((tmp / "B_meta.json").read_text())
    for key, value in (("special_tokens_per_document", -5), ("sequence_length", 0), ("n_clusters", 0)):
        (tmp / "edited_meta.json").write_text(json.dumps(meta | {key: value}))
        with pytest.raises(UserError, match=rf"its {key} is {value}, not a whole number of at least \d \(edited or "):
            animate.load_inputs(tmp / "A_token_counts.npy", meta=tmp / "edited_meta.json")


def test_the_chart_leaves_off_a_k_no_window_comes_near(run_files):
    """Labels 0, 1000, 2000 (a reviewer's) or K = 1,000 at a short length: windows hold a few clusters against a K
    of 2,001, and a chart up to K drew them as a flat line at its foot. Its top is the most any window holds then,
    and K where windows come within two thirds of it."""
    tmp, labels, counts, order = run_files
    assert animate.chart_top(30, 29) == 30 and animate.chart_top(30, 20) == 30 and animate.chart_top(30, 19) == 19
    np.save(tmp / "sparse.npy", labels * 1000)
    inputs = animate.load_inputs(tmp / "A_token_counts.npy", labels=tmp / "sparse.npy", order=tmp / "B_order.npy",
                                 seq_len=2000)
    assert inputs.n_clusters == 4001
    bars = animate.BarFrames(inputs, 480, 270)
    most = max(bars.before.max(), bars.after.max())
    assert bars.chart_ylim[1] == pytest.approx(most * 1.2 + 1)
    dense = animate.BarFrames(animate.load_inputs(tmp / "A_token_counts.npy", labels=tmp / "B_labels.npy",
                                                  order=tmp / "B_order.npy", seq_len=2000), 480, 270)
    assert dense.chart_ylim[1] == pytest.approx(5 * 1.2 + 1)
    # The curve of the sparse ids fills the chart as the dense ids' does: the same rows, not squeezed to the foot.
    assert bars.curve.any(axis=1).sum() == pytest.approx(dense.curve.any(axis=1).sum(), abs=2)


def test_files_of_other_records_or_rewritten_since_the_run_are_said(run_files, caplog):
    """A reviewer's second run over the same records reordered rewrote the token counts file the first run's
    metadata names, with as many tokens: the first run's video drew every document with another one's count
    (mean diversity 15.18 -> 24.72 where that run had 14.88 -> 24.81). The run records digests of its records,
    labels and order; the files read are checked against them."""
    from diversity_order import caches

    tmp, labels, counts, order = run_files
    fingerprints = np.random.default_rng(1).integers(0, 2**63, counts.size).astype(np.uint64)
    np.save(caches.sidecar_paths(tmp / "A_token_counts.npy")[0], fingerprints)
    meta = json.loads((tmp / "B_meta.json").read_text()) | {
        "labels_file": str(tmp / "B_labels.npy"), "token_counts_file": str(tmp / "A_token_counts.npy"),
        "total_tokens": int(counts.sum()),
        "digests": {"records": caches.records_digest(fingerprints), "labels": caches.ids_digest(labels),
                    "order": caches.ids_digest(order)}}
    (tmp / "d_meta.json").write_text(json.dumps(meta))
    inputs = animate.load_inputs(None, meta=tmp / "d_meta.json")  # as the run wrote them: taken
    assert np.array_equal(inputs.token_counts, counts) and np.array_equal(inputs.order, order)
    # the same records reordered by a later run: the same total, other fingerprints
    swap = np.random.default_rng(2).permutation(counts.size)
    np.save(tmp / "A_token_counts.npy", counts[swap])
    np.save(caches.sidecar_paths(tmp / "A_token_counts.npy")[0], fingerprints[swap])
    with pytest.raises(UserError, match="its token counts file .* is of other records now .* a later run over "
                                        "changed records rewrote it"):
        animate.load_inputs(None, meta=tmp / "d_meta.json")
    with pytest.raises(UserError, match="--token-counts .*: the counts of other records than those the curate run"):
        animate.load_inputs(tmp / "A_token_counts.npy", meta=tmp / "d_meta.json")
    np.save(tmp / "A_token_counts.npy", counts)
    np.save(caches.sidecar_paths(tmp / "A_token_counts.npy")[0], fingerprints)
    # labels or order the metadata names, written over by another run: refused; given on purpose: shown, said
    np.save(tmp / "B_order.npy", order[::-1])
    with pytest.raises(UserError, match="its order file .* is not the one that run wrote"):
        animate.load_inputs(None, meta=tmp / "d_meta.json")
    np.save(tmp / "B_order.npy", order)
    np.save(tmp / "other_labels.npy", labels[::-1])
    with caplog.at_level(logging.WARNING):
        inputs = animate.load_inputs(None, meta=tmp / "d_meta.json", labels=tmp / "other_labels.npy")
    assert np.array_equal(inputs.labels, labels[::-1])
    assert "--labels " in caplog.text and "not the labels the curate run of --meta" in caplog.text


def test_flags_the_saved_run_overrides_are_said_and_bad_ones_refused(run_files, capsys, caplog):
    """A reviewer's --ordering balanced and --n-clusters 50 beside a run's order and labels were taken without a
    word (the video drew the run's order, titled K = 50), --n-clusters 1000000000 was a MemoryError traceback,
    --seed -1 an sklearn traceback, and --output given a folder wrote anim.mp4 beside it."""
    from diversity_order.cli import run_main

    tmp, labels, *_ = run_files
    base = ["--token-counts", str(tmp / "A_token_counts.npy"), "--meta", str(tmp / "B_meta.json"), "--n-frames", "2",
            "--size", "320x240", "--preset", "ultrafast"]
    for extra in (["--n-clusters", "1000000000"], ["--n-clusters", "-4"], ["--ordering", "balanced"]):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert animate_ordering.main(base + extra + ["--output", str(tmp / "o.mp4")]) == 0
        flag, value = extra
        assert f"{flag} {value} not used: " in caplog.text
    inputs = animate.load_inputs(tmp / "A_token_counts.npy", meta=tmp / "B_meta.json", n_clusters=50)
    assert inputs.n_clusters == int(labels.max()) + 1
    for value in ("-1", str(2**32)):
        assert run_main(animate_ordering.main, base + ["--seed", value, "--output", str(tmp / "s.mp4")]) == 2
        assert capsys.readouterr().err.startswith(f"error: --seed {value}: must be within 0..4,294,967,295")
    import compare_clusterings

    np.save(tmp / "e.npy", np.eye(20, dtype=np.float32))
    assert run_main(compare_clusterings.main, ["--shallow", str(tmp / "e.npy"), "--deep", str(tmp / "e.npy"),
                                               "--seed", "-1"]) == 2
    assert capsys.readouterr().err.startswith("error: --seed -1: must be within 0..4,294,967,295")
    (tmp / "anim").mkdir()
    assert run_main(animate_ordering.main, base + ["--output", str(tmp / "anim")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --output {tmp / 'anim'}: is a folder; give the video's path")
    assert not (tmp / "anim.mp4").exists()
