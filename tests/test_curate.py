"""The whole curate pipeline on the tiny model: outputs, faithfulness, incremental caches, errors."""

import contextlib
import errno
import json
import logging
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import curate_dataset
from conftest import topical_records, write_jsonl
from diversity_order import embed
from diversity_order.cli import run_main
from diversity_order.diversity import summarize_windows, window_diversity
from diversity_order.orderings import OrderingOptions, stratified_order
from reference_impl import ref_stratified_order, ref_summary, ref_window_diversity


def curate(*args):
    return run_main(curate_dataset.main, [str(a) for a in args] + ["--no-progress"])


@pytest.fixture()
def embed_spy(monkeypatch):
    """Records which rows each tokenization pass was asked for."""
    calls = []
    real = embed.embed_and_count

    def spy(index, rows, tokenizer, table, **kwargs):
        calls.append((sorted(np.asarray(rows).tolist()), table is not None))
        return real(index, rows, tokenizer, table, **kwargs)

    monkeypatch.setattr(embed, "embed_and_count", spy)
    return calls


def test_curate_end_to_end(tmp_path, tiny_model_dir, topical_jsonl, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "out" / "data_curated.jsonl"
    assert curate("--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir,
                  "--n-clusters", 6, "--seq-len", 1000, "--no-plot") == 0
    # Every record exactly once, byte for byte, newline-terminated.
    in_lines = topical_jsonl.read_bytes().splitlines()
    out_bytes = out.read_bytes()
    assert out_bytes.endswith(b"\n")
    assert sorted(out_bytes.splitlines()) == sorted(in_lines)
    meta = json.loads((tmp_path / "out" / "data_curated_meta.json").read_text())
    for key in ["input", "output", "input_count", "final_count", "n_clusters", "ordering", "sequence_length",
                "total_tokens", "n_training_sequences", "embedding_method", "load_embeddings_path", "pca",
                "token_window_diversity", "similarity_stats", "cluster_sizes"]:
        assert key in meta, key
    assert meta["ordering"] == "stratified_greedy"
    assert meta["embedding_method"] == "base_model_embed_tokens_mean_pool"
    assert meta["input_count"] == meta["final_count"] == 240
    sizes = list(meta["cluster_sizes"].values())
    assert sizes == sorted(sizes, reverse=True) and sum(sizes) == 240
    # Saved labels/order are the ones the output was written with, and match the plain loops.
    labels = np.load(tmp_path / "out" / "data_curated_labels.npy")
    order = np.load(tmp_path / "out" / "data_curated_order.npy")
    counts = np.load(tmp_path / "data_token_counts.npy")
    assert out_bytes.splitlines() == [in_lines[i] for i in order]
    assert order.tolist() == ref_stratified_order(labels.tolist(), counts.tolist(), 6)
    curated = ref_summary(ref_window_diversity(labels[order].tolist(), counts[order].tolist(), 1000))
    original = ref_summary(ref_window_diversity(labels.tolist(), counts.tolist(), 1000))
    assert meta["token_window_diversity"] == {"original": original, "curated": curated}
    assert curated["mean"] > original["mean"] * 2  # topic-grouped input: the reorder must clearly help
    assert "input order mean" in caplog.text and "curated mean" in caplog.text
    # The gain is that of the unrounded means (the summaries round them to 2 decimals).
    plain = ref_window_diversity(labels[order].tolist(), counts[order].tolist(), 1000)
    before = ref_window_diversity(labels.tolist(), counts.tolist(), 1000)
    gain = (sum(plain) / len(plain)) / (sum(before) / len(before)) * 100 - 100
    assert f"windows): {gain:+.0f}%" in caplog.text
    # Caches are plain .npy in input order.
    emb = np.load(tmp_path / "out" / "data_curated_embeddings.npy")
    assert emb.shape == (240, 32) and emb.dtype == np.float32


@pytest.mark.parametrize("sort", ["original", "length-asc", "length-desc", "length-riffle"])
def test_within_cluster_sort_reaches_the_output(tmp_path, tiny_model_dir, topical_jsonl, sort):
    out = tmp_path / "o.jsonl"
    assert curate("--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                  "--within-cluster-sort", sort, "--no-plot", "--seq-len", 500) == 0
    labels, order = np.load(tmp_path / "o_labels.npy"), np.load(tmp_path / "o_order.npy")
    counts = np.load(tmp_path / "data_token_counts.npy")
    assert order.tolist() == ref_stratified_order(labels.tolist(), counts.tolist(), 5, sort)


def test_incremental_runs_recompute_only_what_changed(tmp_path, tiny_model_dir, embed_spy, caplog):
    caplog.set_level(logging.INFO)
    records = topical_records(per_topic=10)
    src = write_jsonl(tmp_path / "d.jsonl", records)
    out = tmp_path / "d_cur.jsonl"
    args = ["--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 4, "--no-plot"]
    assert curate(*args) == 0
    assert embed_spy == [(list(range(60)), True)]
    first = np.load(tmp_path / "d_cur_embeddings.npy")

    # Append 3 records: only those are tokenized and embedded.
    extra = topical_records(per_topic=1, seed=5)[:3]
    write_jsonl(src, records + extra)
    embed_spy.clear()
    assert curate(*args) == 0
    assert embed_spy == [([60, 61, 62], True)]
    assert "Embedding 3 record(s) of 63" in caplog.text
    second = np.load(tmp_path / "d_cur_embeddings.npy")
    np.testing.assert_array_equal(second[:60], first)

    # Edit one record, remove another, reorder the rest: only the edited one is recomputed.
    edited = list(reversed(records[1:] + extra))
    edited[5] = dict(edited[5], text=edited[5]["text"] + " supernova")
    write_jsonl(src, edited)
    embed_spy.clear()
    assert curate(*args) == 0
    assert embed_spy == [([5], True)]
    third = np.load(tmp_path / "d_cur_embeddings.npy")
    assert third.shape[0] == 62
    # The reused rows are the same vectors, moved to their records' new positions.
    moved = list(reversed(list(range(1, 63))))
    for new_pos, old_pos in enumerate(moved):
        if new_pos != 5:
            np.testing.assert_array_equal(third[new_pos], second[old_pos])

    # Another text field: everything is recomputed (and a clear message says why).
    write_jsonl(src, [dict(r, body=r["text"]) for r in edited])
    embed_spy.clear()
    assert curate(*args, "--text-field", "body") == 0
    assert embed_spy == [(list(range(62)), True)]
    assert "different text_field" in caplog.text


def test_another_model_invalidates_the_caches(tmp_path, tiny_model_dir, embed_spy, caplog):
    import shutil

    from safetensors.torch import load_file, save_file

    caplog.set_level(logging.INFO)
    src = write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=5))
    out = tmp_path / "d_cur.jsonl"
    assert curate("--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 3, "--no-plot") == 0
    other = tmp_path / "other_model"
    shutil.copytree(tiny_model_dir, other)
    weights = load_file(other / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * 2 + 1
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    embed_spy.clear()
    assert curate("--input", src, "--output", out, "--model-dir", other, "--n-clusters", 3, "--no-plot") == 0
    assert embed_spy == [(list(range(30)), True)]
    assert "different table" in caplog.text


def test_load_embeddings_without_model_dir_uses_cached_counts(tmp_path, tiny_model_dir, topical_jsonl):
    out = tmp_path / "a.jsonl"
    assert curate("--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--no-plot") == 0
    rng = np.random.default_rng(0)
    deep = rng.normal(size=(240, 64)).astype(np.float32)
    deep[7] = np.nan  # a document skipped by deep extraction
    np.save(tmp_path / "deep.npy", deep)
    out2 = tmp_path / "b.jsonl"
    assert curate("--input", topical_jsonl, "--output", out2, "--load-embeddings", tmp_path / "deep.npy",
                  "--pca-components", 16, "--n-clusters", 6, "--no-plot") == 0
    meta = json.loads((tmp_path / "b_meta.json").read_text())
    assert meta["embedding_method"] == "external_precomputed"
    assert meta["pca"]["n_components"] == 16 and meta["pca"]["original_dim"] == 64
    assert sorted(out2.read_bytes().splitlines()) == sorted(topical_jsonl.read_bytes().splitlines())


def test_load_embeddings_in_another_order_than_the_input_is_refused(tmp_path, tiny_model_dir, topical_jsonl, capsys,
                                                                     caplog):
    """The fingerprints written beside an embeddings file say which text each row was made from."""
    out = tmp_path / "a.jsonl"
    assert curate("--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--no-plot", "--stats-only") == 0
    vectors = tmp_path / "a_embeddings.npy"
    assert (tmp_path / "a_embeddings.fingerprints.npy").is_file()
    lines = topical_jsonl.read_bytes().splitlines(keepends=True)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_bytes(b"".join(lines[i] for i in np.random.default_rng(1).permutation(len(lines))))
    err = run_error(capsys, "--input", shuffled, "--output", tmp_path / "s.jsonl", "--load-embeddings", vectors,
                    "--model-dir", tiny_model_dir, "--n-clusters", 6, "--no-plot")
    assert f"--load-embeddings {vectors}: the rows are not in the order of the input's records (record " in err
    # The input it was made from: used; one record edited since: a warning, its row used as it is.
    assert curate("--input", topical_jsonl, "--output", tmp_path / "b.jsonl", "--load-embeddings", vectors,
                  "--model-dir", tiny_model_dir, "--n-clusters", 6, "--no-plot") == 0
    edited = tmp_path / "edited.jsonl"
    record = json.loads(lines[3])
    record["text"] += " and more"
    edited.write_bytes(b"".join(lines[:3]) + (json.dumps(record) + "\n").encode() + b"".join(lines[4:]))
    with caplog.at_level(logging.WARNING, logger="diversity_order"):
        assert curate("--input", edited, "--output", tmp_path / "e.jsonl", "--load-embeddings", vectors,
                      "--model-dir", tiny_model_dir, "--n-clusters", 6, "--no-plot") == 0
    assert "1 of the input's records differ from the texts the rows were made from" in caplog.text


def test_load_embeddings_without_counts_or_model_says_what_is_missing(tmp_path, topical_jsonl, capsys):
    np.save(tmp_path / "deep.npy", np.ones((240, 8), np.float32))
    code = curate("--input", topical_jsonl, "--output", tmp_path / "b.jsonl", "--load-embeddings",
                  tmp_path / "deep.npy", "--no-plot")
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "--model-dir is required to count tokens: 240 of 240 records have no cached count" in err


def test_stats_only_writes_everything_but_the_curated_file(tmp_path, tiny_model_dir, topical_jsonl):
    out = tmp_path / "s.jsonl"
    assert curate("--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--stats-only", "--no-plot") == 0
    assert not out.exists()
    assert (tmp_path / "s_meta.json").exists() and (tmp_path / "s_order.npy").exists()


def test_a_recommended_k_at_the_edge_of_the_sweep_is_said_to_be_no_peak():
    """A new user's silhouettes fell from k = 5 to k = 100 and the command said 'use --n-clusters 5': a k at the
    edge of the sweep is no peak, and the recommendation now says so."""
    from diversity_order.clustering import CalibrationRow, recommend_k
    from diversity_order.curate import calibration_report

    def rows(scores):
        return [CalibrationRow(k, score, 1, 2.0, 3) for k, score in zip((5, 10, 15, 20), scores)]

    falling, rising, peaked = rows([0.14, 0.10, 0.07, 0.04]), rows([0.02, 0.05, 0.08, 0.11]), rows([0.05, 0.12, 0.06, 0.04])
    said = ("No k stands out: 5, the smallest k tried, scores highest and every larger k more than 5% below it, so "
            "no k separates")
    assert recommend_k(falling) == 5 and calibration_report(falling, 5).splitlines()[-1].startswith(said)
    assert "Recommended" not in calibration_report(falling, 5)  # not a recommendation and its retraction
    # On 20 documents the default k is refused: not advised (a reviewer's was)
    assert "set --n-clusters below the 20 documents (the default, 30, needs more)" in calibration_report(falling, 5, 20)
    assert "keep --n-clusters 30 (the default)" in calibration_report(falling, 5, 31)
    dipped = rows([0.33, 0.3044, 0.3094, 0.3122])  # a later user's: falling, then rising again, never near 5's
    assert recommend_k(dipped) == 5 and said in calibration_report(dipped, 5)
    assert recommend_k(rising) == 20 and "20 is the largest k tried" in calibration_report(rising, 20)
    assert recommend_k(peaked) == 10 and calibration_report(peaked, 10).splitlines()[-1] == (
        "Recommended k = 10 (the highest k whose silhouette is within 5% of the peak); use --n-clusters 10")
    # Empty clusters at a large k (a reviewer's k = 100 showed a size 0 and nothing was said): said, naming the k.
    with_empty = peaked[:3] + [CalibrationRow(20, 0.04, 0, 2.0, 3)]
    assert calibration_report(with_empty, 10).splitlines()[-2:] == [
        "At k = 20 some clusters are empty: k-means found fewer groups than that in these embeddings, so such a k "
        "only names clusters that no document is in",
        "Recommended k = 10 (the highest k whose silhouette is within 5% of the peak); use --n-clusters 10"]
    # A k with empty clusters is not recommended, even scoring highest (a reviewer's 30 documents: "At k = 15, 20, 25
    # some clusters are empty", then "Recommended k = 15").
    degenerate = [CalibrationRow(5, 0.10, 2, 6.0, 9), CalibrationRow(10, 0.096, 1, 3.0, 5),
                  CalibrationRow(15, 0.12, 0, 2.0, 4), CalibrationRow(20, 0.13, 0, 1.0, 4)]
    assert recommend_k(degenerate) == 10
    none_full = [CalibrationRow(5, 0.1, 0, 1.0, 2), CalibrationRow(10, 0.2, 0, 1.0, 2)]
    assert recommend_k(none_full) == 10
    assert calibration_report(none_full, 10, 30).splitlines()[-1] == (  # not "keep the default" (a reviewer's)
        "No k tried fills all its clusters: these embeddings hold fewer distinct groups than 5 (few distinct "
        "documents?); set --n-clusters below that")


def test_calibrate_k_prints_table_and_exits(tmp_path, tiny_model_dir, caplog, capsys):
    """The table is the command's result: printed to standard output; the log (standard error) has each k as it
    is scored and the recommendation."""
    caplog.set_level(logging.INFO)
    src = write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=4))  # 24 docs: k in 5..20
    out = tmp_path / "c.jsonl"
    assert curate("--input", src, "--output", out, "--model-dir", tiny_model_dir, "--calibrate-k",
                  "--calibrate-k-samples", 0) == 0
    assert not out.exists()
    table = json.loads((tmp_path / "c_calibration.json").read_text())
    assert [r["k"] for r in table["rows"]] == [5, 10, 15, 20]
    assert table["recommended_k"] in (5, 10, 15, 20)
    verdict = ("No k stands out: " if table["recommended_k"] == 5 else f"Recommended k = {table['recommended_k']} ")
    assert verdict in caplog.text and table["advice"].startswith(verdict)
    printed = capsys.readouterr().out.splitlines()
    empty = any(row["size_min"] == 0 for row in table["rows"])  # said on a line of its own
    assert printed[0].split()[:2] == ["k", "silhouette"] and len(printed) == 2 + len(table["rows"]) + empty
    for line, row in zip(printed[1:], table["rows"]):
        assert line.split()[:2] == [str(row["k"]), f"{row['silhouette']:.4f}"]
        assert line.split()[2:] == [str(row["size_min"]), "/", f"{row['size_median']:g}", "/", str(row["size_max"])]
    assert printed[-1].startswith(verdict)
    assert "cluster size min/median/max" not in caplog.text  # (the log has each k as it is scored, for progress)
    assert "not used with --calibrate-k" not in caplog.text
    # Flags only curating reads are said to be unused, by name (the calibration runs as before).
    caplog.clear()
    assert curate("--input", src, "--output", out, "--model-dir", tiny_model_dir, "--calibrate-k",
                  "--calibrate-k-samples", 0, "--ordering", "paced", "--compare-strategies", "--seq-len", 512) == 0
    said = [r.getMessage() for r in caplog.records if "not used with --calibrate-k" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("--seq-len, --ordering, --compare-strategies are not used")
    assert json.loads((tmp_path / "c_calibration.json").read_text())["rows"] == table["rows"]


def run_error(capsys, *args):
    code = curate(*args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and "Traceback" not in err
    return err


def test_user_errors_are_one_line(tmp_path, tiny_model_dir, topical_jsonl, capsys):
    out = tmp_path / "o.jsonl"
    base = ["--input", topical_jsonl, "--output", out, "--no-plot"]
    assert "--model-dir is required to embed" in run_error(capsys, *base)
    assert "--model-dir " in run_error(capsys, *base, "--model-dir", tmp_path / "missing")
    empty_model = tmp_path / "empty_model"
    empty_model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (empty_model / name).write_bytes((tiny_model_dir / name).read_bytes())
    assert str(empty_model) in run_error(capsys, *base, "--model-dir", empty_model)
    assert "larger than the number of records (240)" in run_error(capsys, *base, "--model-dir", tiny_model_dir,
                                                                   "--n-clusters", 241)
    assert "is the input file" in run_error(capsys, "--input", topical_jsonl, "--output", topical_jsonl,
                                            "--model-dir", tiny_model_dir)
    np.save(tmp_path / "rows.npy", np.ones((239, 8), np.float32))
    assert "239 rows, but the input has 240 records" in run_error(
        capsys, *base, "--load-embeddings", tmp_path / "rows.npy", "--model-dir", tiny_model_dir)
    np.save(tmp_path / "flat.npy", np.ones(240, np.float32))
    assert "expected a 2-D N x D matrix" in run_error(
        capsys, *base, "--load-embeddings", tmp_path / "flat.npy", "--model-dir", tiny_model_dir)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": "b"\n')
    assert f"{bad}:2: not valid JSON" in run_error(capsys, "--input", bad, "--output", out,
                                                   "--model-dir", tiny_model_dir)
    assert "--seq-len 0" in run_error(capsys, *base, "--model-dir", tiny_model_dir, "--seq-len", 0)
    # a fit sample smaller than k was sklearn's traceback (n_samples=3 should be >= n_clusters=5)
    assert run_error(capsys, *base, "--model-dir", tiny_model_dir, "--n-clusters", 5, "--cluster-fit-sample", 3) == (
        "error: --cluster-fit-sample 3: fewer rows than --n-clusters 5 centres to fit; give at least 5 (0: all rows)")


def test_single_document_and_single_cluster(tmp_path, tiny_model_dir):
    src = write_jsonl(tmp_path / "one.jsonl", [{"text": "galaxy"}], trailing_newline=False)
    out = tmp_path / "one_cur.jsonl"
    assert curate("--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 1) == 0
    assert out.read_bytes() == src.read_bytes() + b"\n"
    meta = json.loads((tmp_path / "one_cur_meta.json").read_text())
    assert meta["token_window_diversity"]["curated"]["mean"] == 1.0
    assert meta["similarity_stats"]["n_pairs"] == 0


def test_order_is_stratified_order_of_saved_arrays(tmp_path, tiny_model_dir):
    records = topical_records(per_topic=15, long_every=5)  # some documents longer than --seq-len
    src = write_jsonl(tmp_path / "d.jsonl", records + [{"text": ""}])  # and an empty one
    out = tmp_path / "x.jsonl"
    assert curate("--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--seq-len", 300, "--no-plot") == 0
    labels, order = np.load(tmp_path / "x_labels.npy"), np.load(tmp_path / "x_order.npy")
    counts = np.load(tmp_path / "d_token_counts.npy")
    assert counts[-1] == 0 and counts.max() > 300
    assert np.array_equal(order, stratified_order(labels, counts, 6, OrderingOptions()))
    meta = json.loads((tmp_path / "x_meta.json").read_text())
    assert meta["empty_documents"] == 1
    assert meta["token_window_diversity"]["curated"] == summarize_windows(window_diversity(labels, counts, 300, order))


def test_a_rerun_from_the_caches_still_warns_of_documents_without_tokens(tmp_path, tiny_model_dir, embed_spy, caplog):
    src = write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=5) + [{"text": ""}])
    common = ["--input", src, "--model-dir", tiny_model_dir, "--n-clusters", 3, "--no-plot", "--output",
              tmp_path / "x.jsonl"]
    assert curate(*common) == 0
    assert "1 document(s) have no tokens (lines 31): their embedding" in caplog.text
    caplog.clear()
    embed_spy.clear()
    assert curate(*common) == 0
    assert embed_spy == []  # nothing tokenized: the count came from the cache
    assert "1 document(s) have no tokens (lines 31; token counts from the cache): their embedding" in caplog.text
    with open(src, "a") as handle:  # a new record: only it is tokenized, the empty one is still said once
        handle.write(json.dumps({"text": "orbit comet galaxy"}) + "\n")
    caplog.clear()
    assert curate(*common) == 0
    assert caplog.text.count("have no tokens") == 1 and "lines 31; token counts from the cache" in caplog.text


def test_gzip_input_gives_the_same_curated_records(tmp_path, tiny_model_dir, topical_jsonl, caplog):
    import gzip

    packed = tmp_path / "packed" / "data.jsonl.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(topical_jsonl.read_bytes()))
    common = ["--model-dir", tiny_model_dir, "--n-clusters", 6, "--no-plot"]
    assert curate("--input", topical_jsonl, "--output", tmp_path / "plain_cur.jsonl", *common) == 0
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        assert curate("--input", packed, "--output", tmp_path / "packed" / "cur.jsonl.gz", *common) == 0
    on_disk, records = (tmp_path / "packed" / "cur.jsonl.gz").stat().st_size, topical_jsonl.stat().st_size
    assert on_disk < records / 2  # the log says the file's size, and the records' beside it
    assert f"({on_disk / 1e6:.1f} MB on disk, {records / 1e6:.1f} MB uncompressed, jsonl)" in caplog.text
    assert (tmp_path / "packed" / "data_token_counts.npy").exists()
    assert (tmp_path / "packed" / "cur_meta.json").exists()
    assert gzip.decompress((tmp_path / "packed" / "cur.jsonl.gz").read_bytes()) == (tmp_path / "plain_cur.jsonl").read_bytes()


# ---- caches: dtype/shape checked, rewritten in input order, found by content, failed writes ------


@pytest.fixture()
def own_registry(tmp_path_factory, monkeypatch):
    """A cache registry of this test's own (the code reads the variable at each call)."""
    folder = tmp_path_factory.mktemp("registry")
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(params=["chattr", "simulated"])
def refuse_writes(request, monkeypatch):
    """``refuse_writes(path)``: a context in which no file can be written at ``path`` (a file) or in it
    (a folder): ``chattr +i`` (needs root and a file system that has it), or EPERM from the writer."""

    @contextlib.contextmanager
    def chattr(path):
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
        if done.returncode:
            pytest.skip(f"chattr +i not possible here: {done.stderr.decode().strip()}")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)

    @contextlib.contextmanager
    def simulated(path):
        from diversity_order import atomic

        real = atomic.atomic_open

        def refusing(target, mode="wb"):
            if Path(target) == path or Path(target).parent == path:
                raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(target))
            return real(target, mode)

        with monkeypatch.context() as patch:
            patch.setattr(atomic, "atomic_open", refusing)
            yield

    return chattr if request.param == "chattr" else simulated


