"""A curate run SIGKILLed in the middle of writing any file leaves nothing a later run trusts.

The child process is the real script; only its atomic writer is wrapped so that, while writing
the chosen file, it writes part of it, signals the test and waits to be killed. That makes
"killed mid-write" deterministic instead of a race.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import topical_records, write_jsonl

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import contextlib, os, sys, time
    from pathlib import Path
    import diversity_order.atomic as atomic
    import diversity_order.records as records
    import diversity_order.plots as plots
    real = atomic.atomic_open
    target, marker = sys.argv[1], sys.argv[2]

    @contextlib.contextmanager
    def stalling_open(path, mode="wb"):
        with real(path, mode) as handle:
            name = Path(path).name  # the curated file is written under a staged name first
            if name == target or (name.startswith(f".{target}.") and ".staged" in name):
                handle.write(b"partial" if "b" in mode else "partial")
                handle.flush()
                Path(marker).touch()
                time.sleep(600)
            yield handle

    atomic.atomic_open = records.atomic_open = plots.atomic_open = stalling_open
    import curate_dataset
    from diversity_order.cli import run_main
    sys.exit(run_main(curate_dataset.main, sys.argv[3:]))
""")


def run_killed_while_writing(target: str, args: list, tmp_path: Path) -> None:
    marker = tmp_path / "writing.marker"
    marker.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    child = subprocess.Popen([sys.executable, "-c", CHILD, target, str(marker), *map(str, args)],
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not marker.exists():
        if child.poll() is not None:
            pytest.fail(f"child ended before writing {target}: {child.stderr.read().decode()[-2000:]}")
        if time.time() > deadline:
            child.kill()
            pytest.fail(f"child never wrote {target}")
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()


def run_clean(args: list) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "curate_dataset.py", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


# In the order the pipeline writes them: caches, curated data, metadata.
TARGETS = ["d_token_counts.npy", "d_cur_embeddings.npy", "d_cur.jsonl", "d_cur_meta.json"]


def test_kill_mid_write_then_rerun_equals_uninterrupted_run(tmp_path, tiny_model_dir):
    records = topical_records(per_topic=20)
    grown = records + topical_records(per_topic=2, seed=9)
    src = write_jsonl(tmp_path / "d.jsonl", records)
    out = tmp_path / "d_cur.jsonl"
    args = ["--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6, "--no-plot",
            "--no-progress"]

    # A first complete run; then data is appended and each following run is killed while
    # writing one of the files (every kill happens further along the pipeline).
    run_clean(args)
    write_jsonl(src, grown)
    for target in TARGETS:
        path = tmp_path / target
        before = path.read_bytes() if path.exists() else None
        run_killed_while_writing(target, args, tmp_path)
        # The file being written still holds its previous complete version. Killed while the curated file was
        # written (under a staged name), the earlier run's files and the metadata describing them are all there.
        # The metadata's first write is the stub that replaces it just before the curated file is: killed then,
        # both are as they were.
        assert (path.read_bytes() if path.exists() else None) == before, target
        if target in ("d_cur.jsonl", "d_cur_meta.json"):
            earlier = json.loads((tmp_path / "d_cur_meta.json").read_text())
            assert earlier["final_count"] == len(records) == len(out.read_bytes().splitlines())
            assert [p.name for p in tmp_path.glob(".d_cur.jsonl.*staged*")]  # the killed run's staged file
        for path in tmp_path.glob("*.cache.json"):
            meta = json.loads(path.read_text())
            data = np.load(path.with_name(path.name.replace(".cache.json", ".npy")), mmap_mode="r")
            fps = np.load(path.with_name(path.name.replace(".cache.json", ".fingerprints.npy")))
            assert data.shape[0] == fps.shape[0] == meta["rows"], path.name

    # Rerunning completes, and the result equals an uninterrupted run in a fresh folder.
    run_clean(args)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    fresh_src = write_jsonl(fresh / "d.jsonl", grown)
    run_clean(["--input", fresh_src, "--output", fresh / "d_cur.jsonl", "--model-dir", tiny_model_dir,
               "--n-clusters", 6, "--no-plot", "--no-progress"])
    assert out.read_bytes() == (fresh / "d_cur.jsonl").read_bytes()
    assert np.array_equal(np.load(tmp_path / "d_cur_embeddings.npy"), np.load(fresh / "d_cur_embeddings.npy"))
    assert np.array_equal(np.load(tmp_path / "d_token_counts.npy"), np.load(fresh / "d_token_counts.npy"))
    assert len(out.read_bytes().splitlines()) == len(grown)
    assert not list(tmp_path.glob(".d_cur*"))  # the killed runs' partial files were swept


def test_script_exits_2_with_one_line_and_no_traceback(tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "oops"}\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "curate_dataset.py", "--input", str(bad), "--output",
                           str(tmp_path / "o.jsonl"), "--model-dir", str(tiny_model_dir), "--no-progress"],
                          cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: {bad}:2: no field 'text' (this record has keys: txt); choose the text field with --text-field"]
    assert "Traceback" not in done.stderr


