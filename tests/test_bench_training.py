"""benchmarks/bench_training.py: the packing and boundary statistics, and a --quick run end to end."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from conftest import topical_records, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = Path(os.environ.get("DIVERSITY_ORDER_SMOLLM2", ROOT / "demo" / "SmolLM2-135M"))


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_training", ROOT / "benchmarks" / "bench_training.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def test_pack_cuts_the_eos_separated_stream_into_windows_in_order():
    documents = [np.array([10, 11, 12]), np.array([20]), np.array([30, 31, 32, 33])]
    windows, labels = bench.pack(documents, np.array([0, 1, 2]), np.array([2, 0, 1]), eos=9, seq_len=4)
    # Stream: 30 31 32 33 9 | 10 11 12 9 | 20 9 -> two full windows, the partial tail dropped.
    assert windows.tolist() == [[30, 31, 32, 33], [9, 10, 11, 12]]
    assert labels.tolist() == [[2, 2, 2, 2], [2, 0, 0, 0]]


def test_select_documents_keeps_runs_spread_over_the_file_and_holds_out_from_them():
    counts = np.full(1000, 10)
    train, heldout = bench.select_documents(counts, train_tokens=800, heldout_tokens=200, n_blocks=4, seed=0)
    assert np.intersect1d(train, heldout).size == 0
    assert counts[heldout].sum() >= 200 and abs(counts[train].sum() + counts[heldout].sum() - 1000) <= 4 * 10
    chosen = np.union1d(train, heldout)
    # Four runs of consecutive records starting at 0, 250, 500, 750.
    starts = chosen[np.flatnonzero(np.diff(chosen, prepend=-2) != 1)]
    assert starts.tolist() == [0, 250, 500, 750]
    # A file smaller than the budget is used whole.
    train, heldout = bench.select_documents(np.full(50, 10), 10_000, 100, 4, seed=0)
    assert np.union1d(train, heldout).tolist() == list(range(50))


def test_boundary_stats_and_spread_measure_the_jump_and_the_swings():
    per_epoch, k = 40, 5
    losses = np.full(2 * per_epoch, 3.0)
    losses[per_epoch:per_epoch + k] = 4.0  # a spike right after the loader wraps
    norms = np.ones(2 * per_epoch)
    norms[per_epoch:per_epoch + k] = 4.0
    stats = bench.boundary_stats(losses, norms, per_epoch, k)
    assert stats["loss_jump"] == pytest.approx(1.0)
    assert stats["grad_norm_ratio"] == pytest.approx(4.0)
    # A straight declining line has no spread; alternating steps have.
    assert bench.loss_spread(np.linspace(5, 3, 60), half_window=3) == pytest.approx(0.0, abs=1e-12)
    assert bench.loss_spread(3 + 0.5 * (-1.0) ** np.arange(60), half_window=3) > 0.4


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10_000), st.integers(0, 12))
def test_jumps_everywhere_and_boundary_rank_match_a_plain_loop(k, seed, extra):
    rng = np.random.default_rng(seed)
    per_epoch = 2 * k + extra + 1
    losses = rng.normal(5, 1, 2 * per_epoch)
    norms = rng.uniform(0.5, 2, 2 * per_epoch)
    jumps, ratios = bench.jumps_everywhere(losses, norms, k)
    expected = [(losses[t:t + k].mean() - losses[t - k:t].mean(), norms[t:t + k].mean() / norms[t - k:t].mean())
                for t in range(k, losses.size - k + 1)]
    assert np.allclose(np.column_stack([jumps, ratios]), expected)
    # At the boundary they are boundary_stats' numbers.
    stats = bench.boundary_stats(losses, norms, per_epoch, k)
    assert jumps[per_epoch - k] == pytest.approx(stats["loss_jump"])
    assert ratios[per_epoch - k] == pytest.approx(stats["grad_norm_ratio"])
    # The rank: the share of steps t at least k from the boundary whose jump is smaller.
    others = [t for t in range(k, losses.size - k + 1) if abs(t - per_epoch) >= k]
    rank = bench.boundary_rank(losses, norms, per_epoch, k)
    assert rank["loss_jump_rank"] == pytest.approx(np.mean([expected[t - k][0] < stats["loss_jump"] for t in others]))
    assert rank["grad_norm_ratio_rank"] == pytest.approx(
        np.mean([expected[t - k][1] < stats["grad_norm_ratio"] for t in others]))


def test_boundary_rank_is_one_for_the_largest_jump_of_the_run():
    per_epoch, k = 50, 4
    losses = 3 + 0.1 * np.sin(np.arange(2 * per_epoch))
    losses[per_epoch:per_epoch + k] += 2.0
    norms = np.ones(2 * per_epoch)
    norms[per_epoch:per_epoch + k] = 3.0
    assert bench.boundary_rank(losses, norms, per_epoch, k) == {"loss_jump_rank": 1.0, "grad_norm_ratio_rank": 1.0}


def test_heldout_wobble_is_the_scatter_around_the_runs_own_line():
    rng = np.random.default_rng(1)
    steps = np.arange(0, 161, 16)
    noise = rng.normal(0, 0.05, steps.size)
    heldout = [[int(s), 6 - 0.004 * s + e] for s, e in zip(steps, noise)]
    late = steps >= 64
    x, y = steps[late], np.array([loss for _, loss in heldout])[late]
    design = np.column_stack([x, np.ones_like(x)]).astype(float)
    residuals = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    assert bench.heldout_wobble(heldout, 64) == pytest.approx(np.sqrt(residuals @ residuals / (x.size - 2)))
    # A straight line does not wobble; too few evaluations give no number.
    assert bench.heldout_wobble([[s, 5 - 0.01 * s] for s in range(0, 100, 10)], 0) == pytest.approx(0, abs=1e-9)
    assert math.isnan(bench.heldout_wobble(heldout, 150))


def _fake_results(run_seed, rng, orders=("original", "random")):
    table = [{"order": order, **{key: float(rng.normal()) for key, _, _ in bench.SEED_COLUMNS}} for order in orders]
    return {"corpus": {"name": "c", "input": "demo/c.jsonl", "train_docs": 10},
            "settings": {"seq_len": 8, "run_seed": run_seed},
            "table": table}


def test_across_run_seeds_gives_each_statistics_mean_and_standard_deviation():
    rng = np.random.default_rng(0)
    results = [_fake_results(seed, rng) for seed in (0, 1, 2)]
    rows = bench.across_run_seeds(results)
    assert [row["order"] for row in rows] == ["original", "random"]
    for i, row in enumerate(rows):
        for key, _, _ in bench.SEED_COLUMNS:
            values = [result["table"][i][key] for result in results]
            assert row[key]["values"] == values
            assert row[key]["mean"] == pytest.approx(np.mean(values))
            assert row[key]["sd"] == pytest.approx(np.std(values, ddof=1))
    assert bench.seed_markdown_table(rows).count("\n") == 3  # heading, rule, two orders
    # Runs that differ in more than the run seed are not noise of one another.
    other = _fake_results(3, rng)
    other["settings"]["seq_len"] = 16
    with pytest.raises(SystemExit, match="more than --run-seed"):
        bench.across_run_seeds([results[0], other])
    with pytest.raises(SystemExit, match="repeat"):
        bench.across_run_seeds([results[0], _fake_results(0, rng)])


def _finite_numbers(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _finite_numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _finite_numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


@pytest.fixture(params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def model_dir(request, tiny_model_dir):
    if request.param == "tiny":
        return tiny_model_dir
    if not (SMOLLM2 / "config.json").exists():
        pytest.skip(f"SmolLM2 folder not found at {SMOLLM2} (run `make model` or set DIVERSITY_ORDER_SMOLLM2)")
    return SMOLLM2


def test_quick_run_writes_finite_results_and_the_figure(tmp_path, model_dir):
    corpus = write_jsonl(tmp_path / "topics.jsonl", topical_records(per_topic=25))
    out, figure = tmp_path / "results.json", tmp_path / "figure.png"
    # With the real model (slow anyway), the orders train in two spawned processes, as a full run does.
    jobs = ["--jobs", "2"] if model_dir == SMOLLM2 else []
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_training.py"), "--quick", "--input", str(corpus),
         "--model-dir", str(model_dir), "--n-clusters", "6", "--work", str(tmp_path / "work"),
         "--out", str(out), "--figure", str(figure), *jobs],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}, capture_output=True, text=True,
        timeout=1800)  # generous: the shared 2-core machine can be many times slower than idle
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert list(results["runs"]) == ["original", "random", "stratified", "balanced"]
    assert [row["order"] for row in results["table"]] == list(results["runs"])
    assert results["settings"]["jobs"] == (2 if jobs else 1)
    numbers = list(_finite_numbers(results))
    assert numbers and all(math.isfinite(x) for x in numbers)
    per_epoch = results["settings"]["steps_per_epoch"]
    for run in results["runs"].values():
        assert len(run["loss"]) == len(run["grad_norm"]) == 2 * per_epoch
        assert [step for step, _ in run["heldout"]][-1] == 2 * per_epoch
    # The labels came from the pipeline, cached in --work, one per record.
    labels = list((tmp_path / "work").glob("*_labels.npy"))
    assert len(labels) == 1 and np.load(labels[0]).shape == (150,)
    with Image.open(figure) as image:
        assert image.size[0] > 800 and image.size[1] > 600