def test_caches_of_another_dtype_or_width_are_recomputed(tmp_path, tiny_model_dir, embed_spy, own_registry):
    from diversity_order import caches

    src = write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=5))
    args = ["--input", src, "--output", tmp_path / "d_cur.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 3,
            "--no-plot"]
    assert curate(*args) == 0
    emb_path, count_path = tmp_path / "d_cur_embeddings.npy", tmp_path / "d_token_counts.npy"
    good_emb, good_counts = np.load(emb_path), np.load(count_path)
    fps = np.load(tmp_path / "d_cur_embeddings.fingerprints.npy")
    emb_key = json.loads((tmp_path / "d_cur_embeddings.cache.json").read_text())["key"]
    count_key = json.loads((tmp_path / "d_token_counts.cache.json").read_text())["key"]
    # Right key, right fingerprints, wrong arrays: int64 zeros and N x 10 floats as embeddings,
    # token counts as floats and as a column.
    for bad_emb, bad_counts in [(np.zeros((30, 32), np.int64), good_counts.astype(np.float64)),
                                (np.ones((30, 10), np.float32), good_counts[:, None])]:
        caches.store(emb_path, emb_key, fps, bad_emb)
        caches.store(count_path, count_key, fps, bad_counts)
        embed_spy.clear()
        assert curate(*args) == 0
        assert embed_spy == [(list(range(30)), True)]  # both recomputed, in the one pass
        np.testing.assert_array_equal(np.load(emb_path), good_emb)
        np.testing.assert_array_equal(np.load(count_path), good_counts)


def test_caches_follow_the_input_after_records_are_swapped_or_deleted(tmp_path, tiny_model_dir, embed_spy,
                                                                     own_registry):
    from diversity_order.records import scan_jsonl

    records = topical_records(per_topic=5)
    src = write_jsonl(tmp_path / "d.jsonl", records)
    args = ["--input", src, "--output", tmp_path / "d_cur.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 3,
            "--no-plot"]
    assert curate(*args) == 0
    emb_path, count_path = tmp_path / "d_cur_embeddings.npy", tmp_path / "d_token_counts.npy"
    first_emb, first_counts = np.load(emb_path), np.load(count_path)

    rows = list(range(30))
    rows[3], rows[10] = 10, 3
    del rows[20]
    write_jsonl(src, [records[i] for i in rows])
    embed_spy.clear()
    assert curate(*args) == 0
    assert embed_spy == []  # nothing new: every row reused ...
    # ... and both caches rewritten to follow the input, as the other scripts read them.
    np.testing.assert_array_equal(np.load(emb_path), first_emb[rows])
    np.testing.assert_array_equal(np.load(count_path), first_counts[rows])
    fps = scan_jsonl(src, progress=False).fingerprints
    np.testing.assert_array_equal(np.load(tmp_path / "d_cur_embeddings.fingerprints.npy"), fps)
    np.testing.assert_array_equal(np.load(tmp_path / "d_token_counts.fingerprints.npy"), fps)


def test_a_new_output_name_reuses_the_embeddings_of_the_old_one(tmp_path, tiny_model_dir, embed_spy, own_registry,
                                                                caplog):
    caplog.set_level(logging.INFO)
    src = write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=5))
    common = ["--input", src, "--model-dir", tiny_model_dir, "--n-clusters", 3, "--no-plot"]
    assert curate(*common, "--output", tmp_path / "a.jsonl") == 0
    (tmp_path / "other").mkdir()
    embed_spy.clear()
    assert curate(*common, "--output", tmp_path / "other" / "b.jsonl") == 0
    assert embed_spy == []  # nothing embedded: the rows of a_embeddings.npy were found by content
    assert "all 30 rows are those of" in caplog.text and "a_embeddings.npy, linked as b_embeddings.npy" in caplog.text
    assert os.path.samefile(tmp_path / "other" / "b_embeddings.npy", tmp_path / "a_embeddings.npy")  # one copy
    assert "DIVERSITY_ORDER_CACHE_DIR='' turns the registry off" in caplog.text  # how not to share, said where it is
    np.testing.assert_array_equal(np.load(tmp_path / "other" / "b_embeddings.npy"),
                                  np.load(tmp_path / "a_embeddings.npy"))
    assert (tmp_path / "other" / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()

    # A registered set deleted since (b) or changed since (a) is skipped: everything is embedded.
    first = np.load(tmp_path / "a_embeddings.npy")
    for path in (tmp_path / "other").glob("b_embeddings*"):
        path.unlink()
    np.save(tmp_path / "a_embeddings.npy", first[::-1].copy())
    embed_spy.clear()
    assert curate(*common, "--output", tmp_path / "c.jsonl") == 0
    assert embed_spy == [(list(range(30)), True)]
    np.testing.assert_array_equal(np.load(tmp_path / "c_embeddings.npy"), first)


def test_read_only_input_folder_caches_token_counts_beside_the_output(tmp_path, tiny_model_dir, embed_spy,
                                                                     own_registry, refuse_writes, caplog):
    data_dir = tmp_path / "in"
    data_dir.mkdir()
    src = write_jsonl(data_dir / "d.jsonl", topical_records(per_topic=5))
    out_dir = tmp_path / "out"
    args = ["--input", src, "--output", out_dir / "d_cur.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 3,
            "--no-plot"]
    caplog.set_level(logging.WARNING)
    with refuse_writes(data_dir):
        assert curate(*args) == 0
        assert "Token counts cannot be cached beside the input" in caplog.text
        assert not (data_dir / "d_token_counts.npy").exists()
        counts = np.load(out_dir / "d_token_counts.npy")
        # Found there by the next runs: nothing tokenized again, and no tokenizer needed with --load-embeddings.
        embed_spy.clear()
        assert curate(*args) == 0
        assert embed_spy == []
        assert curate("--input", src, "--output", out_dir / "e.jsonl", "--load-embeddings",
                      out_dir / "d_cur_embeddings.npy", "--n-clusters", 3, "--no-plot") == 0
        assert embed_spy == []
        assert json.loads((out_dir / "e_meta.json").read_text())["total_tokens"] == int(counts.sum())


def test_an_immutable_cache_file_is_a_warning_and_the_run_goes_on(tmp_path, tiny_model_dir, own_registry,
                                                                 refuse_writes, caplog):
    records = topical_records(per_topic=5)
    src = write_jsonl(tmp_path / "d.jsonl", records)
    out = tmp_path / "d_cur.jsonl"
    args = ["--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 3, "--no-plot"]
    assert curate(*args) == 0
    write_jsonl(src, records + topical_records(per_topic=1, seed=7))  # the caches have to be rewritten
    caplog.set_level(logging.WARNING)
    with refuse_writes(tmp_path / "d_cur_embeddings.npy"):
        assert curate(*args) == 0
    assert "d_cur_embeddings.npy not written" in caplog.text
    assert len(out.read_bytes().splitlines()) == 36
    assert curate(*args) == 0  # and once it can be written again, it is
    assert np.load(tmp_path / "d_cur_embeddings.npy").shape == (36, 32)


def test_metadata_paths_are_normalised_and_its_keys_name_no_paths(tmp_path, tiny_model_dir):
    src = write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=5))
    (tmp_path / "sub").mkdir()
    assert curate("--input", tmp_path / "sub" / ".." / "d.jsonl", "--output", tmp_path / "sub" / ".." / "x.jsonl",
                  "--model-dir", tiny_model_dir, "--n-clusters", 3, "--no-plot") == 0
    meta = json.loads((tmp_path / "x_meta.json").read_text())
    assert meta["input"] == str(src) and meta["output"] == str(tmp_path / "x.jsonl")  # no "sub/.."
    assert meta["output_files"] == [str(tmp_path / "x.jsonl")]
    assert "Writing the curated data" in meta["timings_seconds"]
    assert not any(str(tmp_path) in key for key in meta["timings_seconds"])


def test_metadata_names_the_token_counts_where_they_were_cached(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """Where the input's folder cannot be written (read-only data), the token counts go beside the output, and the
    metadata names that file (it named the one beside the input, which does not exist)."""
    import logging

    from diversity_order import caches

    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    src = write_jsonl(data / "d.jsonl", topical_records(per_topic=5))
    real = caches.try_store

    def read_only_input_folder(target, *args, **kwargs):
        place = target if isinstance(target, Path) else target.data
        if Path(place).parent == data:
            return "Read-only file system"
        return real(target, *args, **kwargs)

    monkeypatch.setattr(caches, "try_store", read_only_input_folder)
    with caplog.at_level(logging.WARNING):
        assert curate("--input", src, "--output", out / "x.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 3,
                      "--no-plot") == 0
    assert "cannot be cached beside the input (Read-only file system)" in caplog.text
    meta = json.loads((out / "x_meta.json").read_text())
    assert meta["token_counts_file"] == str(out / "d_token_counts.npy")
    assert Path(meta["token_counts_file"]).is_file() and not (data / "d_token_counts.npy").exists()
    # a rerun finds them there (nothing new to cache beside the input): the metadata names that file again
    monkeypatch.setattr(caches, "try_store", real)
    assert curate("--input", src, "--output", out / "y.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 3,
                  "--no-plot") == 0
    assert Path(json.loads((out / "y_meta.json").read_text())["token_counts_file"]).is_file()


def test_the_size_written_counts_a_datasets_folder_s_files(tmp_path):
    from diversity_order.curate import _bytes_on_disk

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "data-00000-of-00001.arrow").write_bytes(b"x" * 1000)
    (tmp_path / "ds" / "state.json").write_bytes(b"{}")
    assert _bytes_on_disk(tmp_path / "ds") == 1002  # a new user read "0.0 MB on disk" for a 396 KB folder
    assert _bytes_on_disk(tmp_path / "ds" / "state.json") == 2


