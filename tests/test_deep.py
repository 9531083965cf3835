"""Deep embeddings (extract_deep_embeddings.py / diversity_order.deep) on a tiny random Llama."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import topical_records, write_jsonl
from diversity_order import deep
from diversity_order.cli import run_main
from diversity_order.deep import model as deep_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import extract_deep_embeddings  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deep_data")
    records = topical_records(per_topic=6, seed=3, long_every=4)
    records.insert(5, {"text": "", "topic": "empty", "id": "empty"})
    return write_jsonl(folder / "data.jsonl", records), records


def _config(data_path, output, model_dir, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("dtype", "float32")
    kw.setdefault("device", "cpu")
    kw.setdefault("token_budget", 2048)
    kw.setdefault("batch_size", 8)
    return deep.DeepConfig(input=data_path, output=output, model_dir=model_dir, **kw)


@pytest.fixture(scope="module")
def reference(data, tiny_model_dir):
    """One document at a time through the plain HF model: mean of last_hidden_state, normalised."""
    from transformers import AutoModel, AutoTokenizer

    _, records = data
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModel.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    rows = []
    with torch.inference_mode():
        for record in records:
            # Truncated to the model's context, the default --max-seq-len (one record is longer).
            ids = tok.encode(record["text"], add_special_tokens=False)[: model.config.max_position_embeddings]
            if not ids:
                rows.append(np.zeros(model.config.hidden_size, dtype=np.float32))
                continue
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
            rows.append(torch.nn.functional.normalize(hidden.mean(0), dim=0).numpy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def baseline(data, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("deep_base") / "emb.npy"
    deep.extract(_config(data[0], out, tiny_model_dir))
    return out


@pytest.fixture(scope="module")
def baseline_bs2(data, tiny_model_dir, tmp_path_factory):
    """An uninterrupted run with the settings the resume tests use (byte equality needs the
    same batches: a different batch shape changes float rounding in the last bits)."""
    out = tmp_path_factory.mktemp("deep_base2") / "emb.npy"
    deep.extract(_config(data[0], out, tiny_model_dir, batch_size=2))
    return out


def _cosines(a, b):
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def _check_against_reference(emb, reference, skip=()):
    assert emb.dtype == np.float32 and emb.shape == reference.shape
    nonzero = np.linalg.norm(reference, axis=1) > 0
    keep = nonzero.copy()
    keep[list(skip)] = False
    assert (_cosines(emb[keep], reference[keep]) > 0.9999).all()
    np.testing.assert_allclose(np.linalg.norm(emb[keep], axis=1), 1.0, atol=1e-5)
    assert (emb[~nonzero] == 0).all()  # the empty document: zero vector


def test_batched_matches_one_at_a_time(baseline, reference):
    emb = np.load(baseline)
    _check_against_reference(emb, reference)
    assert not deep.skipped_path(baseline).exists()
    assert not list(baseline.parent.glob("*.partial*"))


def test_reverse_and_batch_size_do_not_change_results(data, tiny_model_dir, baseline, tmp_path):
    out = tmp_path / "rev.npy"
    deep.extract(_config(data[0], out, tiny_model_dir, reverse=True, batch_size=3))
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-5)


def test_batch_size_defaults_by_device_kind_and_a_given_one_wins():
    from diversity_order.deep.batches import batch_size_for
    from diversity_order.deep.config import CPU_BATCH_SIZE, GPU_BATCH_SIZE

    unset = deep.DeepConfig(input=Path("x"), output=Path("y"), model_dir=Path("m"))
    assert unset.batch_size is None
    assert batch_size_for(unset, torch.device("cpu")) == CPU_BATCH_SIZE
    assert batch_size_for(unset, torch.device("cuda", 0)) == GPU_BATCH_SIZE  # a device object needs no GPU
    given = deep.DeepConfig(input=Path("x"), output=Path("y"), model_dir=Path("m"), batch_size=7)
    assert batch_size_for(given, torch.device("cpu")) == batch_size_for(given, torch.device("cuda", 0)) == 7


def test_cli_defaults_are_the_configs():
    """The script's flags left out give DeepConfig's own defaults (each default written once)."""
    from diversity_order.cli.extract_deep_embeddings import parse_args

    args = vars(parse_args(["--input", "in.jsonl", "--output", "out.npy", "--model-dir", "m"]))
    config = deep.DeepConfig(input=Path("x"), output=Path("y"), model_dir=Path("m"))
    for name in ("batch_size", "device", "gpu", "dtype", "tp", "max_tokens", "max_seq_len", "limit", "token_budget",
                 "checkpoint_docs", "checkpoint_seconds", "attn_implementation", "reverse"):
        assert args[name] == getattr(config, name), name


def test_the_batch_log_line_names_the_batch_size(data, tiny_model_dir, tmp_path, caplog):
    caplog.set_level("INFO", logger="diversity_order.deep")
    deep.extract(_config(data[0], tmp_path / "e.npy", tiny_model_dir, batch_size=None))
    assert any(f"at most {deep.config.CPU_BATCH_SIZE} documents" in r.getMessage() for r in caplog.records)


def _oom_when(predicate):
    def forward(model, input_ids, attention_mask):
        if predicate(input_ids, attention_mask):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB (injected)")
        return deep.default_forward(model, input_ids, attention_mask)
    return forward


def test_oom_on_big_batches_still_computes_every_row(data, tiny_model_dir, reference, tmp_path):
    out = tmp_path / "emb.npy"
    calls = []
    forward = _oom_when(lambda ids, mask: calls.append(ids.shape[0]) or ids.shape[0] > 2)
    result = deep.extract(_config(data[0], out, tiny_model_dir, token_budget=100000), forward=forward)
    assert result.skipped == []
    assert max(calls) > 2  # it did hit the injected OOM and backed off
    _check_against_reference(np.load(out), reference)


def test_oom_on_a_single_document_skips_it(data, tiny_model_dir, reference, tmp_path):
    out = tmp_path / "emb.npy"
    from transformers import AutoTokenizer

    victim = 7
    ids = AutoTokenizer.from_pretrained(str(tiny_model_dir)).encode(data[1][victim]["text"], add_special_tokens=False)
    victim_len, prefix = len(ids), torch.tensor(ids[:16])

    def has_victim(input_ids, mask):  # any batch holding the victim runs out of memory
        return any(int(m.sum()) == victim_len and torch.equal(row[:16], prefix) for row, m in zip(input_ids, mask))

    forward = _oom_when(has_victim)
    result = deep.extract(_config(data[0], out, tiny_model_dir), forward=forward)
    emb = np.load(out)
    assert np.isnan(emb[victim]).all()
    assert np.isfinite(np.delete(emb, victim, axis=0)).all()
    sidecar = json.loads(deep.skipped_path(out).read_text())
    assert sidecar["skipped"] == [{"index": victim, "tokens": victim_len}]
    assert result.skipped == [(victim, victim_len)]
    _check_against_reference(emb, reference, skip=[victim])


def test_non_oom_errors_propagate(data, tiny_model_dir, tmp_path):
    def forward(model, ids, mask):
        raise RuntimeError("something else")
    with pytest.raises(RuntimeError, match="something else"):
        deep.extract(_config(data[0], tmp_path / "e.npy", tiny_model_dir), forward=forward)


def test_resume_after_interrupt_equals_uninterrupted(data, tiny_model_dir, baseline, baseline_bs2, tmp_path, caplog):
    out = tmp_path / "emb.npy"
    calls = {"n": 0}

    def interrupting(model, ids, mask):
        calls["n"] += 1
        if calls["n"] > 6:
            raise KeyboardInterrupt
        return deep.default_forward(model, ids, mask)

    config = _config(data[0], out, tiny_model_dir, batch_size=2, checkpoint_docs=4)
    with pytest.raises(KeyboardInterrupt):
        deep.extract(config, forward=interrupting)
    assert not out.exists()
    done = np.load(out.parent / "emb.npy.partial.done.npy")
    assert 0 < done.sum() < done.size
    # said as it stops (a new user saw only "interrupted"; the count came from the rerun)
    assert f"Interrupted: {int(done.sum())} of {done.size} rows of this share are checkpointed" in caplog.text

    computed = []

    def counting(model, ids, mask):
        computed.append(ids.shape[0])
        return deep.default_forward(model, ids, mask)

    result = deep.extract(_config(data[0], out, tiny_model_dir, batch_size=2, checkpoint_docs=4), forward=counting)
    assert sum(computed) == result.docs == done.size - int(done.sum())
    assert out.read_bytes() == baseline_bs2.read_bytes()
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-6)
    assert not list(tmp_path.glob("*.partial*"))

    # A complete output: nothing to do.
    again = deep.extract(_config(data[0], out, tiny_model_dir), forward=_oom_when(lambda *a: True))
    assert again.nothing_to_do


def _interrupting_after(calls: int):
    seen = {"n": 0}

    def forward(model, ids, mask):
        seen["n"] += 1
        if seen["n"] > calls:
            raise KeyboardInterrupt
        return deep.default_forward(model, ids, mask)
    return forward


def test_a_run_killed_twice_loses_no_checkpointed_row(data, tiny_model_dir, baseline, tmp_path, caplog):
    """The first rerun takes up the checkpoint's rows into OUTPUT.resumed.npz; killed too, it leaves that file and
    its own checkpoint, and the third run computes only what neither holds. Nothing is left beside the output."""
    import logging

    out = tmp_path / "emb.npy"
    config = dict(batch_size=2, checkpoint_docs=2)
    with pytest.raises(KeyboardInterrupt):
        deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=_interrupting_after(4))
    first = int(np.load(tmp_path / "emb.npy.partial.done.npy").sum())
    with pytest.raises(KeyboardInterrupt), caplog.at_level(logging.INFO):
        deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=_interrupting_after(4))
    assert f"Resuming: {first} of 37 rows to compute were finished by an interrupted run (emb.npy.partial.json)" \
        in caplog.text
    with np.load(tmp_path / "emb.npy.resumed.npz") as held:
        assert held["rows"].size == first
    second = int(np.load(tmp_path / "emb.npy.partial.done.npy").sum())
    assert second > 0 and not out.exists()
    computed = []

    def counting(model, ids, mask):
        computed.append(ids.shape[0])
        return deep.default_forward(model, ids, mask)

    caplog.clear()
    with caplog.at_level(logging.INFO):
        result = deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=counting)
    assert f"Resuming: {first + second} of 37 rows to compute were finished by an interrupted run " \
           "(emb.npy.resumed.npz and 1 more)" in caplog.text
    empty = 1  # the empty record is done without the model, in the first run's first checkpoint
    assert sum(computed) == result.docs == 37 - (first + second - empty) - empty
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-5)
    assert not list(tmp_path.glob("*.partial*")) and not list(tmp_path.glob("*.resumed*"))


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_damaged_resumed_file_is_removed_with_a_warning(data, tiny_model_dir, baseline_bs2, tmp_path, caplog,
                                                           damage):
    """A truncated or empty OUTPUT.resumed.npz (a full disk, a copy cut short) was a zipfile or EOF traceback on
    every later run. Now it is named, removed, and its rows computed again."""
    out = tmp_path / "emb.npy"
    config = dict(batch_size=2, checkpoint_docs=2)
    with pytest.raises(KeyboardInterrupt):
        deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=_interrupting_after(4))
    with pytest.raises(KeyboardInterrupt):
        deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=_interrupting_after(1))
    resumed = tmp_path / "emb.npy.resumed.npz"
    body = resumed.read_bytes()
    resumed.write_bytes(body[: len(body) // 2] if damage == "truncated" else b"")
    deep.extract(_config(data[0], out, tiny_model_dir, **config))
    assert "emb.npy.resumed.npz: damaged; removed, and the rows it held are computed again" in caplog.text
    np.testing.assert_allclose(np.load(out), np.load(baseline_bs2), atol=1e-5)
    assert not list(tmp_path.glob("*.partial*")) and not list(tmp_path.glob("*.resumed*"))


def test_leftovers_of_other_work_or_a_finished_output_are_removed(data, tiny_model_dir, baseline, tmp_path, caplog):
    """Checkpoints of other data written by another launch (rank files, under one process) were neither taken up
    nor removed, without a word; and a run killed after writing the output left its checkpoints and resumed file,
    which a later recompute (the output deleted) took up. Both are removed now, and said."""
    import logging

    out = tmp_path / "emb.npy"
    with pytest.raises(KeyboardInterrupt):
        deep.extract(_config(data[0], out, tiny_model_dir, batch_size=2, checkpoint_docs=2),
                     forward=_interrupting_after(3))
    for name in [p.name for p in tmp_path.glob("emb.npy.partial*")]:  # as another launch's, of other data
        (tmp_path / name).rename(tmp_path / name.replace("emb.npy.partial", "emb.npy.rank1.partial"))
    key = tmp_path / "emb.npy.rank1.partial.json"
    key.write_text(json.dumps(json.loads(key.read_text()) | {"data": "other"}))
    with caplog.at_level(logging.INFO):
        deep.extract(_config(data[0], out, tiny_model_dir))
    assert "emb.npy.rank1.partial.json: checkpoint for other data, model or settings; removed, starting over" \
        in caplog.text
    assert "Resuming" not in caplog.text
    assert not list(tmp_path.glob("*.partial*"))
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-5)

    # Killed between writing the output and removing its leftovers: the next run, with nothing to do, removes them.
    (tmp_path / "emb.npy.partial.json").write_text("{}")
    np.savez(tmp_path / "emb.npy.resumed.npz", key=np.asarray("{}"), rows=np.arange(2), data=np.zeros((2, 4)))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert deep.extract(_config(data[0], out, tiny_model_dir)).nothing_to_do
    assert "Removed what an interrupted run left beside emb.npy (emb.npy.partial.json, emb.npy.resumed.npz)" \
        in caplog.text
    assert not list(tmp_path.glob("*.partial*")) and not list(tmp_path.glob("*.resumed*"))


def test_a_resumed_file_of_the_wrong_shape_or_unremovable_leftovers_are_no_traceback(data, tiny_model_dir,
                                                                                       baseline_bs2, tmp_path, caplog):
    """A resumed file whose vectors are of another width, or fewer than its rows, was taken up: an IndexError
    traceback, or an output of the wrong width written as finished. It is damaged now: removed, its rows computed
    again. A leftover that cannot be removed (a folder under its name) is warned of, where it was a traceback."""
    out = tmp_path / "emb.npy"
    config = dict(batch_size=2, checkpoint_docs=2)
    resumed = tmp_path / "emb.npy.resumed.npz"
    for damage in ("width", "fewer"):
        with pytest.raises(KeyboardInterrupt):
            deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=_interrupting_after(4))
        with pytest.raises(KeyboardInterrupt):
            deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=_interrupting_after(1))
        with np.load(resumed) as held:
            kept = dict(held)
        kept["data"] = kept["data"][:, :10] if damage == "width" else kept["data"][:1]
        np.savez(resumed, **kept)
        for path in tmp_path.glob("emb.npy.partial*"):  # the resumed file alone holds the rows
            path.unlink()
        caplog.clear()
        deep.extract(_config(data[0], out, tiny_model_dir, **config))
        assert "emb.npy.resumed.npz: damaged; removed, and the rows it held are computed again" in caplog.text
        np.testing.assert_allclose(np.load(out), np.load(baseline_bs2), atol=1e-5)
        assert not list(tmp_path.glob("*.partial*")) and not resumed.exists()
        out.unlink()
    resumed.mkdir()
    caplog.clear()
    deep.extract(_config(data[0], out, tiny_model_dir, **config))
    assert f"{resumed}: cannot remove it" in caplog.text
    np.testing.assert_allclose(np.load(out), np.load(baseline_bs2), atol=1e-5)


def test_another_launchs_checkpoint_without_rows_is_removed_once_the_output_is_written(data, tiny_model_dir, baseline,
                                                                                        tmp_path, caplog):
    """A torchrun run killed before its first checkpoint leaves its ranks' keys and reserved rows files (gigabytes
    on a real run), which no other launch takes up; a run in one process that finished the work left them."""
    import logging

    out = tmp_path / "emb.npy"
    with pytest.raises(KeyboardInterrupt):
        deep.extract(_config(data[0], out, tiny_model_dir), forward=_interrupt_after(0))
    assert not (tmp_path / "emb.npy.partial.done.npy").exists()
    for path in list(tmp_path.glob("emb.npy.partial*")):  # as a rank's of another launch
        path.rename(tmp_path / path.name.replace("emb.npy.partial", "emb.npy.rank1.partial"))
    with caplog.at_level(logging.INFO):
        deep.extract(_config(data[0], out, tiny_model_dir))
    assert "Removed the checkpoints another launch left beside emb.npy (emb.npy.rank1.partial.json)" in caplog.text
    assert not list(tmp_path.glob("*.partial*"))
    assert out.read_bytes() == baseline.read_bytes()


@pytest.mark.parametrize("held", [b"", "npz"])
def test_an_empty_output_or_an_npz_under_its_name_is_computed_again(data, tiny_model_dir, baseline, tmp_path, held):
    """A 0-byte OUTPUT (a copy cut short) or an .npz saved under its .npy name: an EOFError or AttributeError
    traceback. Nothing there to keep: the rows are computed."""
    out = tmp_path / "emb.npy"
    if held == "npz":
        with open(out, "wb") as handle:
            np.savez(handle, a=np.zeros(3))
    else:
        out.write_bytes(held)
    deep.extract(_config(data[0], out, tiny_model_dir))
    assert out.read_bytes() == baseline.read_bytes()


def test_checkpoints_of_another_launch_are_taken_up(data, tiny_model_dir, baseline, tmp_path):
    """One process killed, the rerun under torchrun (2 ranks, other shares); then the reverse: each rerun computes
    only the rows the checkpoints lack (a rerun in another launch computed every row again and left the
    checkpoint files behind)."""
    out = tmp_path / "emb.npy"
    config = dict(batch_size=2, checkpoint_docs=2)
    with pytest.raises(KeyboardInterrupt):
        deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=_interrupting_after(5))
    done = int(np.load(tmp_path / "emb.npy.partial.done.npy").sum())
    script = tmp_path / "run.py"
    script.write_text(f"""
import logging, os, signal, sys, time
from pathlib import Path
from diversity_order import deep
logging.basicConfig(level=logging.INFO)
kill_after = int(sys.argv[1])
calls = [0]
def forward(model, ids, mask):
    calls[0] += 1
    if kill_after and os.environ["RANK"] == "1" and calls[0] > kill_after:
        deadline = time.monotonic() + 60  # once rank 0 has checkpointed too
        while not Path({str(tmp_path / "emb.npy.rank0.partial.done.npy")!r}).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    return deep.default_forward(model, ids, mask)
result = deep.extract(deep.DeepConfig(input={str(data[0])!r}, output={str(out)!r}, model_dir={str(tiny_model_dir)!r},
                      device="cpu", dtype="float32", token_budget=2048, batch_size=2, checkpoint_docs=2,
                      progress=False), forward=forward)
if os.environ["RANK"] == "0":
    print(f"computed {{result.docs}}", flush=True)
""")
    ran = _torchrun(2, [script, "0"])
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"Resuming: {done} of 37 rows to compute were finished by an interrupted run (emb.npy.partial.json)" \
        in ran.stderr
    assert f"computed {37 - done}" in ran.stdout  # (the empty record was among the checkpointed rows)
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-5)
    assert not list(tmp_path.glob("*.partial*")) and not list(tmp_path.glob("*.resumed*"))

    out.unlink()
    killed = _torchrun(2, [script, "3"])
    assert killed.returncode != 0 and not out.exists()
    masks = sorted(tmp_path.glob("emb.npy.rank*.partial.done.npy"))
    held = sum(int(np.load(path).sum()) for path in masks)
    assert masks and held > 0
    computed = []

    def counting(model, ids, mask):
        computed.append(ids.shape[0])
        return deep.default_forward(model, ids, mask)

    result = deep.extract(_config(data[0], out, tiny_model_dir, **config), forward=counting)
    assert sum(computed) == result.docs == 37 - held
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-5)
    assert not list(tmp_path.glob("*.partial*")) and not list(tmp_path.glob("*.resumed*"))


def test_checkpoint_for_other_data_is_discarded(data, tiny_model_dir, baseline, tmp_path, caplog):
    out = tmp_path / "emb.npy"
    (tmp_path / "emb.npy.partial.json").write_text(json.dumps({"version": 1, "data": "other"}))
    np.save(tmp_path / "emb.npy.partial.npy", np.ones((3, 32), dtype=np.float32))
    np.save(tmp_path / "emb.npy.partial.done.npy", np.ones(3, dtype=bool))
    deep.extract(_config(data[0], out, tiny_model_dir))
    assert out.read_bytes() == baseline.read_bytes()
    assert "starting over" in caplog.text


def test_real_kill_then_resume(data, tiny_model_dir, baseline_bs2, tmp_path):
    """A process SIGKILLed mid-run (no cleanup at all) resumes from its last checkpoint."""
    out = tmp_path / "emb.npy"
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from diversity_order import deep
calls = [0]
def forward(model, ids, mask):
    calls[0] += 1
    if calls[0] > 8:
        os.kill(os.getpid(), signal.SIGKILL)
    return deep.default_forward(model, ids, mask)
deep.extract(deep.DeepConfig(input={str(data[0])!r}, output={str(out)!r}, model_dir={str(tiny_model_dir)!r},
             device="cpu", dtype="float32", token_budget=2048, batch_size=2, checkpoint_docs=3, progress=False),
             forward=forward)
"""
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == -9  # killed by SIGKILL
    assert (tmp_path / "emb.npy.partial.done.npy").exists() and not out.exists()
    assert run_main(extract_deep_embeddings.main, [
        "--input", str(data[0]), "--output", str(out), "--model-dir", str(tiny_model_dir), "--device", "cpu",
        "--dtype", "float32", "--token-budget", "2048", "--batch-size", "2", "--no-progress"]) == 0
    assert out.read_bytes() == baseline_bs2.read_bytes()
    assert not list(tmp_path.glob("*.partial*"))


def test_limit_and_truncation(data, tiny_model_dir, reference, tmp_path):
    out = tmp_path / "emb.npy"
    deep.extract(_config(data[0], out, tiny_model_dir, limit=10))
    emb = np.load(out)
    assert emb.shape == (10, 32)
    _check_against_reference(emb, reference[:10])

    short = tmp_path / "short.npy"
    deep.extract(_config(data[0], short, tiny_model_dir, max_tokens=5))
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModel.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    ids = tok.encode(data[1][0]["text"], add_special_tokens=False)[:5]
    with torch.inference_mode():
        expected = torch.nn.functional.normalize(model(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0), dim=0)
    assert _cosines(np.load(short)[:1], expected.numpy()[None])[0] > 0.9999


def test_feeds_curate_dataset(data, tiny_model_dir, baseline, tmp_path):
    import curate_dataset

    curated = tmp_path / "curated.jsonl"
    rc = run_main(curate_dataset.main, [
        "--input", str(data[0]), "--output", str(curated), "--model-dir", str(tiny_model_dir),
        "--load-embeddings", str(baseline), "--pca-components", "8", "--n-clusters", "4", "--seq-len", "2048",
        "--no-plot", "--no-progress", "--device", "cpu"])
    assert rc == 0
    lines = curated.read_text().splitlines()
    assert sorted(lines) == sorted(data[0].read_text().splitlines())


def test_a_read_only_output_folder_is_refused_unless_the_output_is_complete(data, tiny_model_dir, tmp_path, capsys,
                                                                             monkeypatch, caplog):
    """A folder this run cannot write in is one line before any work; but where the output there already holds
    every row there is nothing to write, and the run says so (it was refused: folder not writable)."""
    import tempfile

    locked = tmp_path / "locked"
    out = locked / "e.npy"
    base = ["--input", str(data[0]), "--model-dir", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32",
            "--no-progress"]
    assert run_main(extract_deep_embeddings.main, base + ["--output", str(out)]) == 0
    real = tempfile.NamedTemporaryFile

    def refuse(*args, **kwargs):  # (the tests may run as root, which ignores permissions: the refusal simulated)
        if str(kwargs.get("dir", "")).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    capsys.readouterr()
    with caplog.at_level("INFO"):
        assert run_main(extract_deep_embeddings.main, base + ["--output", str(out)]) == 0
    assert "already holds all 37 rows: nothing to do" in caplog.text
    assert run_main(extract_deep_embeddings.main, base + ["--output", str(locked / "new.npy")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --output {locked / 'new.npy'}: folder not writable (Permission denied)")
    (tmp_path / "more.jsonl").write_text(data[0].read_text() + json.dumps({"text": "one more record"}) + "\n")
    more = ["--input", str(tmp_path / "more.jsonl"), *base[2:], "--output", str(out)]
    assert run_main(extract_deep_embeddings.main, more) == 2  # a row to compute: refused before the model loads
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --output {out}: folder not writable (Permission denied)")


def test_user_errors(data, tiny_model_dir, tmp_path, capsys):
    base = ["--input", str(data[0]), "--output", str(tmp_path / "e.npy"), "--device", "cpu", "--no-progress"]
    assert run_main(extract_deep_embeddings.main, base + ["--model-dir", str(tmp_path / "missing")]) == 2
    assert "folder not found" in capsys.readouterr().err
    # A GGUF file, or a folder of one: the converter command, as curate gives it (a reviewer got "folder not found")
    (tmp_path / "gg").mkdir()
    (tmp_path / "gg" / "m.gguf").write_bytes(b"GGUF" + bytes(64))
    for given in (tmp_path / "gg" / "m.gguf", tmp_path / "gg"):
        assert run_main(extract_deep_embeddings.main, base + ["--model-dir", str(given)]) == 2
        assert "convert it with: python -m diversity_order.demo_data model OUT_DIR --gguf" in capsys.readouterr().err

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    assert run_main(extract_deep_embeddings.main, base + ["--model-dir", str(broken)]) == 2
    assert "--model-dir" in capsys.readouterr().err

    assert run_main(extract_deep_embeddings.main, base + ["--model-dir", str(tiny_model_dir), "--tp", "2"]) == 2
    assert "torchrun" in capsys.readouterr().err
    # The tiny model has 2 attention heads: --tp 3 cannot split them, whatever the launcher.
    assert run_main(extract_deep_embeddings.main, base + ["--model-dir", str(tiny_model_dir), "--tp", "3"]) == 2
    assert "2 attention heads and 2 key/value heads; tensor parallel needs a --tp that divides both (e.g. --tp 2)" \
        in capsys.readouterr().err

    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad_out = ["--input", str(data[0]), "--output", str(blocker / "e.npy"), "--model-dir", str(tiny_model_dir)]
    assert run_main(extract_deep_embeddings.main, bad_out) == 2
    assert "--output" in capsys.readouterr().err


# The torchrun runs here are CPU runs (--device cpu; --tp with --device cpu is refused where a GPU is visible).
CPU_RUN_ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}


def test_torchrun_data_parallel_matches_single_process(data, tiny_model_dir, baseline, tmp_path):
    out = tmp_path / "dp.npy"
    env = {**os.environ, **CPU_RUN_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(ROOT / "extract_deep_embeddings.py"), "--input", str(data[0]), "--output", str(out),
         "--model-dir", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--token-budget", "2048",
         "--batch-size", "8", "--checkpoint-docs", "5", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-6)
    assert not list(tmp_path.glob("*.partial*"))


def test_torchrun_tensor_parallel_matches_single_process(data, tiny_model_dir, baseline, tmp_path):
    out = tmp_path / "tp.npy"
    env = {**os.environ, **CPU_RUN_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(ROOT / "extract_deep_embeddings.py"), "--input", str(data[0]), "--output", str(out), "--tp", "2",
         "--model-dir", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--token-budget", "2048",
         "--batch-size", "8", "--limit", "20", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(np.load(out), np.load(baseline)[:20], atol=1e-5)
    assert not list(tmp_path.glob("*.partial*"))


def _torchrun(nproc, args, timeout=300):
    env = {**os.environ, **CPU_RUN_ENV}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)


# Data parallel x tensor parallel needs transformers' mesh builder (5.23 has it, 5.17 not; there the run
# refuses before loading, as test_data_parallel_x_tensor_parallel_on_a_transformers_that_cannot_... checks).
needs_mesh_builder = pytest.mark.skipif(
    deep_model._mesh_builder()[1] is None,
    reason="this transformers has no mesh builder: data parallel x tensor parallel is refused")


@needs_mesh_builder
def test_torchrun_data_parallel_x_tensor_parallel_matches_single_process(data, tiny_model_dir, baseline, reference,
                                                                          tmp_path):
    """4 processes with --tp 2: two data-parallel groups, each holding the model split over 2 ranks."""
    out = tmp_path / "dptp.npy"
    proc = _torchrun(4, [
        ROOT / "extract_deep_embeddings.py", "--input", data[0], "--output", out, "--tp", "2",
        "--model-dir", tiny_model_dir, "--device", "cpu", "--dtype", "float32", "--token-budget", "2048",
        "--batch-size", "8", "--checkpoint-docs", "3", "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 processes: 2 data-parallel groups x tensor parallel 2" in proc.stderr
    emb = np.load(out)
    _check_against_reference(emb, reference)
    np.testing.assert_allclose(emb, np.load(baseline), atol=1e-5)
    assert not list(tmp_path.glob("*.partial*"))


@needs_mesh_builder
def test_torchrun_data_parallel_x_tensor_parallel_resumes_after_kill(data, tiny_model_dir, baseline, tmp_path):
    """Rank 0 SIGKILLed mid-run (torchrun then stops the others): each group's leader has
    checkpointed its own share, and the rerun computes only the rows not yet done. Every rank
    also reports the ranks its weights are sharded over: its own group's two, not all four."""
    out = tmp_path / "emb.npy"
    script = tmp_path / "run.py"
    script.write_text(f"""
import logging, os, signal, sys, time
from pathlib import Path
from diversity_order import deep
logging.basicConfig(level=logging.INFO)
kill_after = int(sys.argv[1])
calls = [0]
seen = Path({str(tmp_path)!r})
def forward(model, ids, mask):
    calls[0] += 1
    if calls[0] == 1:
        mesh = model.layers[0].self_attn.q_proj.weight.device_mesh
        print(f"rank {{os.environ['RANK']}} sharded over {{sorted(mesh.mesh.flatten().tolist())}}", flush=True)
        (seen / f"seen{{os.environ['RANK']}}").touch()
    if kill_after and os.environ["RANK"] == "0" and calls[0] > kill_after:
        # Let every rank report its sharding first (the other group runs independently of this one).
        deadline = time.monotonic() + 60
        while not all((seen / f"seen{{r}}").exists() for r in range(4)) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    return deep.default_forward(model, ids, mask)
result = deep.extract(deep.DeepConfig(input={str(data[0])!r}, output={str(out)!r}, model_dir={str(tiny_model_dir)!r},
                      device="cpu", dtype="float32", tp=2, token_budget=2048, batch_size=2, checkpoint_docs=2,
                      progress=False), forward=forward)
if os.environ["RANK"] == "0":
    print(f"computed {{result.docs}}", flush=True)
""")
    killed = _torchrun(4, [script, "3"])
    assert killed.returncode != 0 and not out.exists()
    for rank, group in ((0, [0, 1]), (1, [0, 1]), (2, [2, 3]), (3, [2, 3])):
        assert f"rank {rank} sharded over {group}" in killed.stdout
    # Files per data-parallel group (rank0 = group 0, rank1 = group 1), written by its first rank.
    done_masks = [np.load(path) for path in sorted(tmp_path.glob("emb.npy.rank*.partial.done.npy"))]
    assert not list(tmp_path.glob("emb.npy.rank[23].partial*"))
    done0 = np.load(tmp_path / "emb.npy.rank0.partial.done.npy")
    assert 0 < done0.sum() < done0.size

    resumed = _torchrun(4, [script, "0"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # Every non-empty document not already done is computed once (the empty one is done in group 0's mask).
    n_docs = len(data[1]) - 1
    assert f"computed {n_docs - (sum(int(m.sum()) for m in done_masks) - 1)}" in resumed.stdout
    assert re.search(r"Resuming: \d+ of 37 rows to compute were finished by an interrupted run "
                     r"\(emb\.npy\.rank0\.partial\.json and 1 more\)", resumed.stderr)
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-5)
    assert not list(tmp_path.glob("*.partial*"))


def test_tp_needs_a_multiple_of_the_process_count(data, tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    base = ["--input", str(data[0]), "--output", str(tmp_path / "e.npy"), "--model-dir", str(tiny_model_dir),
            "--device", "cpu", "--no-progress", "--tp", "2"]
    assert run_main(extract_deep_embeddings.main, base) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == ["error: --tp 2 under torchrun with 3 processes: the process count must be a multiple of --tp "
                      "(data-parallel groups of 2 tensor-parallel ranks); use --nproc_per_node=2 or --nproc_per_node=4"]
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert run_main(extract_deep_embeddings.main, base) == 2
    assert "torchrun --nproc_per_node=2" in capsys.readouterr().err


def test_tp_on_cpu_where_a_gpu_is_visible_is_refused(data, tiny_model_dir, tmp_path, capsys, monkeypatch):
    # transformers shards on the accelerator it finds, whatever --device says: on one GPU rank 1 then
    # failed with "CUDA error: invalid device ordinal" (seen on an H200 machine).
    from diversity_order import runtime

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(runtime, "resolve_device", lambda device, gpu: "cuda:0" if device == "auto" else device)
    base = ["--input", str(data[0]), "--output", str(tmp_path / "e.npy"), "--model-dir", str(tiny_model_dir),
            "--no-progress", "--tp", "2"]
    assert run_main(extract_deep_embeddings.main, base + ["--device", "cpu"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--tp 2 with --device cpu on a machine with a GPU" in errors[0]
    assert "CUDA_VISIBLE_DEVICES=" in errors[0]


def test_data_parallel_x_tensor_parallel_on_a_transformers_that_cannot_is_one_line_before_loading(
        tiny_model_dir, monkeypatch):
    # transformers 5.17 (seen on a GPU machine) has no mesh builder to hand our mesh to, and failed inside
    # from_pretrained with "tp_size (2) * fsdp_size (1) is not equal to world_size (4)".
    from transformers.distributed import mixin

    from diversity_order.deep import model as deep_model
    from diversity_order.errors import UserError

    class Dimension:
        def size(self):
            return 2

    monkeypatch.delattr(mixin, "initialize_distributed_mesh", raising=False)
    monkeypatch.setattr("transformers.AutoModel.from_pretrained",
                        lambda *a, **k: pytest.fail("loaded though this transformers cannot shard so"))
    with pytest.raises(UserError, match=r"--tp 2: transformers .* cannot shard a model over part of the processes.*"
                                        r"--nproc_per_node=2"):
        deep_model.load_model(tiny_model_dir, None, "cpu", True, mesh={"tp": Dimension(), "dp": Dimension()})


# ----------------------------------------------------------------------------- incremental reruns

def _counting_forward(log_rows):
    def forward(model, ids, mask):
        log_rows.extend(int(m.sum()) for m in mask)  # one entry per document, its token count
        return deep.default_forward(model, ids, mask)
    return forward


@pytest.fixture
def encode_spy(monkeypatch):
    """Texts passed to the tokenizer (deep extraction tokenizes only through encode_batch)."""
    from diversity_order.tokenizer import DocumentTokenizer

    texts = []
    original = DocumentTokenizer.encode_batch

    def spy(self, batch):
        texts.extend(batch)
        return original(self, batch)

    monkeypatch.setattr(DocumentTokenizer, "encode_batch", spy)
    return texts


def test_appended_records_compute_only_those(data, tiny_model_dir, baseline, tmp_path, encode_spy, caplog):
    records = data[1]
    path = write_jsonl(tmp_path / "d.jsonl", records[:-4])
    out = tmp_path / "emb.npy"
    deep.extract(_config(path, out, tiny_model_dir))
    assert len(encode_spy) == len(records) - 4  # every document tokenized exactly once
    assert (tmp_path / "emb.fingerprints.npy").exists() and (tmp_path / "emb.cache.json").exists()

    write_jsonl(path, records)
    encode_spy.clear()
    rows = []
    caplog.set_level("INFO")
    result = deep.extract(_config(path, out, tiny_model_dir), forward=_counting_forward(rows))
    assert len(rows) == result.docs == 4
    assert encode_spy == [r["text"] for r in records[-4:]]  # tokens of the old rows: not needed, not redone
    assert f"{len(records) - 4} of {len(records)} rows reused, 4 to compute" in caplog.text
    np.testing.assert_allclose(np.load(out), np.load(baseline), atol=1e-6)


def test_edited_record_recomputes_only_it(data, tiny_model_dir, baseline, tmp_path):
    records = [dict(r) for r in data[1]]
    path = write_jsonl(tmp_path / "d.jsonl", records)
    out = tmp_path / "emb.npy"
    deep.extract(_config(path, out, tiny_model_dir))

    records[3]["text"] += " and one more sentence about something else entirely"
    write_jsonl(path, records)
    rows = []
    deep.extract(_config(path, out, tiny_model_dir), forward=_counting_forward(rows))
    assert len(rows) == 1
    emb, base = np.load(out), np.load(baseline)
    np.testing.assert_allclose(np.delete(emb, 3, axis=0), np.delete(base, 3, axis=0), atol=1e-6)
    assert _cosines(emb[3:4], base[3:4])[0] < 0.99999  # really recomputed
    fresh = tmp_path / "fresh.npy"
    deep.extract(_config(path, fresh, tiny_model_dir))
    np.testing.assert_allclose(emb, np.load(fresh), atol=1e-6)


def test_reordered_input_recomputes_nothing(data, tiny_model_dir, baseline, tmp_path, encode_spy):
    records = data[1]
    path = write_jsonl(tmp_path / "d.jsonl", records)
    out = tmp_path / "emb.npy"
    deep.extract(_config(path, out, tiny_model_dir))
    perm = np.random.default_rng(0).permutation(len(records))
    write_jsonl(path, [records[i] for i in perm])
    encode_spy.clear()
    result = deep.extract(_config(path, out, tiny_model_dir), forward=_oom_when(lambda *a: True))
    assert result.docs == 0 and not encode_spy
    np.testing.assert_array_equal(np.load(out), np.load(baseline)[perm])
    # ... and the rewritten sidecars follow the new order: a further rerun has nothing to do.
    assert deep.extract(_config(path, out, tiny_model_dir), forward=_oom_when(lambda *a: True)).nothing_to_do


def test_token_cache_reused_and_key_changes(data, tiny_model_dir, baseline, tmp_path, encode_spy, caplog):
    out = tmp_path / "emb.npy"
    n = len(data[1])

    def interrupt(model, ids, mask):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        deep.extract(_config(data[0], out, tiny_model_dir), forward=interrupt)
    assert len(encode_spy) == n
    assert (tmp_path / "emb.npy.tokens.json").exists()

    # The rerun takes every document's tokens from the cache.
    encode_spy.clear()
    deep.extract(_config(data[0], out, tiny_model_dir))
    assert encode_spy == []
    assert out.read_bytes() == baseline.read_bytes()

    # Another dtype: every row recomputed (and said why); the tokens are still reused.
    caplog.set_level("INFO")
    rows = []
    deep.extract(_config(data[0], out, tiny_model_dir, dtype="bfloat16"), forward=_counting_forward(rows))
    assert len(rows) == n - 1 and encode_spy == []  # all but the empty record
    assert "different dtype" in caplog.text

    # Another truncation: the token cache does not match, everything is tokenized again.
    deep.extract(_config(data[0], tmp_path / "short.npy", tiny_model_dir, max_tokens=5))
    encode_spy.clear()
    deep.extract(_config(data[0], out, tiny_model_dir, max_tokens=5))
    assert len(encode_spy) == n


def test_output_without_sidecars_is_recomputed(data, tiny_model_dir, baseline, tmp_path, caplog):
    out = tmp_path / "emb.npy"
    out.write_bytes(baseline.read_bytes())  # e.g. written by the reference: no fingerprints
    rows = []
    deep.extract(_config(data[0], out, tiny_model_dir), forward=_counting_forward(rows))
    assert len(rows) == len(data[1]) - 1
    assert "no fingerprints" in caplog.text
    assert out.read_bytes() == baseline.read_bytes()


def test_attention_implementation_is_passed_through(data, tiny_model_dir, reference, tmp_path):
    out = tmp_path / "eager.npy"
    assert run_main(extract_deep_embeddings.main, [
        "--input", str(data[0]), "--output", str(out), "--model-dir", str(tiny_model_dir), "--device", "cpu",
        "--dtype", "float32", "--attn-implementation", "eager", "--no-progress"]) == 0
    _check_against_reference(np.load(out), reference)


def test_a_model_that_reads_no_tokens_is_refused(data, tiny_model_dir, tmp_path, capsys):
    from transformers import ViTConfig, ViTModel

    vit = tmp_path / "vit"
    ViTModel(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                       image_size=8, patch_size=4)).save_pretrained(vit)
    # With a tokenizer beside it the run gets as far as loading the model, which must be refused.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (vit / name).write_bytes((tiny_model_dir / name).read_bytes())
    code = run_main(extract_deep_embeddings.main, ["--input", str(data[0]), "--output", str(tmp_path / "v.npy"),
                                                   "--model-dir", str(vit), "--device", "cpu", "--no-progress"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1
    assert "ViTModel is not a text model (no token-embedding table)" in errors[0]


def test_progress_lines_in_logs_without_a_bar(data, tiny_model_dir, tmp_path, caplog, monkeypatch):
    # No bar is drawn (--no-progress / a log file): a line with rates, ETA and memory replaces it.
    caplog.set_level("INFO")
    monkeypatch.setenv("DIVERSITY_ORDER_PROGRESS_SECONDS", "0")
    deep.extract(_config(data[0], tmp_path / "emb.npy", tiny_model_dir, batch_size=4))
    lines = [r.getMessage() for r in caplog.records if " documents (" in r.getMessage()]
    assert len(lines) >= 2
    assert all("docs/s" in line and "tokens/s" in line and "ETA" in line and "peak RSS" in line for line in lines)
    runs = len(data[1]) - 1  # the empty document gets its defined result without a forward pass
    assert lines[-1].startswith(f"Deep embeddings: {runs} of {runs} documents (100%)")


def test_last_line_gives_the_batches_own_rate_beside_the_whole_runs(data, tiny_model_dir, tmp_path, caplog):
    # On a GPU start-up outlasted the batches (an H200: 11.3 s in all, about 2 s of batches), so the
    # whole run's rate alone undersold the model's throughput.
    import re

    caplog.set_level("INFO")
    result = deep.extract(_config(data[0], tmp_path / "emb.npy", tiny_model_dir, batch_size=4))
    assert 0 < result.batch_seconds <= result.seconds and result.batch_tokens == result.tokens > 0
    last = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Deep embeddings: ")][-1]
    rate = re.search(r"the batches alone: ([0-9.]+) s, ([0-9,]+) tokens/s", last)
    assert rate, last
    assert float(rate.group(1)) == round(result.batch_seconds, 1)
    assert int(rate.group(2).replace(",", "")) == round(result.batch_tokens / result.batch_seconds)


def test_finished_run_removes_temp_files_of_killed_checkpoint_writes(data, tiny_model_dir, baseline, tmp_path):
    # A process killed while writing a checkpoint leaves its temp file; the run that finishes the
    # work removes it with the partials (it was never trusted: its name is not the checkpoint's).
    out = tmp_path / "emb.npy"
    stray = tmp_path / ".emb.npy.partial.done.npy.abc123.tmp"
    stray.write_bytes(b"half")
    unrelated = tmp_path / ".other.npy.abc123.tmp"
    unrelated.write_bytes(b"not ours")
    deep.extract(_config(data[0], out, tiny_model_dir))
    assert out.read_bytes() == baseline.read_bytes()
    assert not stray.exists() and unrelated.exists()


# ----------------------------------------------------------------------------- model fingerprint

def _same_size_weight_change(model_dir):
    """Change one weight of ``model_dir``'s safetensors in place: same names, shapes and file size."""
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    size = path.stat().st_size
    tensors = load_file(path)
    name = next(n for n in sorted(tensors) if n.endswith("mlp.down_proj.weight"))
    tensors[name][0, 0] += 0.5
    save_file(tensors, path, metadata={"format": "pt"})
    assert path.stat().st_size == size


def test_changed_weights_of_the_same_size_recompute_every_row(data, tiny_model_dir, tmp_path, caplog):
    # A fine-tune has the same file names and sizes as its base: only the content tells them apart.
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "emb.npy"
    deep.extract(_config(data[0], out, model))
    before = np.load(out)
    _same_size_weight_change(model)
    rows = []
    caplog.set_level("INFO")
    result = deep.extract(_config(data[0], out, model), forward=_counting_forward(rows))
    assert not result.nothing_to_do and len(rows) == result.docs == len(data[1]) - 1  # all but the empty record
    assert "computed with a different model; its rows are not reused" in caplog.text
    assert not np.allclose(np.load(out)[1:], before[1:], atol=1e-4)  # the new weights' vectors


def _hub_snapshot(tmp_path, model_dir):
    """``model_dir`` laid out as a Hugging Face hub cache: snapshots/<rev>/NAME -> ../../blobs/<hash>."""
    import hashlib
    import shutil

    repo = tmp_path / "hub" / "models--tiny"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "0123abc"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(model_dir.iterdir()):
        content = path.read_bytes()
        # LFS files are named by their sha256, small git files by a 40-digit git hash.
        name = hashlib.sha256(content).hexdigest() if path.suffix == ".safetensors" else \
            hashlib.sha1(content).hexdigest()
        shutil.copyfile(path, blobs / name)
        (snapshot / path.name).symlink_to(Path("..") / ".." / "blobs" / name)
    return snapshot


def test_fingerprint_reads_no_weights_a_hub_cache_names_and_sees_a_blob_changed_through_its_link(
        tiny_model_dir, tmp_path, monkeypatch):
    from diversity_order.deep import model as model_module

    snapshot = _hub_snapshot(tmp_path, tiny_model_dir)
    read = []
    original = model_module._sha256
    monkeypatch.setattr(model_module, "_sha256", lambda path: read.append(path.name) or original(path))
    plain = model_module.model_fingerprint(tiny_model_dir)
    assert "model.safetensors" in read
    read.clear()
    # The same content keys the same rows, whether used from the cache or from a plain copy.
    assert model_module.model_fingerprint(snapshot) == plain
    assert "model.safetensors" not in read and "config.json" in read

    # Weights written through the link (torch.save, an in-place edit) change the blob, which keeps
    # its name but is now newer than its link: the name is no longer trusted, the content is hashed.
    import shutil

    scratch = tmp_path / "scratch"
    shutil.copytree(tiny_model_dir, scratch)
    _same_size_weight_change(scratch)
    link = snapshot / "model.safetensors"
    link.write_bytes((scratch / "model.safetensors").read_bytes())
    assert link.is_symlink()
    blob = link.resolve()
    link_mtime = os.lstat(link).st_mtime_ns
    os.utime(blob, ns=(link_mtime + 10**9, link_mtime + 10**9))  # filesystems with coarse clocks
    read.clear()
    assert model_module.model_fingerprint(snapshot) != plain
    assert "model.safetensors" in read


# ----------------------------------------------------------------------------- checkpoints

def _mask_writes(monkeypatch):
    """The done count of every checkpoint written (the mask is the last file a checkpoint writes)."""
    from diversity_order.deep import checkpoint as checkpoint_module

    counts = []
    original = checkpoint_module.save_npy

    def spy(path, array):
        if str(path).endswith(".partial.done.npy"):
            counts.append(int(np.asarray(array).sum()))
        return original(path, array)

    monkeypatch.setattr(checkpoint_module, "save_npy", spy)
    return counts


def _expected_checkpoints(batches, every_docs, every_seconds, already_done):
    """Done counts at each checkpoint by the rule: after the batch that brings the documents since the
    last checkpoint to ``every_docs`` or the seconds (1 per batch here) to ``every_seconds``, whichever
    first; then one at the end for the rows since. Returns the counts and which rule fired."""
    counts, rules, since, clock, last, done = [], set(), 0, 0.0, 0.0, already_done
    for size in batches:
        since, clock, done = since + size, clock + 1.0, done + size
        if since >= every_docs or clock - last >= every_seconds:
            counts.append(done)
            rules.add("docs" if since >= every_docs else "seconds")
            since, last = 0, clock
    if not counts or counts[-1] != done:
        counts.append(done)
    return counts, rules


@pytest.mark.parametrize("every_docs, every_seconds", [(5, float("inf")), (5, 3.5)])
def test_checkpoints_every_checkpoint_docs_or_seconds_whichever_first_and_no_more(
        data, tiny_model_dir, baseline_bs2, tmp_path, monkeypatch, every_docs, every_seconds):
    from diversity_order.deep import batches as batches_module

    clock = [0.0]
    monkeypatch.setattr(batches_module, "monotonic", lambda: clock[0])
    sizes = []

    def forward(model, ids, mask):  # each batch takes one second on the loop's clock
        clock[0] += 1.0
        sizes.append(ids.shape[0])
        return deep.default_forward(model, ids, mask)

    writes = _mask_writes(monkeypatch)
    out = tmp_path / "emb.npy"
    deep.extract(_config(data[0], out, tiny_model_dir, batch_size=2, checkpoint_docs=every_docs,
                         checkpoint_seconds=every_seconds), forward=forward)
    # The empty record is done before the loop: the first checkpoint saves it too.
    expected, rules = _expected_checkpoints(sizes, every_docs, every_seconds, already_done=1)
    assert writes == expected
    assert rules == ({"docs"} if every_seconds == float("inf") else {"docs", "seconds"})  # both rules exercised
    assert out.read_bytes() == baseline_bs2.read_bytes()


def test_checkpoint_intervals_must_be_positive(data, tiny_model_dir, tmp_path, capsys):
    base = ["--input", str(data[0]), "--output", str(tmp_path / "e.npy"), "--model-dir", str(tiny_model_dir),
            "--device", "cpu", "--no-progress"]
    assert run_main(extract_deep_embeddings.main, base + ["--checkpoint-docs", "0"]) == 2
    assert "error: --checkpoint-docs 0: must be at least 1" in capsys.readouterr().err
    assert run_main(extract_deep_embeddings.main, base + ["--checkpoint-seconds", "0"]) == 2
    assert "error: --checkpoint-seconds 0.0: must be more than 0" in capsys.readouterr().err


def test_a_checkpoint_writes_only_the_rows_finished_since_the_last(tmp_path, monkeypatch):
    # Rewriting the whole share at every checkpoint made a long run's checkpoints ever slower
    # (1M rows x 4096 floats: 16 GB per checkpoint).
    from diversity_order.deep import checkpoint as checkpoint_module
    from diversity_order.distributed import DistContext

    written = []

    class Spy:
        def __init__(self, handle):
            self.handle = handle

        def write(self, payload):
            written.append(len(payload))
            return self.handle.write(payload)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

    monkeypatch.setattr(checkpoint_module, "open", lambda *a, **kw: Spy(open(*a, **kw)), raising=False)
    dim, key = 16, {"version": 1, "records": 1000}
    partial = checkpoint_module.Partial(tmp_path / "o.npy", DistContext(), np.arange(1000), dim, key)
    partial.start()
    assert partial.data_path.stat().st_size >= 1000 * dim * 4  # the whole share's room, taken at the start
    rng = np.random.default_rng(0)
    for rows in (np.arange(10), np.asarray([500, 501, 502, 7 + 990, 20]), np.asarray([], dtype=np.int64)):
        written.clear()
        partial.data[rows] = rng.normal(size=(rows.size, dim)).astype(np.float32)
        partial.done[rows] = True
        partial.checkpoint()
        assert sum(written) == rows.size * dim * 4
    assert partial.writes == 2  # nothing new: nothing written

    again = checkpoint_module.Partial(tmp_path / "o.npy", DistContext(), np.arange(1000), dim, key)
    np.testing.assert_array_equal(again.done, partial.done)
    np.testing.assert_array_equal(again.data[again.done], partial.data[partial.done])


def _interrupt_after(calls):
    seen = [0]

    def forward(model, ids, mask):
        seen[0] += 1
        if seen[0] > calls:
            raise KeyboardInterrupt
        return deep.default_forward(model, ids, mask)
    return forward


def test_restart_before_any_checkpoint_is_quiet_and_a_damaged_checkpoint_warns(data, tiny_model_dir, baseline,
                                                                              tmp_path, caplog):
    out = tmp_path / "emb.npy"
    key, rows_file, mask = (tmp_path / f"emb.npy.partial.{s}" for s in ("json", "npy", "done.npy"))
    caplog.set_level("INFO")
    # Stopped at its first batch: the key is written, no checkpoint yet.
    with pytest.raises(KeyboardInterrupt):
        deep.extract(_config(data[0], out, tiny_model_dir), forward=_interrupt_after(0))
    assert key.exists() and not mask.exists()
    rows_file.unlink(missing_ok=True)  # as a run of before this change left it: the key alone
    caplog.clear()
    deep.extract(_config(data[0], out, tiny_model_dir))
    assert out.read_bytes() == baseline.read_bytes()
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "checkpoint" in r.getMessage()]
    assert "no rows checkpointed yet" in caplog.text

    def damage_truncate():
        rows_file.write_bytes(rows_file.read_bytes()[:-100])

    def damage_shape():
        np.save(rows_file, np.ones((3, 32), dtype=np.float32))

    for damage in (damage_truncate, damage_shape):
        out.unlink()
        with pytest.raises(KeyboardInterrupt):
            deep.extract(_config(data[0], out, tiny_model_dir, checkpoint_docs=4), forward=_interrupt_after(3))
        assert mask.exists() and np.load(mask).sum() > 0
        damage()
        caplog.clear()
        rows = []
        deep.extract(_config(data[0], out, tiny_model_dir), forward=_counting_forward(rows))
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "checkpoint" in r.getMessage()]
        assert len(warnings) == 1 and "emb.npy.partial.json: checkpoint damaged; removed, starting over" in warnings[0]
        assert len(rows) == len(data[1]) - 1  # every row computed again
        assert out.read_bytes() == baseline.read_bytes()


def test_disk_full_while_checkpointing_stops_with_one_line_and_the_last_checkpoint_resumes(
        data, tiny_model_dir, baseline_bs2, tmp_path, monkeypatch, capsys):
    import errno

    from diversity_order.deep import checkpoint as checkpoint_module

    out = tmp_path / "emb.npy"
    original = checkpoint_module.save_npy
    writes = [0]

    def full_after_two(path, array):
        writes[0] += 1
        if writes[0] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(path, array)

    monkeypatch.setattr(checkpoint_module, "save_npy", full_after_two)
    args = ["--input", str(data[0]), "--output", str(out), "--model-dir", str(tiny_model_dir), "--device", "cpu",
            "--dtype", "float32", "--token-budget", "2048", "--batch-size", "2", "--checkpoint-docs", "4",
            "--no-progress"]
    assert run_main(extract_deep_embeddings.main, args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    saved = int(np.load(tmp_path / "emb.npy.partial.done.npy").sum())
    assert errors == [f"error: cannot write the checkpoint emb.npy.partial.npy in {tmp_path}: No space left on "
                      f"device; the last checkpoint ({saved} of {len(data[1])} rows) is intact: free space or fix "
                      f"the folder, then rerun to resume"]
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))

    monkeypatch.setattr(checkpoint_module, "save_npy", original)
    rows = []
    result = deep.extract(_config(data[0], out, tiny_model_dir, batch_size=2), forward=_counting_forward(rows))
    assert result.docs == len(rows) == len(data[1]) - saved
    assert out.read_bytes() == baseline_bs2.read_bytes()


def test_no_room_for_the_checkpoint_is_said_before_any_work(data, tiny_model_dir, tmp_path, monkeypatch, caplog):
    import ctypes
    import errno
    from types import SimpleNamespace

    from diversity_order import matrix
    from diversity_order.deep import checkpoint as checkpoint_module
    from diversity_order.errors import UserError

    def full(fd, mode, offset, length):
        ctypes.set_errno(errno.ENOSPC)
        return -1

    monkeypatch.setattr(matrix, "_FALLOCATE", full)
    rows = []
    with pytest.raises(UserError, match=r"cannot create the checkpoint .*emb.npy.partial.npy \(\d+\.\d\d KiB\): No space "
                                        r"left on device; free space or choose another --output folder"):
        deep.extract(_config(data[0], tmp_path / "emb.npy", tiny_model_dir), forward=_counting_forward(rows))
    assert rows == [] and not (tmp_path / "emb.npy.partial.npy").exists()

    monkeypatch.undo()
    monkeypatch.setattr(checkpoint_module.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
    caplog.set_level("INFO")
    deep.extract(_config(data[0], tmp_path / "emb.npy", tiny_model_dir))
    # in a unit that shows the sizes (it read "0.00 GB free, but ... needs 0.00 GB")
    assert re.search(r": 1000 bytes free, but writing the output at the end needs \d+\.\d\d KiB", caplog.text)


def test_sigterm_checkpoints_before_ending(data, tiny_model_dir, baseline_bs2, tmp_path):
    """Slurm preemption, ``timeout`` and ``docker stop`` send SIGTERM: the rows done so far are saved."""
    out = tmp_path / "emb.npy"
    script = f"""
import logging, os, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from diversity_order import deep
logging.basicConfig(level=logging.INFO)
calls = [0]
def forward(model, ids, mask):
    calls[0] += 1
    if calls[0] == 6:
        os.kill(os.getpid(), signal.SIGTERM)
    return deep.default_forward(model, ids, mask)
deep.extract(deep.DeepConfig(input={str(data[0])!r}, output={str(out)!r}, model_dir={str(tiny_model_dir)!r},
             device="cpu", dtype="float32", token_budget=2048, batch_size=2, checkpoint_docs=1000, progress=False),
             forward=forward)
"""
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + 15, proc.stderr[-2000:]
    done = np.load(tmp_path / "emb.npy.partial.done.npy")
    assert done.sum() >= 2 * 5  # the five batches finished before the signal (and the one it interrupted)
    assert "Terminated (SIGTERM)" in proc.stderr and not out.exists()
    rows = []
    result = deep.extract(_config(data[0], out, tiny_model_dir, batch_size=2), forward=_counting_forward(rows))
    assert result.docs == len(data[1]) - int(done.sum())
    assert out.read_bytes() == baseline_bs2.read_bytes()


def test_stderr_to_a_file_says_what_it_does_from_the_start(data, tiny_model_dir, tmp_path):
    """The real script with stderr redirected to a file (nohup, Slurm, CI): no bars, but a line for
    each stage as it starts, the model's loading time, and progress lines with rates, ETA and memory
    from the first batch on."""
    import re

    out, log_file = tmp_path / "emb.npy", tmp_path / "stderr.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DIVERSITY_ORDER_PROGRESS_SECONDS": "0"}
    with open(log_file, "w") as stderr:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "extract_deep_embeddings.py"), "--input", str(data[0]), "--output", str(out),
             "--model-dir", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--token-budget", "2048",
             "--batch-size", "8"], stdout=subprocess.PIPE, stderr=stderr, env=env, timeout=300)
    text = log_file.read_text()
    assert proc.returncode == 0, text[-3000:]
    lines = text.splitlines()

    def first(needle):
        return next(i for i, line in enumerate(lines) if needle in line)

    runs = len(data[1]) - 1
    progress = [i for i, line in enumerate(lines) if re.search(r"Deep embeddings: \d+ of \d+ documents", line)]
    order = [first("Model fingerprint: "), first("Tokenizing: "), first("Loading the model from"),
             first("Model loaded in"), progress[0]]
    assert order == sorted(order), text
    assert re.search(r"Model loaded in \d+\.\d s: LlamaModel, \d+M parameters, hidden size 32", lines[order[3]])
    assert re.search(r"Tokenizing: .* docs/s, .* tokens/s, ETA \d+:\d\d:\d\d, peak RSS", lines[order[1]])
    # The first progress line comes right after the first batch (8 documents at most), not an interval later.
    assert re.search(rf"Deep embeddings: [1-8] of {runs} documents", lines[progress[0]])
    assert len(progress) >= 3 and f"Deep embeddings: {runs} of {runs} documents (100%)" in lines[progress[-1]]
    for i in progress:
        assert re.search(r"docs/s, [\d,]+ tokens/s, ETA \d+:\d\d:\d\d, peak RSS \d+\.\d GiB$", lines[i]), lines[i]
    assert "\r" not in text and "it/s" not in text  # no progress bar drawn into the file
    assert np.load(out).shape == (len(data[1]), 32)


def test_non_finite_hidden_states_are_said(data, tiny_model_dir, tmp_path, caplog):
    # float16 overflows in many models: the NaN rows must not pass unnoticed until curate.
    calls = [0]

    def forward(model, ids, mask):
        hidden = deep.default_forward(model, ids, mask)
        calls[0] += 1
        return hidden * float("nan") if calls[0] == 2 else hidden

    out = tmp_path / "emb.npy"
    deep.extract(_config(data[0], out, tiny_model_dir), forward=forward)
    emb = np.load(out)
    bad = np.flatnonzero(~np.isfinite(emb).all(axis=1))
    assert 0 < bad.size <= 8  # the second batch
    warning = next(r.getMessage() for r in caplog.records if "NaN or inf" in r.getMessage())
    assert warning.startswith(f"{bad.size} document(s) got a vector with NaN or inf") and \
        warning.endswith("records " + ", ".join(map(str, bad)))


def test_torchrun_ranks_must_hash_the_same_model(tiny_model_dir, tmp_path):
    """Each rank hashes its own folder (nodes may hold their own copies); copies that differ are refused."""
    import shutil

    same, other = tmp_path / "same", tmp_path / "other"
    shutil.copytree(tiny_model_dir, same)
    shutil.copytree(tiny_model_dir, other)
    _same_size_weight_change(other)
    script = tmp_path / "fingerprint.py"
    script.write_text(f"""
import os, sys
import torch.distributed as dist
from pathlib import Path
from diversity_order.deep.model import model_fingerprint
from diversity_order.errors import UserError
dist.init_process_group("gloo")
rank = dist.get_rank()
folder = {str(tiny_model_dir)!r} if rank == 0 else sys.argv[1]
try:
    print(f"rank {{rank}} fingerprint {{model_fingerprint(Path(folder))}}", flush=True)
except UserError as exc:
    print(f"rank {{rank}} error {{exc}}", flush=True)
dist.destroy_process_group()
""")
    agree = _torchrun(2, [script, same])
    assert agree.returncode == 0, agree.stderr[-3000:]
    values = {line.split()[-1] for line in agree.stdout.splitlines() if "fingerprint" in line}
    assert len(values) == 1 and len(agree.stdout.splitlines()) == 2
    differ = _torchrun(2, [script, other])
    assert differ.returncode == 0, differ.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} error --model-dir " in differ.stdout
    assert "the model files of ranks [1] differ from rank 0's" in differ.stdout


def test_an_output_that_is_not_a_npy_or_is_an_input_is_refused_before_any_work(data, tiny_model_dir, tmp_path,
                                                                                capsys):
    source = tmp_path / "in.jsonl"
    source.write_bytes(data[0].read_bytes())
    before = source.read_bytes()
    base = ["--model-dir", str(tiny_model_dir), "--device", "cpu", "--no-progress"]
    for output, said in ((source, f"--output {source}: the deep embeddings are a NumPy array; give a name ending in "
                                  ".npy"),
                         (tmp_path / "." / "in.jsonl", "give a name ending in .npy"),
                         (tmp_path / "deep.jsonl", "give a name ending in .npy")):
        code = run_main(extract_deep_embeddings.main, ["--input", str(source), "--output", str(output), *base])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("error: ") and said in err and "\n" not in err, err
    # An input misnamed .npy (a glob among the inputs finds it too) is never written over.
    odd = tmp_path / "odd.npy"
    odd.write_bytes(before)
    for given in (odd, tmp_path / "odd.n?y"):
        code = run_main(extract_deep_embeddings.main, ["--input", str(given), "--output", str(odd), *base])
        assert code == 2 and f"--output {odd} is the input file" in capsys.readouterr().err
    assert source.read_bytes() == before and odd.read_bytes() == before and not (tmp_path / "deep.jsonl").exists()
    # An input named as a file written beside the output (a reviewer's deep.cache.json was overwritten, exit 0).
    for name in ("deep.cache.json", "deep.fingerprints.npy", "deep.npy.partial.json", "deep.npy.tokens.json",
                 "deep.npy.skipped.json", "deep.npy.rank3.partial.json"):
        named = tmp_path / name
        named.write_bytes(before)
        code = run_main(extract_deep_embeddings.main, ["--input", str(named), "--output", str(tmp_path / "deep.npy"),
                                                       *base])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err == f"error: --input {named} is also a file this run writes beside --output " \
                                    f"{tmp_path / 'deep.npy'} (its cache, checkpoint or token cache); choose another " \
                                    "--output", err
        assert named.read_bytes() == before
    inside = tiny_model_dir / "x.npy"  # a new user's: it wrote 7 files into the model folder
    code = run_main(extract_deep_embeddings.main, ["--input", str(source), "--output", str(inside), *base])
    assert code == 2 and f"inside --model-dir {tiny_model_dir}" in capsys.readouterr().err and not inside.exists()


def test_an_output_that_is_a_curate_cache_is_refused_and_kept(data, tiny_model_dir, tmp_path, capsys):
    """Named like curate's embeddings cache (``OUT_embeddings.npy``), the deep rows would have replaced it."""
    from diversity_order import caches

    cache = tmp_path / "c_embeddings.npy"
    rows = np.ones((3, 4), np.float32)
    caches.store(cache, {"kind": "base_model_embed_tokens_mean_pool", "tokenizer": "t"},
                 np.arange(3, dtype=np.uint64), rows)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code = run_main(extract_deep_embeddings.main, ["--input", str(data[0]), "--output", str(cache), "--model-dir",
                                                   str(tiny_model_dir), "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: --output {cache} is a cache of curate_dataset.py's " \
                                "(base_model_embed_tokens_mean_pool); choose another path\n"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_output_that_is_a_curate_runs_labels_order_or_fingerprints_is_refused(data, tiny_model_dir, tmp_path,
                                                                                  capsys):
    """A new user's extraction wrote over c_labels.npy, c_order.npy and c_embeddings.fingerprints.npy."""
    labels, order, fingerprints = tmp_path / "c_labels.npy", tmp_path / "c_order.npy", tmp_path / "c.fingerprints.npy"
    np.save(labels, np.arange(10) % 3)
    np.save(order, np.arange(10)[::-1].copy())
    np.save(fingerprints, np.arange(10, dtype=np.uint64))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for target, said in ((labels, "holds 10 int64 value(s), not embeddings"), (order, "holds 10 int64 value(s)"),
                         (fingerprints, "is a cache's fingerprints file")):
        code = run_main(extract_deep_embeddings.main, ["--input", str(data[0]), "--output", str(target), "--model-dir",
                                                       str(tiny_model_dir), "--device", "cpu", "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"error: --output {target} ") and said in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_conversations_are_extracted_as_the_chat_template_renders_them(tiny_model_dir, tmp_path, caplog):
    import shutil

    from diversity_order.tokenizer import DocumentTokenizer

    chat_model = tmp_path / "chat_model"
    shutil.copytree(tiny_model_dir, chat_model)
    (chat_model / "chat_template.jinja").write_text(
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}")
    chats = [[{"role": "user", "content": r["text"][:40]}, {"role": "assistant", "content": r["text"]}]
             for r in topical_records(per_topic=2)]
    tokenizer = DocumentTokenizer(chat_model)
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in chats])
    write_jsonl(tmp_path / "rendered.jsonl", [{"text": tokenizer.render_chat(c)} for c in chats])
    caplog.set_level("INFO")
    common = ["--model-dir", str(chat_model), "--device", "cpu", "--dtype", "float32", "--no-progress"]
    assert run_main(extract_deep_embeddings.main, ["--input", str(tmp_path / "chat.jsonl"), "--text-field",
                                                   "messages", "--output", str(tmp_path / "c.npy"), *common]) == 0
    assert "Conversations in 'messages': each rendered with the chat template of" in caplog.text
    assert str(chat_model / "chat_template.jinja") in caplog.text
    assert run_main(extract_deep_embeddings.main, ["--input", str(tmp_path / "rendered.jsonl"), "--output",
                                                   str(tmp_path / "r.npy"), *common]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), np.load(tmp_path / "r.npy"), rtol=1e-5, atol=1e-6)
