"""Large inputs, forced at small N: the embeddings cache lives on disk, --memory-budget picks the exact
in-memory path (today's results) or the out-of-core one (a seeded sample fit, every row assigned)."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import curate_dataset
from conftest import topical_records, write_jsonl
from diversity_order import clustering, features, matrix
from diversity_order.cli import run_main

TINY_BUDGET = "1K"  # far below any embedding matrix: the out-of-core path


def curate(*args):
    return run_main(curate_dataset.main, [str(a) for a in args] + ["--no-progress", "--no-plot"])


@pytest.fixture()
def data(tmp_path):
    return write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=40))


def _outputs(out):
    stem = str(out)[: -len(".jsonl")]
    return (out.read_bytes(), np.load(f"{stem}_labels.npy"), np.load(f"{stem}_order.npy"),
            json.loads(open(f"{stem}_meta.json").read()))


def test_within_the_budget_the_labels_are_todays_minibatch_kmeans_on_all_rows(tmp_path, data, tiny_model_dir, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "a.jsonl"
    assert curate("--input", data, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6) == 0
    curated, labels, order, meta = _outputs(out)
    embeddings = np.load(tmp_path / "a_embeddings.npy")
    assert embeddings.dtype == np.float32 and embeddings.shape == (240, 32)
    # What the exact path was before the cache moved to disk: the whole matrix in memory, fit_predict.
    expected = clustering.make_kmeans(6, meta["seed"]).fit_predict(embeddings)
    np.testing.assert_array_equal(labels, expected)
    assert meta["clustering"]["plan"]["exact"] and "k-means in memory" in caplog.text
    # An explicit budget the matrix fits changes nothing.
    again = tmp_path / "b.jsonl"
    assert curate("--input", data, "--output", again, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--memory-budget", "1G") == 0
    assert _same(_outputs(again)[:3], (curated, labels, order))
    # A budget past the memory there is (a reviewer's 100T, accepted without a word) is said.
    assert "more than the" not in caplog.text
    assert curate("--input", data, "--output", again, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--memory-budget", "100T") == 0
    assert f"--memory-budget 102,400.0 GiB: more than the {matrix.total_memory_bytes() / 2**30:.1f} GiB" in caplog.text


def _same(a, b):
    return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1:], b[1:]))


def test_out_of_core_with_every_row_in_the_sample_equals_the_in_memory_run(tmp_path, data, tiny_model_dir, caplog):
    caplog.set_level(logging.INFO)
    exact, ooc = tmp_path / "exact.jsonl", tmp_path / "ooc.jsonl"
    assert curate("--input", data, "--output", exact, "--model-dir", tiny_model_dir, "--n-clusters", 6) == 0
    assert curate("--input", data, "--output", ooc, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--memory-budget", TINY_BUDGET) == 0
    # 240 rows < MIN_FIT_SAMPLE: the "sample" is every row, so the fit is the same fit.
    assert "k-means out of core" in caplog.text and "exceed the memory budget" in caplog.text
    assert _same(_outputs(ooc)[:3], _outputs(exact)[:3])
    plan = _outputs(ooc)[3]["clustering"]["plan"]
    assert plan["exact"] is False and plan["fit_rows"] == 240


def test_out_of_core_sampled_fit_labels_every_row_near_the_full_fit(tmp_path, data, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(clustering, "MIN_FIT_SAMPLE", 120)
    out = tmp_path / "o.jsonl"
    assert curate("--input", data, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--memory-budget", TINY_BUDGET) == 0
    curated, labels, order, meta = _outputs(out)
    assert meta["clustering"]["plan"]["fit_rows"] == 120
    x = np.load(tmp_path / "o_embeddings.npy")
    # The documented meaning: MiniBatchKMeans fitted on the seeded sample, every row to its nearest centre.
    centres = clustering.make_kmeans(6, meta["seed"]).fit(x[clustering.sample_rows(240, 120, meta["seed"])])
    nearest = ((x[:, None, :] - centres.cluster_centers_[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(labels, nearest)
    assert labels.shape == (240,) and set(labels.tolist()) <= set(range(6))
    full = clustering.make_kmeans(6, meta["seed"]).fit_predict(x)
    assert clustering.inertia(x, labels, 6) <= 1.1 * clustering.inertia(x, full, 6)
    assert sorted(curated.splitlines()) == sorted(data.read_bytes().splitlines())


@pytest.mark.parametrize("extra", [[], ["--pca-components", "8"], ["--embedding-dtype", "float16"],
                                   ["--cluster-fit-sample", "100", "--memory-budget", "1G"]])
def test_the_fit_sample_kept_while_embedding_gives_what_reading_it_back_gives(tmp_path, data, tiny_model_dir,
                                                                                monkeypatch, extra):
    """The rows the first fit reads are kept as they are embedded (not read back from the cache file):
    the same labels, order and curated bytes as reading them from the file."""
    from diversity_order import curate as pipeline

    monkeypatch.setattr(clustering, "MIN_FIT_SAMPLE", 120)
    handed = []
    take = matrix.HeldRows.take

    def spy(self, rows):
        values = take(self, rows)
        if values is not None:
            handed.append(rows.size)
        return values

    monkeypatch.setattr(matrix.HeldRows, "take", spy)
    flags = ["--model-dir", tiny_model_dir, "--n-clusters", 6, "--memory-budget", TINY_BUDGET, *extra]
    held = tmp_path / "held.jsonl"
    assert curate("--input", data, "--output", held, *flags) == 0
    assert handed == [100 if "--cluster-fit-sample" in extra else 120]
    fitted = _outputs(held)[3]["clustering"]
    assert fitted["fit_rows"] == (100 if "--cluster-fit-sample" in extra else 120)  # (the plan's said 240 there)
    monkeypatch.setattr(pipeline, "_rows_read_first", lambda run: None)
    read = tmp_path / "read.jsonl"
    handed.clear()
    assert curate("--input", data, "--output", read, *flags) == 0
    assert handed == []
    assert _same(_outputs(held)[:3], _outputs(read)[:3])


def test_held_rows_are_the_written_rows_taken_once_and_only_when_complete():
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(1000, 60, replace=False))
    held = matrix.HeldRows(rows, 3, np.float16)
    truth = np.zeros((1000, 3), np.float16)
    for lo in rng.permutation(np.arange(0, 1000, 50)):  # blocks of 50 rows, in any order, one written twice
        block = rng.normal(size=(50, 3)).astype(np.float16)
        truth[lo: lo + 50] = block
        held.capture(np.arange(lo, lo + 50), block)
        if lo == 500:
            block = rng.normal(size=(50, 3)).astype(np.float16)
            truth[lo: lo + 50] = block
            held.capture(np.arange(lo, lo + 50), block)
    assert held.complete and held.take(rows[::-1]) is None and held.take(rows[1:]) is None
    np.testing.assert_array_equal(held.take(rows), truth[rows])
    assert held.take(rows) is None and not held.complete  # handed over once
    partial = matrix.HeldRows(rows, 3, np.float16)
    partial.capture(np.arange(500), truth[:500])
    assert not partial.complete and partial.take(rows) is None


def test_out_of_core_pca_and_calibration_run_from_the_file(tmp_path, data, tiny_model_dir, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(clustering, "MIN_FIT_SAMPLE", 150)
    out = tmp_path / "p.jsonl"
    assert curate("--input", data, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--pca-components", 8, "--memory-budget", TINY_BUDGET) == 0
    meta = _outputs(out)[3]
    assert meta["pca"]["fit_rows"] == 150 and meta["pca"]["n_components"] == 8
    assert "PCA out of core" in caplog.text
    assert not list(tmp_path.glob(".*.tmp"))  # the projected rows' scratch file is gone
    assert curate("--input", data, "--output", out, "--model-dir", tiny_model_dir, "--calibrate-k",
                  "--memory-budget", TINY_BUDGET) == 0
    table = json.loads((tmp_path / "p_calibration.json").read_text())
    assert table["k_means_fit_rows"] == 150 and table["samples"] == 150
    assert [row["k"] for row in table["rows"]] == [k for k in clustering.CALIBRATION_K_VALUES if k < 240]
    assert all(row["size_min"] >= 0 and row["silhouette"] is not None for row in table["rows"])


def test_float16_cache_is_close_to_float32_and_reused(tmp_path, data, tiny_model_dir, caplog):
    caplog.set_level(logging.INFO)
    f32, f16 = tmp_path / "f32.jsonl", tmp_path / "f16.jsonl"
    assert curate("--input", data, "--output", f32, "--model-dir", tiny_model_dir, "--n-clusters", 6) == 0
    assert curate("--input", data, "--output", f16, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--embedding-dtype", "float16") == 0
    a, b = np.load(tmp_path / "f32_embeddings.npy"), np.load(tmp_path / "f16_embeddings.npy")
    assert b.dtype == np.float16
    np.testing.assert_array_equal(b, a.astype(np.float16))  # the float32 vectors, rounded once
    caplog.clear()
    assert curate("--input", data, "--output", f16, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--embedding-dtype", "float16") == 0
    assert "Embeddings: all 240 rows reused" in caplog.text
    caplog.clear()
    assert curate("--input", data, "--output", f16, "--model-dir", tiny_model_dir, "--n-clusters", 6) == 0
    # Another dtype is never mixed in: here the float32 rows come from the other run's registered cache.
    assert "holds float16 rows of shape 32, expected float32" in caplog.text
    assert "all 240 rows are those of" in caplog.text and "f32_embeddings.npy, linked as" in caplog.text
    assert np.load(tmp_path / "f16_embeddings.npy").dtype == np.float32


def test_an_incremental_run_copies_cached_rows_into_the_new_file(tmp_path, tiny_model_dir):
    records = topical_records(per_topic=20)
    src = write_jsonl(tmp_path / "d.jsonl", records)
    out = tmp_path / "d_cur.jsonl"
    args = ["--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6]
    assert curate(*args) == 0
    grown = records[::-1][:100] + topical_records(per_topic=3, seed=5)  # moved, removed and new records
    write_jsonl(src, grown)
    assert curate(*args) == 0
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert curate("--input", write_jsonl(fresh / "d.jsonl", grown), "--output", fresh / "d_cur.jsonl",
                  "--model-dir", tiny_model_dir, "--n-clusters", 6) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "d_cur_embeddings.npy"), np.load(fresh / "d_cur_embeddings.npy"))
    assert out.read_bytes() == (fresh / "d_cur.jsonl").read_bytes()


def test_load_embeddings_is_mapped_not_loaded(tmp_path, data, tiny_model_dir, caplog):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(240, 16)).astype(np.float64)
    vectors[[3, 77]] = np.nan
    vectors[[5, 6, 200]] = 0  # rows never computed (a part-filled cache copied without its manifest)
    np.save(tmp_path / "deep.npy", vectors)
    caplog.set_level(logging.WARNING)
    mapped = features.load_external_embeddings(tmp_path / "deep.npy", 240)
    assert isinstance(mapped, matrix.MatrixFile) and mapped.dtype == np.float64
    assert "2 row(s) of deep.npy are NaN/inf" in caplog.text and "3 row(s) of deep.npy are all zeros" in caplog.text
    expected = vectors.astype(np.float32)
    expected[[3, 77]] = 0
    np.testing.assert_array_equal(matrix.load(mapped), expected)
    out = tmp_path / "l.jsonl"
    assert curate("--input", data, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--load-embeddings", tmp_path / "deep.npy", "--memory-budget", TINY_BUDGET) == 0
    assert _outputs(out)[1].shape == (240,)


@pytest.mark.parametrize("flag,value,message", [("--memory-budget", "lots", "expected a size such as 8G"),
                                                ("--embedding-dtype", "int8", "invalid choice")])
def test_bad_large_input_flags_are_one_line(tmp_path, data, flag, value, message, capsys):
    with pytest.raises(SystemExit) as exited:
        curate("--input", data, "--output", tmp_path / "o.jsonl", flag, value)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


_HEAP_SCRIPT = """
import ctypes, ctypes.util, sys
import numpy as np
from diversity_order.runtime import StageTimer

def anonymous_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) // 1024

# The threshold glibc raises itself to (32 MB) once large arrays have been freed: smaller blocks then
# come from the heap.
ctypes.CDLL(ctypes.util.find_library("c")).mallopt(-3, 32 << 20)
timer = StageTimer()
with timer.stage("filling the heap"):
    blocks = [np.ones(100_000 // 8) for _ in range(2000)]  # ~100 KB each, one after another in the heap
    kept = blocks[::20]  # survivors between the freed blocks keep the heap from shrinking at its top
    del blocks
    held = anonymous_mb()
print(held, anonymous_mb())
"""


def test_stage_ends_give_freed_heap_memory_back():
    """Blocks freed inside the heap count as the process's memory until a stage ends and hands their
    pages back (in a process of its own: the allocator's settings are process-wide)."""
    import subprocess
    import sys

    from diversity_order.runtime import _malloc_trim

    if _malloc_trim() is None or not Path("/proc/self/status").exists():
        pytest.skip("needs glibc's malloc_trim and /proc")
    done = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent)
    held, after = map(int, done.stdout.split())
    assert held > 150 and after < held - 100, (held, after)


def _spin(seconds: float) -> None:
    import time

    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_stages_side_by_side_overlap_and_count_their_own_threads_cpu():
    import time

    from diversity_order.runtime import StageTimer, side_by_side

    timer = StageTimer()

    spans = {}

    def stage(name, cpu, sleep):
        with timer.stage(name):
            started = time.perf_counter()
            _spin(cpu)
            time.sleep(sleep)
            spans[name] = (started, time.perf_counter())

    side_by_side(timer, (stage, "a", 0.2, 0.6), (stage, "b", 0.05, 0.6))
    # Ran at once: each began before the other ended (not a wall-time bound, which a loaded machine breaks).
    assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1], spans
    assert timer.beside == {"a", "b"}
    assert 0.18 < timer.cpu_seconds["a"] < 0.5 and timer.cpu_seconds["b"] < 0.2  # each its own thread's CPU
    with timer.stage("c"):  # a stage of the calling thread afterwards: the process's CPU, not marked
        _spin(0.05)
    assert "c" not in timer.beside


def test_an_error_beside_other_stages_is_raised_at_once():
    import threading
    import time

    from diversity_order.errors import UserError
    from diversity_order.runtime import StageTimer, side_by_side

    never = threading.Event()

    def fails():
        time.sleep(0.1)
        raise UserError("in.jsonl:3: this record changed since the input was indexed")

    started = time.perf_counter()
    with pytest.raises(UserError, match="in.jsonl:3"):
        side_by_side(StageTimer(), (never.wait, 60), (fails,))
    assert time.perf_counter() - started < 5


def test_the_last_stages_side_by_side_write_what_they_write_one_after_another(tmp_path, data, tiny_model_dir,
                                                                              monkeypatch):
    """Large inputs run the statistics, the curated file and the cluster descriptions in threads: the
    same files as one after another (forced here on a small input), and the metadata says so. Smaller
    ones run only the sampled similarity beside k-means."""
    from diversity_order import curate as curate_module

    one_by_one = tmp_path / "a.jsonl"
    assert curate("--input", data, "--output", one_by_one, "--model-dir", tiny_model_dir, "--n-clusters", 6) == 0
    monkeypatch.setattr(curate_module, "SIDE_BY_SIDE_ROWS", 1)
    beside = tmp_path / "b.jsonl"
    assert curate("--input", data, "--output", beside, "--model-dir", tiny_model_dir, "--n-clusters", 6) == 0
    first, second = _outputs(one_by_one), _outputs(beside)
    assert _same(first[:3], second[:3])
    assert first[3]["stages_side_by_side"] == ["Clustering (MiniBatchKMeans, k=6)", "Similarity statistics"]
    assert second[3]["stages_side_by_side"] == sorted(["Diversity statistics", "Similarity statistics",
                                                       "Describing the clusters", "Writing the curated data"])
    for key in ("token_window_diversity", "similarity_stats", "ordering_quality", "cluster_sizes"):
        assert first[3][key] == second[3][key]
    assert (tmp_path / "a_clusters.json").read_text().replace("a.jsonl", "") == \
        (tmp_path / "b_clusters.json").read_text().replace("b.jsonl", "")


@pytest.mark.parametrize("args,said", [
    (["--ordering", "stratifed"], "invalid choice: 'stratifed' (choose from "),
    (["--no-plots"], "unrecognized arguments: --no-plots; did you mean --no-plot? (see --help)"),
    (["--seq-lenn", "5"], "unrecognized arguments: --seq-lenn; did you mean --seq-len? (see --help)"),
    # A flag's first letters are no longer taken for it (--compare ran --compare-strategies).
    (["--compare"], "unrecognized arguments: --compare; did you mean --compare-strategies? (see --help)"),
    (["--output-shard", "2"], "unrecognized arguments: --output-shard; did you mean --output-shards?"),
])
def test_a_misspelt_flag_or_choice_suggests_the_nearest(tmp_path, data, args, said, capsys):
    with pytest.raises(SystemExit) as exited:
        curate("--input", data, "--output", tmp_path / "o.jsonl", *args)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err and err.count("\n") == 1
    if args[0] == "--ordering":
        assert err.endswith("'saw'); did you mean stratified? (see --help)\n")


@pytest.mark.parametrize("flag,given,meant", [
    ("--count-special-tokens", "eso", "eos"),  # two letters swapped in a short word
    ("--packing", "spilt", "split"),
    ("--ordering", "baalnced", "balanced"),
    # Another case, a common short name, the metadata's name for the default, the first letters (a reviewer's).
    ("--count-special-tokens", "EOS", "eos"),
    ("--embedding-dtype", "fp16", "float16"),
    ("--score-order", "desc", "descending"),
    ("--ordering", "stratified_greedy", "stratified"),
    ("--output-format", "parq", "parquet"),
])
def test_a_choice_with_letters_swapped_suggests_it(tmp_path, data, flag, given, meant, capsys):
    with pytest.raises(SystemExit):
        curate("--input", data, "--output", tmp_path / "o.jsonl", flag, given)
    assert capsys.readouterr().err.endswith(f"; did you mean {meant}? (see --help)\n")


def test_edits_apart_counts_as_a_plain_search_does():
    """Checked against a breadth-first search over single edits (insert, delete, replace, swap neighbours)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from diversity_order.cli import _edits_apart

    def one_edit(word, letters):
        for i in range(len(word) + 1):
            yield from (word[:i] + c + word[i:] for c in letters)
            if i < len(word):
                yield word[:i] + word[i + 1:]
                yield from (word[:i] + c + word[i + 1:] for c in letters)
            if i + 1 < len(word):
                yield word[:i] + word[i + 1] + word[i] + word[i + 2:]

    @settings(max_examples=150, deadline=None)
    @given(st.text("abc", max_size=4), st.text("abc", max_size=4))
    def check(a, b):
        reached, frontier, distance = {a}, {a}, 0
        while b not in reached and distance < 3:
            frontier = {w for word in frontier for w in one_edit(word, "abc")} - reached
            reached |= frontier
            distance += 1
        plain = distance if b in reached else 3
        found = _edits_apart(a, b)
        # Each letter is edited once at most, so a swap then an insert between the two ('ca' -> 'abc') counts 3;
        # never fewer than the search finds, and the same for words one edit apart.
        assert found >= plain and (found == plain or plain >= 2)
    check()
    assert _edits_apart("ca", "abc") == 3 and _edits_apart("eso", "eos") == 1


def test_a_misspelt_flag_is_said_before_the_flag_it_left_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        curate("--inptu", tmp_path / "x.jsonl", "--output", tmp_path / "o.jsonl")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "unrecognized arguments: --inptu; did you mean --input?" in err
    assert "required" not in err


def test_a_choice_like_none_suggests_nothing(tmp_path, data, capsys):
    with pytest.raises(SystemExit):
        curate("--input", data, "--output", tmp_path / "o.jsonl", "--ordering", "zzz")
    assert "did you mean" not in capsys.readouterr().err