def test_a_killed_runs_temp_files_are_removed_by_the_next_run_never_a_live_ones(tmp_path, tiny_model_dir,
                                                                               tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(tmp_path_factory.mktemp("registry")))
    src = write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=20))
    args = ["--input", src, "--output", tmp_path / "d_cur.jsonl", "--model-dir", tiny_model_dir, "--n-clusters", 6,
            "--no-plot", "--no-progress"]
    run_killed_while_writing("d_cur_embeddings.npy", args, tmp_path)
    left = list(tmp_path.glob(".d_cur_embeddings.npy.*.tmp"))
    assert len(left) == 1  # the killed run's half-written embeddings
    run_clean(args)
    assert not left[0].exists()
    assert not list(tmp_path.glob(".*.tmp"))

    # Another run, alive, is writing the file right now: its temp file survives a finishing run.
    from diversity_order import atomic

    write_jsonl(src, topical_records(per_topic=21))  # so that the caches are written again
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        live_temp = tmp_path / f".d_cur_embeddings.npy.{atomic._HOST}.{live.pid}.abcd1234.tmp"
        live_temp.write_bytes(b"half written by a live run")
        run_clean(args)
        assert live_temp.exists()
    finally:
        live.kill()
        live.wait()
    assert [p.name for p in tmp_path.glob(".*.tmp")] == [live_temp.name]


def _ctrl_c_at_batch(monkeypatch, batch: int) -> list[int]:
    """Ctrl-C (a KeyboardInterrupt) as the tokenizer starts batch ``batch``; the sizes of the batches it was given."""
    from diversity_order.tokenizer import DocumentTokenizer

    real, calls = DocumentTokenizer.encode_texts, []

    def interrupted(self, texts):
        calls.append(len(texts))
        if len(calls) == batch:
            raise KeyboardInterrupt
        return real(self, texts)

    monkeypatch.setattr(DocumentTokenizer, "encode_texts", interrupted)
    return calls