def test_a_tenth_of_the_epoch_below_a_shuffles_is_warned_of(caplog):
    """A new user's paced order: 16.0 clusters per window in the first tenth, 5.7 in the sixth where a shuffle had
    8.0, and a mean over the epoch that hid it. Why is said from the windows there: few documents each (long ones)
    holding as many of the clusters they could as elsewhere, or windows mixed worse than elsewhere."""
    import logging

    from diversity_order.curate import _log_by_tenth
    from diversity_order.diversity import diversity_by_part

    def quality(tenths, **extra):
        return {"diversity": {"mean": sum(tenths) / len(tenths)}, "diversity_by_tenth": tenths, **extra}

    def curated(unique):
        return quality(diversity_by_part(unique))

    def warned():
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    shuffled = quality([8.0] * 10, shuffles=5)
    # 100 windows; the sixth tenth's hold 2 documents each, the others 20 (long documents gathered there), every
    # window holding the clusters its documents could but a few.
    documents = np.array([20] * 50 + [2] * 10 + [20] * 40)
    unique = np.minimum(documents, 12) - (np.arange(100) % 7 == 0)
    with caplog.at_level(logging.INFO):
        _log_by_tenth({"original": quality([6.0] * 10), "curated": curated(unique), "random_shuffle": shuffled},
                      unique, documents, 30)
    assert "by tenth of the epoch: input 6.0 6.0" in caplog.text and "random shuffle (mean of 5) 8.0" in caplog.text
    assert len(warned()) == 1 and warned()[0].startswith("In tenth 6 of the epoch the curated order's windows hold 1.9 "
                                                         "clusters on average, fewer than a random shuffle's 8.0 there")
    assert ("its windows hold 2.0 documents on average (18.2 over the epoch), 0% of them one document (0% over the "
            "epoch), and 0.95 of the clusters their documents could hold (0.60 over the epoch): long documents fall "
            "there") in warned()[0]
    caplog.clear()
    with caplog.at_level(logging.INFO):  # 4 windows: four values, said to be per window (a new user read "tenth")
        _log_by_tenth({"original": quality([8.0, 8.0, 8.0, 9.0]), "curated": quality([9.0] * 4),
                       "random_shuffle": quality([8.5] * 4, shuffles=5)}, np.full(4, 9), np.full(4, 12), 30)
    assert "Unique clusters per window by window of the epoch (fewer than ten): input 8.0 8.0 8.0 9.0;" in caplog.text
    assert not warned()
    caplog.clear()
    # The tenth furthest below in ratio, not in clusters (a reviewer's case); windows as full there as elsewhere but
    # of few clusters: this order's mix, not long documents.
    unique = np.array([20] * 90 + [5] * 10)
    with caplog.at_level(logging.INFO):
        _log_by_tenth({"original": quality([6.0] * 10), "curated": curated(unique),
                       "random_shuffle": quality([22.0] * 9 + [6.0], shuffles=5)}, unique, np.full(100, 40), 30)
    assert len(warned()) == 1 and warned()[0].startswith("In tenth 10 of the epoch the curated order's windows hold 5.0")
    assert ("its windows hold 40.0 documents on average (40.0 over the epoch), 0% of them one document (0% over the "
            "epoch), and 0.17 of the clusters their documents could hold (0.62 over the epoch): this order puts "
            "documents of few clusters together there") in warned()[0]
    caplog.clear()
    # A run of the held-out mix: 61% of the sixth tenth's windows filled by one long document, the others as mixed
    # as elsewhere: before, "enough for more clusters: this order puts documents of few clusters together there".
    documents = np.array([40] * 50 + [1] * 6 + [40] * 4 + [40] * 40)
    unique = np.where(documents == 1, 1, 27)
    with caplog.at_level(logging.INFO):
        _log_by_tenth({"original": quality([6.0] * 10), "curated": curated(unique),
                       "random_shuffle": quality([20.0] * 10, shuffles=5)}, unique, documents, 30)
    assert len(warned()) == 1 and "60% of them one document (6% over the epoch)" in warned()[0]
    assert warned()[0].endswith("long documents fall there, each window of them holding few clusters whatever their "
                                "mix; --compare-strategies gives each ordering's lowest tenth")
    caplog.clear()
    # A reviewer's order by a topic score: one cluster per window everywhere, mixed no worse in its worst tenth
    # than elsewhere (0.24 against 0.10), which the first test alone took for long documents.
    documents = np.array([12] * 90 + [4] * 10)
    unique = np.ones(100, dtype=np.int64)
    with caplog.at_level(logging.INFO):
        _log_by_tenth({"original": quality([6.0] * 10), "curated": curated(unique),
                       "random_shuffle": quality([8.0] * 10, shuffles=5)}, unique, documents, 30)
    assert len(warned()) == 1 and warned()[0].endswith("this order puts documents of few clusters together there; "
                                                       "--compare-strategies gives each ordering's lowest tenth")
    caplog.clear()
    with caplog.at_level(logging.INFO):  # fewer than ten windows: a "tenth" is a window; nothing to warn of
        _log_by_tenth({"original": quality([6.0] * 7), "curated": quality([10.0] * 6 + [0.5]),
                       "random_shuffle": quality([8.0] * 7, shuffles=5)}, np.full(7, 5), np.full(7, 5), 30)
    assert not warned()


def test_an_unchanged_rerun_keeps_the_k_means_labels_and_any_change_fits_again(tmp_path, tiny_model_dir,
                                                                                topical_jsonl, monkeypatch, caplog):
    from diversity_order import caches, clustering

    caplog.set_level(logging.INFO)
    fits = []
    fit = clustering.kmeans_labels
    monkeypatch.setattr(clustering, "kmeans_labels", lambda *a, **k: fits.append(a[1]) or fit(*a, **k))
    out = tmp_path / "out" / "b.jsonl"
    kept = tmp_path / "out" / "b_kmeans.npy"
    args = ["--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--seq-len", 1000, "--no-plot"]

    def labels(*extra) -> np.ndarray:
        assert curate(*args, *extra) == 0
        return np.load(tmp_path / "out" / "b_labels.npy")

    first = labels("--n-clusters", 6)
    assert fits == [6]
    caplog.clear()
    assert np.array_equal(labels("--n-clusters", 6), first) and fits == [6]
    assert "k-means labels kept, for the same embeddings, k, --seed and fit: all 240 rows reused from b_kmeans.npy" \
        in caplog.text
    labels("--n-clusters", 5)
    labels("--n-clusters", 5, "--seed", 7)
    assert fits == [6, 5, 5]

    # One record edited: fitted again, to the labels a run without any kept labels gets.
    lines = topical_jsonl.read_text().splitlines()
    lines[17] = json.dumps({"text": "an edited record about something else entirely"})
    topical_jsonl.write_text("\n".join(lines) + "\n")
    edited = labels("--n-clusters", 5, "--seed", 7)
    assert fits == [6, 5, 5, 5]
    kept.unlink()
    assert np.array_equal(labels("--n-clusters", 5, "--seed", 7), edited) and fits == [6, 5, 5, 5, 5]

    # Kept labels that cannot be this k's (a damaged file) are fitted again, not used.
    caches.store(kept, caches.written_key(kept), caches.written_fingerprints(kept), np.full(240, 99, np.int64))
    caplog.clear()
    assert np.array_equal(labels("--n-clusters", 5, "--seed", 7), edited) and len(fits) == 6
    assert "name clusters outside 0..4: fitted again" in caplog.text
    # A damaged file (a reviewer's flipped bytes in b_kmeans.npy) was fitted again without a word: said now.
    raw = bytearray(kept.read_bytes())
    raw[-3] ^= 0xFF
    kept.write_bytes(bytes(raw))
    caplog.clear()
    assert np.array_equal(labels("--n-clusters", 5, "--seed", 7), edited) and len(fits) == 7
    assert "k-means labels fitted again: b_kmeans.npy" in caplog.text


def test_kept_k_means_labels_are_never_taken_for_other_rows(tmp_path, tiny_model_dir, topical_jsonl, monkeypatch):
    """A reviewer's --load-embeddings file beside the same records shuffled, into a new folder: the registry found the
    labels kept for the first order and matched them to the records by text, while the rows (by position) were the
    same; 467 of 600 labels differed from a fresh run's. The key holds the records' fingerprints in order now."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(240, 8)).astype(np.float32)
    np.save(tmp_path / "e.npy", vectors)
    shuffled = tmp_path / "shuffled.jsonl"
    lines = topical_jsonl.read_text().splitlines()
    shuffled.write_text("\n".join(lines[i] for i in rng.permutation(len(lines))) + "\n")

    def labels(source, folder, *env) -> np.ndarray:
        assert curate("--input", source, "--output", tmp_path / folder / "b.jsonl", "--model-dir", tiny_model_dir,
                      "--load-embeddings", tmp_path / "e.npy", "--n-clusters", 6, "--seq-len", 1000, "--no-plot") == 0
        return np.load(tmp_path / folder / "b_labels.npy")

    labels(topical_jsonl, "first")
    taken = labels(shuffled, "second")  # the registry holds the first run's labels
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")
    assert np.array_equal(taken, labels(shuffled, "fresh"))