def test_ctrl_c_while_embedding_keeps_the_rows_done_and_a_rerun_embeds_only_the_rest(tmp_path, tiny_model_dir,
                                                                                     monkeypatch, caplog, capsys):
    """Ctrl-C part-way through embedding stores the rows and counts finished so far (the rest marked
    unfilled); the rerun embeds only the rest, and every file equals an uninterrupted run's."""
    import logging

    import curate_dataset
    from diversity_order import caches
    from diversity_order.cli import run_main
    from diversity_order.tokenizer import DocumentTokenizer

    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")  # no registry: the rerun may only use its own set
    records = topical_records(per_topic=30)
    n = len(records)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for folder in (whole, cut):
        folder.mkdir()
        write_jsonl(folder / "d.jsonl", records)
    common = ["--model-dir", str(tiny_model_dir), "--n-clusters", "4", "--no-plot", "--no-progress",
              "--embed-batch-size", "16"]
    assert run_main(curate_dataset.main, ["--input", str(whole / "d.jsonl"), "--output", str(whole / "c.jsonl"),
                                          *common]) == 0
    real = DocumentTokenizer.encode_texts
    calls = _ctrl_c_at_batch(monkeypatch, 4)
    args = ["--input", str(cut / "d.jsonl"), "--output", str(cut / "c.jsonl"), *common]
    with caplog.at_level(logging.INFO):
        assert run_main(curate_dataset.main, args) == 130
    kept = sum(calls[:3])
    assert 0 < kept < n and f"Interrupted: {kept} of {n} embeddings are kept in" in caplog.text
    assert caches.filled_rows(cut / "c_embeddings.npy") == (kept, n)
    assert caches.filled_rows(cut / "d_token_counts.npy") == (kept, n)
    assert not (cut / "c.jsonl").exists()
    # The part-filled set is no --load-embeddings input, nor either side of a comparison.
    import compare_clusterings

    capsys.readouterr()
    assert run_main(curate_dataset.main, [*args, "--load-embeddings", str(cut / "c_embeddings.npy")]) == 2
    for shallow, deep in ((cut, whole), (whole, cut)):
        assert run_main(compare_clusterings.main, ["--shallow", str(shallow / "c_embeddings.npy"), "--deep",
                                                   str(deep / "c_embeddings.npy"), "--n-clusters", "4"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 3 and all(f"only {kept} of the {n} rows of c_embeddings.npy were computed" in line
                                    for line in errors), errors
    monkeypatch.setattr(DocumentTokenizer, "encode_texts", real)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert run_main(curate_dataset.main, args) == 0
    assert f"Embedding {n - kept} record(s) of {n}" in caplog.text
    assert caches.filled_rows(cut / "c_embeddings.npy") is None
    for name in ("c_embeddings.npy", "d_token_counts.npy", "c_labels.npy", "c_order.npy", "c.jsonl"):
        assert (cut / name).read_bytes() == (whole / name).read_bytes(), name
    manifest = json.loads((cut / "c_embeddings.cache.json").read_text())
    assert manifest == json.loads((whole / "c_embeddings.cache.json").read_text()) | {"files": manifest["files"]}


SIGTERM_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from diversity_order.tokenizer import DocumentTokenizer
    real, calls = DocumentTokenizer.encode_texts, []

    def terminated_at_the_fourth_batch(self, texts):
        calls.append(len(texts))
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's preemption
            time.sleep(5)
        return real(self, texts)

    DocumentTokenizer.encode_texts = terminated_at_the_fourth_batch
    import curate_dataset
    from diversity_order.cli import run_command
    sys.exit(run_command(curate_dataset.main))
""")


def test_sigterm_while_embedding_keeps_the_rows_done(tmp_path, tiny_model_dir):
    """SIGTERM (Slurm's preemption or time limit) while embedding: the real handler keeps the rows done,
    as Ctrl-C does, and the command exits 143; the rerun embeds only the rest."""
    from diversity_order import caches

    records = topical_records(per_topic=30)
    write_jsonl(tmp_path / "d.jsonl", records)
    args = ["--input", tmp_path / "d.jsonl", "--output", tmp_path / "c.jsonl", "--model-dir", tiny_model_dir,
            "--n-clusters", 4, "--no-plot", "--no-progress", "--embed-batch-size", 16]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", DIVERSITY_ORDER_CACHE_DIR="")
    done = subprocess.run([sys.executable, "-c", SIGTERM_CHILD, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"Terminated (SIGTERM): 48 of {len(records)} embeddings are kept in" in done.stderr
    assert caches.filled_rows(tmp_path / "c_embeddings.npy") == (48, len(records))
    rerun = subprocess.run([sys.executable, "curate_dataset.py", *map(str, args)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Embedding {len(records) - 48} record(s) of {len(records)}" in rerun.stderr
    assert caches.filled_rows(tmp_path / "c_embeddings.npy") is None


SIGTERM_WHILE_DESCRIBING = textwrap.dedent("""
    import os, signal, sys, time
    from diversity_order import curate

    def terminated(run):
        os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's time limit, once the curated file is in place
        time.sleep(30)

    curate.describe = terminated
    import curate_dataset
    from diversity_order.cli import run_command
    sys.exit(run_command(curate_dataset.main))
""")


def _curate_child(script: str, tmp_path, tiny_model_dir):
    """A curate run of 120 records in a child process running ``script`` (which patches it, then runs the command):
    (the finished process, its arguments, its environment)."""
    write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=20))
    args = ["--input", tmp_path / "d.jsonl", "--output", tmp_path / "c.jsonl", "--model-dir", tiny_model_dir,
            "--n-clusters", 4, "--no-plot", "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", DIVERSITY_ORDER_CACHE_DIR="")
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    return done, args, env


SIGTERM_WHILE_STORING = textwrap.dedent("""
    import os, signal, sys
    from diversity_order import caches

    real = caches.Fill.commit

    def stopped_while_storing(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # every row computed, the set being stored
        return real(self, *args, **kwargs)

    caches.Fill.commit = stopped_while_storing
    import curate_dataset
    from diversity_order.cli import run_command
    sys.exit(run_command(curate_dataset.main))
""")


def test_a_stop_while_the_finished_embeddings_are_stored_keeps_them(tmp_path, tiny_model_dir):
    """A reviewer's SIGTERM just after 'Embedded 20000 documents' left no embeddings at all: the set being stored was
    abandoned though every row was computed. The store now finishes first; the rerun embeds nothing."""
    from diversity_order import caches

    done, args, env = _curate_child(SIGTERM_WHILE_STORING, tmp_path, tiny_model_dir)
    assert done.returncode == 143, done.stderr[-3000:]
    assert (tmp_path / "c_embeddings.cache.json").is_file() and caches.filled_rows(tmp_path / "c_embeddings.npy") is None
    rerun = subprocess.run([sys.executable, "curate_dataset.py", *map(str, args)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0 and "Embedding " not in rerun.stderr.replace("Embedding table", ""), rerun.stderr


def test_sigterm_outside_embedding_ends_the_run_with_a_line_and_143(tmp_path, tiny_model_dir):
    """SIGTERM after embedding ended the run at once without a word (Python's default): a user reading the
    scheduler's log saw the last stage's line and nothing else. Now it stops as Ctrl-C does: one line, exit 143,
    the files written complete and known to the next run."""
    done, _, _ = _curate_child(SIGTERM_WHILE_DESCRIBING, tmp_path, tiny_model_dir)
    assert done.returncode == 143, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == \
        "terminated (SIGTERM): every file written is complete; none was left half-written"
    assert sorted((tmp_path / "c.jsonl").read_bytes().splitlines()) == \
        sorted((tmp_path / "d.jsonl").read_bytes().splitlines())
    assert json.loads((tmp_path / "c_meta.json").read_text())["complete"] is False
    assert not [path for path in tmp_path.iterdir() if path.name.endswith(".tmp") or "staged" in path.name]


def test_ctrl_c_while_only_counting_tokens_keeps_the_counts_done(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """With --load-embeddings only token counts are computed: Ctrl-C part-way keeps those done, and the
    rerun counts only the rest, ending with the counts an uninterrupted run caches."""
    import logging

    import curate_dataset
    from diversity_order import caches
    from diversity_order.cli import run_main
    from diversity_order.tokenizer import DocumentTokenizer

    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")
    records = topical_records(per_topic=30)
    n = len(records)
    write_jsonl(tmp_path / "d.jsonl", records)
    vectors = np.random.default_rng(0).normal(size=(n, 8)).astype(np.float32)
    np.save(tmp_path / "vectors.npy", vectors)
    args = ["--input", str(tmp_path / "d.jsonl"), "--output", str(tmp_path / "c.jsonl"), "--model-dir",
            str(tiny_model_dir), "--n-clusters", "4", "--no-plot", "--no-progress", "--embed-batch-size", "16",
            "--load-embeddings", str(tmp_path / "vectors.npy")]
    real = DocumentTokenizer.encode_texts
    _ctrl_c_at_batch(monkeypatch, 3)
    with caplog.at_level(logging.INFO):
        assert run_main(curate_dataset.main, args) == 130
    assert f"Interrupted: the token counts of 32 of {n} records are kept in" in caplog.text
    assert caches.filled_rows(tmp_path / "d_token_counts.npy") == (32, n)
    monkeypatch.setattr(DocumentTokenizer, "encode_texts", real)
    with caplog.at_level(logging.INFO):
        assert run_main(curate_dataset.main, args) == 0
    assert f"Counting tokens of {n - 32} record(s) of {n}" in caplog.text
    assert caches.filled_rows(tmp_path / "d_token_counts.npy") is None
    counts = np.load(tmp_path / "d_token_counts.npy")
    (tmp_path / "d_token_counts.npy").unlink()
    (tmp_path / "d_token_counts.cache.json").unlink()
    assert run_main(curate_dataset.main, args) == 0  # counted afresh, in one go
    np.testing.assert_array_equal(np.load(tmp_path / "d_token_counts.npy"), counts)


KILLED_WHILE_INDEXING = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from diversity_order import records

    def slow(*args):
        time.sleep(120)

    records._scan_piece = slow
    path = Path(sys.argv[1])
    records._scan_in_processes([path], "text", [(0, 0, 10), (0, 10, None)], 2, False, [path.stat().st_size])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_index_workers_end_when_the_run_is_killed(tmp_path):
    """A reviewer's kill -9 (and SIGTERM, before commands handled it) while a large input was indexed left the two
    forked workers waiting forever, adopted by init, a few hundred MB each. They now end with their parent."""
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n' * 10)
    child = subprocess.Popen([sys.executable, "-c", KILLED_WHILE_INDEXING, str(tmp_path / "d.jsonl")], cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))

    def workers() -> list[int]:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == child.pid:
                found.append(int(stat.parent.name))
        return found

    deadline = time.time() + 60
    while len(workers()) < 2 and time.time() < deadline:
        time.sleep(0.1)
    started = workers()
    assert len(started) == 2
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.time() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in started) and time.time() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in started if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive
