"""torchrun with 2 CPU processes (gloo; a GPU machine's GPUs are hidden from them), on one node or two,
gives exactly the single-process result; the pieces of the labels-only path (shared cache file, sampled
fit) against plain computations."""

import json
import logging
import os
import re
import socket
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
from diversity_order import caches, clustering, features, matrix, scale_out
from diversity_order.cli import run_main
from diversity_order.distributed import DistContext, even_range, my_share, slice_of_order, split_by_bytes
from diversity_order.matrix import MatrixFile
from diversity_order.records import scan_jsonl
from diversity_order.writers import shard_slices

ROOT = Path(__file__).resolve().parent.parent


def test_split_by_bytes_is_contiguous_balanced_and_complete():
    rng = np.random.default_rng(0)
    for n, parts in [(1, 1), (5, 2), (100, 3), (1000, 7), (3, 4)]:
        sizes = rng.integers(1, 1000, n)
        bounds = split_by_bytes(sizes, parts)
        assert bounds[0] == 0 and bounds[-1] == n and np.all(np.diff(bounds) >= 0)
        if n >= parts * 10:
            shares = [sizes[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])]
            assert max(shares) - min(shares) <= 2 * sizes.max()
    rows = np.arange(10) * 3
    shares = [my_share(DistContext(r, 3), rows, np.ones(10)) for r in range(3)]
    assert np.concatenate(shares).tolist() == rows.tolist()


def torchrun(args, nproc=2, fails=False):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "curate_dataset.py", *map(str, args), "--no-progress"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert (done.returncode != 0) == fails, done.stderr[-4000:]
    return done.stderr


def test_torchrun_two_cpu_ranks_equals_single_process(tmp_path, tiny_model_dir, monkeypatch):
    """Cold: each rank indexes and embeds its own records (no cache, none registered), and the
    result is the single process's byte for byte."""
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")  # no registered cache: every record is embedded
    records = topical_records(per_topic=25, long_every=7)
    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        folder.mkdir()
        write_jsonl(folder / "d.jsonl", records)
    common = ["--model-dir", tiny_model_dir, "--device", "cpu", "--n-clusters", 6, "--seq-len", 2000, "--no-plot"]
    assert run_main(curate_dataset.main, [str(a) for a in ["--input", single / "d.jsonl", "--output",
                                                           single / "c.jsonl", *common, "--no-progress"]]) == 0
    log = torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.jsonl", *common])
    assert log.count("Token counts and embeddings (2 ranks) done") == 1  # every rank times it; only rank 0 logs
    assert "Embedding 150 record(s) of 150 on 2 ranks" in log and "Rank 0 of 2: " in log
    assert log.count("Joining the process group (2 processes, gloo, rendezvous ") == 1  # before it waits
    assert "Indexing d.jsonl (this rank's part): " in log  # rank 0's progress is of its part, not the file
    for name in ["c.jsonl", "c_embeddings.npy", "d_token_counts.npy", "c_labels.npy", "c_order.npy"]:
        assert (multi / name).read_bytes() == (single / name).read_bytes(), name

    # Counting only (precomputed embeddings, no count cache yet) is split across ranks too.
    (multi / "d_token_counts.cache.json").unlink()
    np.save(tmp_path / "ext.npy", np.load(single / "c_embeddings.npy"))
    log = torchrun(["--input", multi / "d.jsonl", "--output", multi / "e.jsonl", "--load-embeddings",
                    tmp_path / "ext.npy", *common])
    assert "Token counts (2 ranks) done" in log and "Token counts and embeddings" not in log  # nothing embedded
    assert np.array_equal(np.load(multi / "d_token_counts.npy"), np.load(single / "d_token_counts.npy"))
    assert (multi / "e.jsonl").read_bytes() == (single / "c.jsonl").read_bytes()


def test_records_appended_or_prepended_after_a_run_are_embedded_by_both_ranks(tmp_path, tiny_model_dir, monkeypatch):
    """A rerun after records were appended finds every new record in the last rank's byte range (and
    after records were prepended, in the first's): the ranks hand records over so both embed about
    half, and the result is still a single process's."""
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")
    records = topical_records(per_topic=25, long_every=7)
    single, multi = tmp_path / "single", tmp_path / "multi"
    common = ["--model-dir", tiny_model_dir, "--device", "cpu", "--n-clusters", 6, "--seq-len", 2000, "--no-plot"]
    single.mkdir()
    multi.mkdir()
    write_jsonl(single / "d.jsonl", records)
    assert run_main(curate_dataset.main, [str(a) for a in ["--input", single / "d.jsonl", "--output",
                                                           single / "c.jsonl", *common, "--no-progress"]]) == 0
    write_jsonl(multi / "d.jsonl", records[:60])
    torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.jsonl", *common])
    write_jsonl(multi / "d.jsonl", records)  # 90 records appended: the file's second half and more
    log = torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.jsonl", *common])
    assert "Embedding 90 record(s) of 150 on 2 ranks" in log
    assert "New records handed between ranks" in log
    own = re.search(r"Rank 0 of 2: (\d+) record\(s\)", log)  # without the hand-over rank 0 embeds none
    assert own and 30 <= int(own.group(1)) <= 60, log[-3000:]
    for name in ["c.jsonl", "c_embeddings.npy", "d_token_counts.npy", "c_labels.npy", "c_order.npy"]:
        assert (multi / name).read_bytes() == (single / name).read_bytes(), name

    # The other way: new records at the start lie in rank 0's range, and rank 0 (which holds the whole
    # index) hands some to rank 1 (which holds only its own records) with their index.
    prepended = [dict(r, text=r["text"] + " (second edition)") for r in records[:50]] + records
    for folder in (single, multi):
        write_jsonl(folder / "d.jsonl", prepended)
    assert run_main(curate_dataset.main, [str(a) for a in ["--input", single / "d.jsonl", "--output",
                                                           single / "c.jsonl", *common, "--no-progress"]]) == 0
    log = torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.jsonl", *common])
    assert "Embedding 50 record(s) of 200 on 2 ranks" in log
    assert "New records handed between ranks" in log
    own = re.search(r"Rank 0 of 2: (\d+) record\(s\)", log)
    assert own and 15 <= int(own.group(1)) <= 35, log[-3000:]
    for name in ["c.jsonl", "c_embeddings.npy", "d_token_counts.npy", "c_labels.npy", "c_order.npy"]:
        assert (multi / name).read_bytes() == (single / name).read_bytes(), name


STOPPED_BY_THE_SCHEDULER = """
import os, signal, sys, time
from diversity_order.tokenizer import DocumentTokenizer
real, calls = DocumentTokenizer.encode_texts, []

marker = os.environ["STOP_MARKER"]  # rank 1 has finished a batch: there is something of its own to keep


def stopped_at_the_third_batch(self, texts):
    calls.append(len(texts))
    if len(calls) == 2 and os.environ["RANK"] == "1":
        open(marker, "w").close()
    if len(calls) == 3 and os.environ["RANK"] == "0":
        # Not before rank 1 has a batch done (on a busy machine it had none yet, so kept no file), then a moment
        # for it to record that batch.
        waited = 0.0
        while not os.path.exists(marker) and waited < 120:
            time.sleep(0.05)
            waited += 0.05
        time.sleep(0.5)
        os.kill(os.getppid(), signal.SIGTERM)  # a scheduler stops torchrun, which stops every rank
        time.sleep(60)
    return real(self, texts)

DocumentTokenizer.encode_texts = stopped_at_the_third_batch

from diversity_order import kept_rows
real_start = kept_rows.start

def late_start(*args, **kwargs):  # rank 0 slow to start: the other rank must not have begun (and said) meanwhile
    time.sleep(1)
    real_start(*args, **kwargs)

kept_rows.start = late_start
import curate_dataset
from diversity_order.cli import run_command
sys.exit(run_command(curate_dataset.main))
"""


@pytest.mark.parametrize("rerun", ["torchrun", "one process"])
def test_torchrun_stopped_while_embedding_keeps_every_ranks_rows_for_the_rerun(tmp_path, tiny_model_dir, monkeypatch,
                                                                               caplog, rerun):
    """SIGTERM to torchrun (a scheduler's preemption) while the ranks embed: each rank says what it wrote, rank 0
    keeps the shared file; the rerun (under torchrun or in one process) takes those rows and the counts, embeds only
    the rest, and every file equals an uninterrupted run's. So too for ranks that only count tokens, with
    --load-embeddings or because the vectors are cached and the counts are not."""
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")  # no registered cache: only the kept rows can be reused
    records = topical_records(per_topic=40)
    n = len(records)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for folder in (whole, cut):
        folder.mkdir()
        write_jsonl(folder / "d.jsonl", records)
    common = ["--model-dir", tiny_model_dir, "--device", "cpu", "--n-clusters", 4, "--no-plot", "--no-progress",
              "--embed-batch-size", 8]
    assert run_main(curate_dataset.main, [str(a) for a in ["--input", whole / "d.jsonl", "--output",
                                                           whole / "c.jsonl", *common]]) == 0
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED_BY_THE_SCHEDULER)

    def stopped(args, said):
        marker = tmp_path / "rank1_batch_done"
        marker.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
                   STOP_MARKER=str(marker))
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               str(script), *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode != 0 and f"Terminated (SIGTERM): {said}" in done.stderr, done.stderr[-4000:]

    def rerun_log(args):
        if rerun == "torchrun":
            return torchrun(args)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="diversity_order"):
            assert run_main(curate_dataset.main, [str(a) for a in args]) == 0
        return caplog.text

    args = ["--input", cut / "d.jsonl", "--output", cut / "c.jsonl", *common]
    stopped(args, "the rows the ranks embedded so far are kept in")
    assert not (cut / "c.jsonl").exists() and not (cut / "c_embeddings.npy").exists()
    parts = [np.load(cut / f"c_embeddings.kept.rank{rank}.npz") for rank in (0, 1)]
    kept = sum(part["computed"].size for part in parts)
    assert parts[0]["computed"].size == 16 and kept < n  # rank 0: the two batches before the third
    for part in parts:  # the counts kept are the real ones
        assert np.array_equal(part["counts"], np.load(whole / "d_token_counts.npy")[part["computed"]])
    assert (cut / "c_embeddings.kept.npy").exists() and not list(cut.glob(".c_embeddings.npy.*.tmp"))

    log = rerun_log(args)
    assert f"Embeddings: {kept} of {n} rows kept by an interrupted torchrun run are now c_embeddings.npy" in log
    assert f"Embedding {n - kept} record(s) of {n}" in log
    for name in ["c.jsonl", "c_embeddings.npy", "d_token_counts.npy", "c_labels.npy", "c_order.npy"]:
        assert (cut / name).read_bytes() == (whole / name).read_bytes(), name
    assert not list(cut.glob("c_embeddings.kept*"))

    def counts_stopped_and_rerun(args):
        """Without the count cache, stopped while counting: the rerun counts only what no rank kept."""
        for name in ("d_token_counts.npy", "d_token_counts.cache.json", "d_token_counts.fingerprints.npy"):
            (cut / name).unlink()
        stopped(args, "the token counts the ranks finished so far are kept beside")
        parts = [np.load(cut / f"d_token_counts.kept.rank{rank}.npz") for rank in (0, 1)]
        kept = sum(part["computed"].size for part in parts)
        assert parts[0]["computed"].size == 16 and kept < n and not (cut / "d_token_counts.npy").exists()
        log = rerun_log(args)
        assert f"Token counts: {kept} of {n} rows kept by an interrupted torchrun run are now in d_token_counts.npy" in log
        assert f"Counting tokens of {n - kept} record(s) of {n}" in log
        assert (cut / "d_token_counts.npy").read_bytes() == (whole / "d_token_counts.npy").read_bytes()

    # Only counting (--load-embeddings: the vectors come from elsewhere), stopped the same way: the counts kept.
    np.save(tmp_path / "ext.npy", np.load(whole / "c_embeddings.npy"))
    counts_stopped_and_rerun(["--input", cut / "d.jsonl", "--output", cut / "e.jsonl", "--load-embeddings",
                              tmp_path / "ext.npy", *common])
    assert (cut / "e.jsonl").read_bytes() == (whole / "c.jsonl").read_bytes()
    assert not list(cut.glob("*.kept*"))

    # Counting only because the vectors are cached and the counts are not (the count cache deleted): the same.
    counts_stopped_and_rerun(["--input", cut / "d.jsonl", "--output", cut / "c.jsonl", *common])
    for name in ["c.jsonl", "c_embeddings.npy", "d_token_counts.npy", "c_labels.npy", "c_order.npy"]:
        assert (cut / name).read_bytes() == (whole / name).read_bytes(), name
    assert not list(cut.glob("*.kept*"))


def test_torchrun_counts_the_special_tokens_and_exports_as_one_process_does(tmp_path, tiny_model_dir):
    """Under torchrun --count-special-tokens was left out of the counts (the order and statistics ignored it), and
    --export-packed then stopped: "164 tokens now, 163 when counted". Now ranks order, measure and export as one
    process does."""
    records = topical_records(per_topic=10)
    single, multi = tmp_path / "single", tmp_path / "multi"
    common = ["--model-dir", tiny_model_dir, "--device", "cpu", "--n-clusters", 4, "--no-plot", "--seq-len", 256,
              "--count-special-tokens", "eos", "--packing", "split"]
    for folder in (single, multi):
        folder.mkdir()
        write_jsonl(folder / "d.jsonl", records)
    assert run_main(curate_dataset.main, [str(a) for a in ["--input", single / "d.jsonl", "--output", single / "c.jsonl",
                                                           "--export-packed", single / "packed", *common,
                                                           "--no-progress"]]) == 0
    torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.jsonl", "--export-packed", multi / "packed",
              *common, "--output-shards", 2])
    metas = [json.loads((folder / "c_meta.json").read_text()) for folder in (single, multi)]
    assert metas[0]["total_tokens"] == metas[1]["total_tokens"] == \
        int(np.load(single / "d_token_counts.npy").sum()) + len(records)  # one EOS each
    assert metas[1]["special_tokens_per_document"] == 1
    assert np.array_equal(np.load(single / "c_order.npy"), np.load(multi / "c_order.npy"))
    assert (single / "packed" / "packed-00000-of-00001.parquet").read_bytes() == \
        (multi / "packed" / "packed-00000-of-00001.parquet").read_bytes()


def test_torchrun_ranks_write_their_own_output_shards(tmp_path, tiny_model_dir):
    """--output-shards under torchrun: each rank writes its consecutive parts of the order; the shards
    equal a single process's byte for byte. Converted to Parquet, every shard has the columns of all
    records (one record in 20 has a field of its own), as a single process writes them."""
    import pyarrow.parquet as pq

    records = topical_records(per_topic=10)
    for i in range(0, len(records), 20):
        records[i]["score"] = i / 10
    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        folder.mkdir()
        write_jsonl(folder / "d.jsonl", records)
    # 60 records in 7 shards: cuts at 8.57, 17.14, ... (rounded, not truncated, by one process and by the ranks)
    common = ["--model-dir", tiny_model_dir, "--device", "cpu", "--n-clusters", 4, "--no-plot", "--output-shards", 7]
    assert run_main(curate_dataset.main, [str(a) for a in ["--input", single / "d.jsonl", "--output",
                                                           single / "c.jsonl", *common, "--no-progress"]]) == 0
    log = torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.jsonl", *common])
    assert "Rank 0 wrote c-00000-of-00007.jsonl to c-00002-of-00007.jsonl; the other ranks wrote the rest" in log
    names = sorted(path.name for path in single.glob("c-*-of-*.jsonl"))
    assert len(names) == 7 and names == sorted(path.name for path in multi.glob("c-*-of-*.jsonl"))
    for name in names:
        assert (multi / name).read_bytes() == (single / name).read_bytes(), name
    assert run_main(curate_dataset.main, [str(a) for a in ["--input", single / "d.jsonl", "--output",
                                                           single / "c.parquet", *common, "--no-progress"]]) == 0
    torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.parquet", *common])
    tables = [pq.read_table(multi / name.replace(".jsonl", ".parquet")) for name in names]
    assert all("score" in table.column_names and table.schema == tables[0].schema for table in tables)
    singles = [pq.read_table(single / name.replace(".jsonl", ".parquet")) for name in names]
    assert [table.to_pylist() for table in tables] == [table.to_pylist() for table in singles]
    assert tables[0].schema == singles[0].schema  # the same columns in the same order


STOPPED_AFTER_THE_SHARDS = """
from diversity_order import curate


def stopped(run):
    raise KeyboardInterrupt  # rank 0, once every rank's shards are renamed, before the metadata

curate.describe = stopped
import curate_dataset
from diversity_order.cli import run_command
raise SystemExit(run_command(curate_dataset.main))
"""


def test_torchrun_stopped_after_the_ranks_renamed_their_shards_leaves_them_known(tmp_path, tiny_model_dir):
    """Under torchrun a stop after the ranks renamed their shards, before rank 0's metadata, left a set no
    metadata named (the earlier one was removed first); a later run with another count kept it beside its own,
    every record twice. Rank 0 leaves a stub naming the shards, as one process does."""
    records = topical_records(per_topic=10)
    write_jsonl(tmp_path / "d.jsonl", records)
    common = ["--input", tmp_path / "d.jsonl", "--output", tmp_path / "c.jsonl", "--model-dir", tiny_model_dir,
              "--device", "cpu", "--n-clusters", 4, "--no-plot"]
    torchrun([*common, "--output-shards", 4])
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED_AFTER_THE_SHARDS)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), *map(str, [*common, "--output-shards", 3]), "--no-progress"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    stub = json.loads((tmp_path / "c_meta.json").read_text())
    three = [str(tmp_path / f"c-{i:05d}-of-00003.jsonl") for i in range(3)]
    assert stub["complete"] is False and stub["output_files"] == three
    assert sorted(str(p) for p in tmp_path.glob("c-*")) == three  # the earlier 4 removed once the 3 were in place
    torchrun([*common, "--output-shards", 2])
    assert sorted(p.name for p in tmp_path.glob("c-*")) == [f"c-{i:05d}-of-00002.jsonl" for i in range(2)]
    lines = [line for path in sorted(tmp_path.glob("c-*")) for line in path.read_bytes().splitlines()]
    assert sorted(lines) == sorted((tmp_path / "d.jsonl").read_bytes().splitlines())


def test_torchrun_refuses_records_parquet_cannot_hold_before_embedding(tmp_path, tiny_model_dir):
    """A type clash in records only rank 1 reads, or one between the ranks' records (every value rank 0 reads a
    number, every one rank 1 reads a string), is found when the ranks read their records: rank 0 says it in one
    line naming both records and no rank embeds, whether rank 0 writes the Parquet file alone or the ranks write
    shards."""
    records = topical_records(per_topic=10)
    n = len(records)
    within = [dict(record, e="x" if i == n - 1 else 1) for i, record in enumerate(records)]
    # The ranks split the records by bytes near the middle: the numbers are rank 0's, the strings rank 1's.
    between = [dict(record, **({"e": 1} if i < 5 else {"e": "x"} if i >= n - 5 else {})) for i, record in enumerate(records)]
    # Within rank 1, that rank names its own first number; between the ranks, the first number of all.
    for name, data, clash in (("within", within, rf"field 'e' is a string at {{0}}:{n} but a number at {{0}}:\d+\)"),
                              ("between", between, rf"field 'e' is a string at {{0}}:{n - 4} but a number at {{0}}:1\)")):
        write_jsonl(tmp_path / f"{name}.jsonl", data)
        for shards in (1, 2):
            log = torchrun(["--input", tmp_path / f"{name}.jsonl", "--output", tmp_path / f"s{shards}" / "c.parquet",
                            "--model-dir", tiny_model_dir, "--device", "cpu", "--n-clusters", 4, "--no-plot",
                            "--output-shards", shards], fails=True)
            said = [line for line in log.splitlines() if line.startswith("error: ")]
            assert len(said) == 1 and "[rank 1] error" not in log  # every rank stops; rank 0 says why, once
            assert "cannot be one Parquet table" in said[0] and "--output-format jsonl" in said[0]
            assert re.search(clash.format(re.escape(str(tmp_path / f"{name}.jsonl"))), said[0]), said[0]
            assert "Token counts (2 ranks)" not in log and "Token counts and embeddings" not in log
            assert not list(tmp_path.glob("**/*.npy")) and not list(tmp_path.glob("**/*.parquet"))


def test_torchrun_types_an_unsigned_column_as_one_process_does(tmp_path, tiny_model_dir):
    """A column of 64-bit ids past 2**63 - 1 in rank 1's records only, small ones in rank 0's: every rank's shard is
    unsigned (one schema for the set) and the ids read back exact. A negative id in rank 0's records beside them is
    refused in one line naming both records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = topical_records(per_topic=10)
    n = len(records)
    ids = [i if i < n // 2 else (1 << 64) - 1 - i for i in range(n)]
    write_jsonl(tmp_path / "ids.jsonl", [dict(record, id=ids[i], score=1 if i % 2 else 0.5)
                                         for i, record in enumerate(records)])
    common = ["--model-dir", tiny_model_dir, "--device", "cpu", "--n-clusters", 4, "--no-plot", "--output-shards", 2]
    log = torchrun(["--input", tmp_path / "ids.jsonl", "--output", tmp_path / "ok" / "c.parquet", *common])
    assert log.count("'score' holds integers in some records and fractions in others") == 1  # rank 0's, once
    shards = sorted((tmp_path / "ok").glob("c-*.parquet"))
    assert len(shards) == 2 and all(pq.read_schema(path).field("id").type == pa.uint64() for path in shards)
    assert sorted(v for path in shards for v in pq.read_table(path).column("id").to_pylist()) == sorted(ids)

    write_jsonl(tmp_path / "signed.jsonl", [dict(record, id=-1 if i == 0 else ids[i]) for i, record in enumerate(records)])
    log = torchrun(["--input", tmp_path / "signed.jsonl", "--output", tmp_path / "no" / "c.parquet", *common], fails=True)
    said = [line for line in log.splitlines() if line.startswith("error: ")]
    where = re.escape(str(tmp_path / "signed.jsonl"))
    assert len(said) == 1 and re.search(rf"field 'id' holds an integer past 2\*\*63 - 1 at {where}:{n // 2 + 1} and a "
                                        rf"negative integer at {where}:1: no Parquet integer holds both", said[0]), said


def test_torchrun_calibration_reads_the_shared_file_and_equals_a_single_process(tmp_path, tiny_model_dir):
    """--calibrate-k under torchrun: the ranks embed into the shared cache, rank 0 sweeps k reading it
    (nothing gathered); the table and the recommendation equal a single process's, in and out of core."""
    records = topical_records(per_topic=20, long_every=5)
    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        folder.mkdir()
        write_jsonl(folder / "d.jsonl", records)
    for budget in ([], ["--memory-budget", "4K"]):  # 4K: the sweep fits a sample read from the file
        common = ["--model-dir", tiny_model_dir, "--device", "cpu", "--calibrate-k", "--calibrate-k-samples", 0, *budget]
        assert run_main(curate_dataset.main, [str(a) for a in ["--input", single / "d.jsonl", "--output",
                                                               single / "c.jsonl", *common, "--no-progress"]]) == 0
        log = torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.jsonl", *common])
        assert "Token counts and embeddings (2 ranks)" in log and ("out of core" in log) == bool(budget), log
        ours, theirs = (json.loads((folder / "c_calibration.json").read_text()) for folder in (multi, single))
        assert ours["rows"] == theirs["rows"] and ours["recommended_k"] == theirs["recommended_k"]
        assert (multi / "c_embeddings.npy").read_bytes() == (single / "c_embeddings.npy").read_bytes()


@given(st.integers(0, 200), st.integers(1, 9), st.integers(1, 12))
def test_even_range_and_slices_of_the_order_cover_everything_once(n, world, parts):
    ranges = [even_range(DistContext(r, world), n) for r in range(world)]
    assert [lo for lo, _ in ranges] == [0] + [hi for _, hi in ranges[:-1]] and ranges[-1][1] == n
    assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1
    one_process = shard_slices(n, parts)
    dealt = [piece for r in range(world) for piece in slice_of_order(DistContext(r, world), one_process)]
    assert [part for part, _, _ in dealt] == list(range(parts))  # every part once, in rank order
    # cut where one process cuts its shards (the ranks once truncated where it rounds: 666/667/667 against 667/666/667)
    assert [(lo, hi) for _, lo, hi in dealt] == one_process
    assert [lo for _, lo, _ in dealt] == [0] + [hi for _, _, hi in dealt[:-1]] and dealt[-1][2] == n


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.data())
def test_row_writer_writes_what_an_array_assignment_writes(n, dim, data):
    import tempfile

    expected = np.zeros((n, dim), np.float32)
    with tempfile.TemporaryDirectory() as folder:
        path, offset = scale_out._create_rows_file(Path(folder) / "e.npy", n, dim)
        writer = matrix.RowWriter.open(path, offset, (n, dim), np.float32)
        for _ in range(data.draw(st.integers(0, 4))):
            rows = np.array(data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n)), dtype=np.int64)
            values = np.random.default_rng(len(rows)).normal(size=(rows.size, dim)).astype(np.float32)
            writer[rows] = values
            expected[rows] = values
        writer.close()
        assert np.array_equal(np.load(path), expected)


def _index_and_model(folder, records, tiny_model_dir):
    path = write_jsonl(folder / "d.jsonl", records)
    return scan_jsonl(path, "text", progress=False), features.ModelParts(Path(tiny_model_dir), None)


def test_shared_embeddings_equal_the_single_process_cache_and_reuse_moved_rows(tmp_path, tiny_model_dir, caplog,
                                                                              monkeypatch):
    """One process through the shared-file path: the same counts, vectors and cache files as the
    faithful path, fresh and after records moved, one edited and one added (rows copied from the
    cache); a new output name takes every row from the registered sets; counts alone are counted."""
    records = topical_records(per_topic=8)
    edited = records[::-1] + [{"text": "a brand new record about the oven"}]
    edited[3] = dict(edited[3], text=edited[3]["text"] + " with an edit")
    shared = tmp_path / "shared"
    shared.mkdir()

    def through_shared(recs, name="c"):
        index, model = _index_and_model(shared, recs, tiny_model_dir)
        paths = {"embeddings": shared / f"{name}_embeddings.npy", "token_counts": shared / "d_token_counts.npy"}
        with caplog.at_level(logging.INFO, logger="diversity_order"):
            caplog.clear()
            counts, vectors = scale_out.counts_and_shared_embeddings(DistContext(), index, paths, model, "text", 7,
                                                                     False)
        return index, model, counts, np.load(vectors.path)

    for step, recs in enumerate([records, edited]):
        index, model, counts, vectors = through_shared(recs)
        if not step:
            assert f"Embedding {len(records)} record(s) of {len(records)}" in caplog.text
        else:
            assert f"{len(edited) - 2} of {len(edited)} rows reused from c_embeddings.npy" in caplog.text
            assert f"Embedding 2 record(s) of {len(edited)}" in caplog.text
        plain = tmp_path / f"plain{step}"
        plain.mkdir()
        plain_index, plain_model = _index_and_model(plain, recs, tiny_model_dir)
        paths = {"embeddings": plain / "c_embeddings.npy", "token_counts": plain / "d_token_counts.npy"}
        with monkeypatch.context() as patch:  # computed afresh, not read from the shared path's registered sets
            patch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")
            want_counts, want = features.counts_and_embeddings(plain_index, paths, plain_model, "text", True, 7, False)
        want = matrix.load(want)  # the single-process path hands back the cache file, read in blocks later
        assert np.abs(want).sum(1).min() > 0  # every record has a vector (no text here is empty)
        assert np.array_equal(counts, want_counts) and np.array_equal(vectors, want)
        for name in ["c_embeddings.npy", "c_embeddings.fingerprints.npy", "d_token_counts.npy"]:
            assert (shared / name).read_bytes() == (plain / name).read_bytes(), name
        key = features.embedding_key(model.tokenizer("").fingerprint, model.table(), "text")
        reused = caches.lookup(shared / "c_embeddings.npy", key, index.fingerprints)  # a valid set for every reader
        assert reused.in_order and np.array_equal(reused.data, want)
        assert not list(shared.glob(".*.tmp"))

    _, _, counts, vectors = through_shared(edited, name="other")  # another output name: the registry has every row
    assert np.array_equal(vectors, want) and " record(s) of " not in caplog.text
    assert f"{len(edited)} row(s) taken from" in caplog.text and "nothing to embed" in caplog.text

    (shared / "d_token_counts.cache.json").unlink()  # vectors cached, counts not: only counted, nothing embedded
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")  # (else the plain runs' registered counts fill in)
    _, _, counts, vectors = through_shared(edited)
    assert np.array_equal(counts, want_counts) and np.array_equal(vectors, want)
    assert f"Counting tokens of {len(edited)} record(s) of" in caplog.text and "Embedding " not in caplog.text.replace(
        "Embedding table", "")


def _nearest(rows, centres):
    """A plain loop: the index of the closest centre of each row."""
    return np.array([int(np.argmin([((row - c) ** 2).sum() for c in centres])) for row in rows])


def test_labels_from_sample_equal_a_plain_fit_on_the_sample(tmp_path):
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(400, 12)).astype(np.float32)
    emb[::7] += 3.0
    np.save(tmp_path / "e.npy", emb)
    vectors = MatrixFile.open(tmp_path / "e.npy")
    labels, info, reduced = scale_out.labels_from_sample(DistContext(), vectors, 5, 0, "sklearn", 150, 0)
    assert info is None and reduced is None
    assert np.array_equal(labels, clustering.kmeans_labels(emb, 5, 0, fit_sample=150))  # as one process does it
    sample = emb[clustering.sample_rows(400, 150, 0)]
    assert np.array_equal(labels, _nearest(emb, clustering.make_kmeans(5, 0).fit(sample).cluster_centers_))

    from sklearn.decomposition import PCA

    labels, info, reduced = scale_out.labels_from_sample(DistContext(), vectors, 5, 0, "sklearn", 150, 4)
    pca = PCA(n_components=4, random_state=0).fit(sample)
    unit = pca.transform(emb)
    unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
    centres = clustering.make_kmeans(5, 0).fit(unit[clustering.sample_rows(400, 150, 0)]).cluster_centers_
    assert info.n_components == 4 and info.fit_rows == 150
    assert np.mean(labels == _nearest(unit, centres)) >= 0.99  # float32 vs float64 projection: ties only
    # the projection it returns is the labels' space: the similarity statistics are measured there, as one process
    # measures them on its reduced rows (torchrun measured the raw rows: mean 0.84 against 0.00)
    np.testing.assert_allclose(reduced(emb), unit, atol=1e-5)
    from diversity_order import diversity

    assert diversity.similarity_stats(vectors, 0, reduce=reduced) == diversity.similarity_stats(reduced(emb), 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(args, timeout=300):
    """Two torchrun launches (1 process each) meeting at a localhost c10d rendezvous, as two nodes would."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    endpoint = f"127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "test",
           "curate_dataset.py", *map(str, args), "--no-progress"]
    nodes = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    logs = [node.communicate(timeout=timeout)[1] for node in nodes]
    for node, log in zip(nodes, logs):
        assert node.returncode == 0, log[-4000:]
    return "".join(logs)


def test_a_flag_one_node_refuses_stops_every_node_at_once(tmp_path, tiny_model_dir):
    """A reviewer's input missing on one node: that node's rank said so and left before joining, and the other
    waited at the join for the collectives' 4 hours. Every rank joins and hears the refusal: both nodes stop, with
    the one line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    endpoint = f"127.0.0.1:{_free_port()}"
    folders = [tmp_path / "node_a", tmp_path / "node_b"]
    for folder in folders:
        folder.mkdir()
    write_jsonl(folders[0] / "d.jsonl", topical_records(per_topic=5))  # node_b has no d.jsonl
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "test", str(ROOT / "curate_dataset.py"),
           "--input", "d.jsonl", "--output", "o/c.jsonl", "--model-dir", str(tiny_model_dir), "--device", "cpu",
           "--n-clusters", "3", "--no-plot", "--no-progress"]
    started = time.monotonic()
    nodes = [subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for folder in folders]
    logs = [node.communicate(timeout=240)[1] for node in nodes]
    assert all(node.returncode != 0 for node in nodes), logs
    assert time.monotonic() - started < 200
    said = [line for log in logs for line in log.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and "d.jsonl" in said[0] and "not found" in said[0], logs
    # (each node's launcher prints its own ChildFailedError traceback after the line; no other)
    assert all(log.count("Traceback") == log.count("ChildFailedError:") for log in logs), logs


def test_nodes_that_see_other_output_folders_stop_with_one_line(tmp_path, tiny_model_dir):
    """A reviewer's relative --output from another working folder on each node: the shared-file check looked
    for rank 0's absolute name, which the other node saw, and that node then failed reading its own path
    (FileNotFoundError traceback). Each rank now looks under its own path to the folder, first."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               DIVERSITY_ORDER_CACHE_DIR="")
    endpoint = f"127.0.0.1:{_free_port()}"
    folders = [tmp_path / "node_a", tmp_path / "node_b"]
    for folder in folders:
        folder.mkdir()
    write_jsonl(tmp_path / "d.jsonl", topical_records(per_topic=5))  # the input is one file both nodes see
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "test", str(ROOT / "curate_dataset.py"),
           "--input", str(tmp_path / "d.jsonl"), "--output", "o/c.jsonl", "--model-dir", str(tiny_model_dir),
           "--device", "cpu", "--n-clusters", "3", "--no-plot", "--no-progress"]
    nodes = [subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for folder in folders]
    logs = [node.communicate(timeout=240)[1] for node in nodes]
    assert all(node.returncode != 0 for node in nodes), logs
    said = [line for log in logs for line in log.splitlines() if "error: " in line and "ChildFailed" not in line]
    assert len(said) == 2 and all("do not share the folder" in line for line in said), logs
    assert all(log.count("Traceback") == log.count("ChildFailedError:") for log in logs), logs
    assert not [p.name for folder in folders for p in (folder / "o").glob("*") if p.name.endswith(".tmp")]


def test_two_nodes_equal_a_single_process_and_reuse_its_cache(tmp_path, tiny_model_dir, monkeypatch):
    """--nnodes 2 with the fit on a sample smaller than N: labels, order and curated bytes are a single
    process's with the same --cluster-fit-sample; the rows a 1-process run cached are reused (moved)."""
    records = topical_records(per_topic=25, long_every=7)
    edited = records[1:] + records[:1]
    edited[5] = dict(edited[5], text=edited[5]["text"] + " plus an edit")
    single, nodes = tmp_path / "single", tmp_path / "nodes"
    common = ["--model-dir", tiny_model_dir, "--device", "cpu", "--n-clusters", 6, "--seq-len", 2000, "--no-plot",
              "--cluster-fit-sample", 100]
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")  # the edited record is embedded, not found in single/'s cache

    def one_process(folder):
        argv = ["--input", folder / "d.jsonl", "--output", folder / "c.jsonl", *common, "--no-progress"]
        assert run_main(curate_dataset.main, list(map(str, argv))) == 0

    for folder, recs in [(single, edited), (nodes, records)]:
        folder.mkdir()
        write_jsonl(folder / "d.jsonl", recs)
        one_process(folder)
    write_jsonl(nodes / "d.jsonl", edited)
    log = two_nodes(["--input", nodes / "d.jsonl", "--output", nodes / "c.jsonl", *common])
    assert f"{len(edited) - 1} of {len(edited)} rows reused from c_embeddings.npy" in log
    assert "Embedding 1 record(s) of 150 on 2 ranks" in log
    assert "k-means fitted on 100 sampled rows of 150" in log
    for name in ["c.jsonl", "c_labels.npy", "c_order.npy", "c_embeddings.npy", "d_token_counts.npy"]:
        assert (nodes / name).read_bytes() == (single / name).read_bytes(), name
    manifest = json.loads((nodes / "c_embeddings.cache.json").read_text())  # digested by the ranks together
    assert manifest["files"]["data"]["digest"] == json.loads((single / "c_embeddings.cache.json").read_text()
                                                             )["files"]["data"]["digest"]
    # The rows the centres were fitted on, as both say them (a reviewer's torchrun metadata said 0).
    for folder in (single, nodes):
        assert json.loads((folder / "c_meta.json").read_text())["clustering"]["fit_rows"] == 100, folder


def _collectives_worker(rank, store_path, out_dir):
    import torch.distributed as dist

    from diversity_order import distributed

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    ctx = DistContext(rank, 2)
    order = distributed.broadcast_array(ctx, np.arange(10, dtype=np.int64)[::-1].copy() if rank == 0 else None)
    name = distributed.broadcast_object(ctx, {"file": "x.tmp"} if rank == 0 else None)
    agreed = distributed.all_agree(ctx, rank == 0), distributed.all_agree(ctx, True)
    parts = distributed.gather_to_main(ctx, np.full((rank + 1, 2), rank, np.float32))
    np.save(Path(out_dir) / f"order{rank}.npy", order)
    (Path(out_dir) / f"r{rank}.txt").write_text(repr((name, agreed, None if parts is None else
                                                       [p.tolist() for p in parts])))
    dist.destroy_process_group()


def test_collectives_with_two_gloo_processes(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_collectives_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    for rank in range(2):
        assert np.load(tmp_path / f"order{rank}.npy").tolist() == list(range(9, -1, -1))
    assert (tmp_path / "r0.txt").read_text() == repr(({"file": "x.tmp"}, (False, True),
                                                      [[[0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]]))
    assert (tmp_path / "r1.txt").read_text() == repr(({"file": "x.tmp"}, (False, True), None))


def test_external_embeddings_for_the_ranks_are_checked_and_read_a_block_at_a_time(tmp_path):
    import pytest

    from diversity_order import matrix
    from diversity_order.errors import UserError

    emb = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float16)
    emb[2] = np.nan
    np.save(tmp_path / "e.npy", emb)
    vectors = scale_out.external_embeddings(tmp_path / "e.npy", 6)
    want = emb.astype(np.float32)
    want[2] = 0.0  # NaN rows become zero vectors, as in a single process
    assert np.array_equal(matrix.load(vectors), want)
    with pytest.raises(UserError, match="6 rows, but the input has 5 records"):
        scale_out.external_embeddings(tmp_path / "e.npy", 5)
    np.save(tmp_path / "flat.npy", np.zeros(6, np.float32))
    with pytest.raises(UserError, match="expected a 2-D N x D matrix"):
        scale_out.external_embeddings(tmp_path / "flat.npy", 6)


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=0, max_size=5000), st.integers(1, 4), st.integers(1, 700))
def test_chunk_digests_dealt_to_ranks_combine_to_the_file_digest(content, world, chunk):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f.npy"
        path.write_bytes(content)
        saved, caches.DIGEST_CHUNK = caches.DIGEST_CHUNK, chunk
        try:
            chunks = caches.chunk_count(len(content))
            parts = [caches.chunk_digests(path, range(rank, chunks, world)) for rank in range(world)]
            combined = caches.combine_chunk_digests(scale_out.dealt_back(parts), len(content))
            fd = os.open(path, os.O_RDONLY)
            try:
                assert combined == caches._digest_fd(fd, len(content))
            finally:
                os.close(fd)
        finally:
            caches.DIGEST_CHUNK = saved


def _indexing_worker(rank, store_path, inputs, out_dir):
    import torch.distributed as dist

    from diversity_order import sources
    from diversity_order.errors import UserError
    from diversity_order.records import IndexPart

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    ctx = DistContext(rank, 2)
    found = {}
    for name, files in inputs.items():
        try:
            source = sources.open_source([Path(f) for f in files], ("text",), progress=False, ctx=ctx)
        except UserError as exc:
            found[name] = str(exc)
            continue
        parts = source.parts if hasattr(source, "parts") else [source]
        found[name] = [{column: getattr(index, column).tolist() for column in IndexPart.COLUMNS} | {
            "identity": list(index.identity), "where": [source.where(r) for r in range(len(source))]}
            for index in parts]
    for name in ("one", "many"):  # rank 0 gathers the whole index; the other ranks keep their own rows
        spill = Path(out_dir) / f"spill{rank}"
        spill.mkdir(exist_ok=True)
        source, bounds = sources.open_rank_source([Path(f) for f in inputs[name]], ("text",), ctx, progress=False,
                                                  spill_folder=spill)
        rows = np.arange(bounds[rank], bounds[rank + 1])
        found[f"{name}_own"] = {"bounds": bounds.tolist(), "length": len(source),
                                "texts": [t for _, texts in source.iter_documents(rows) for t in texts],
                                "where": [source.where(int(r)) for r in rows],
                                "spill_left": os.listdir(spill)}
        if rank == 0:  # the whole index, its per-record columns in unnamed files
            parts = source.parts if hasattr(source, "parts") else [source]
            found[f"{name}_whole"] = [{column: getattr(index, column).tolist() for column in IndexPart.COLUMNS}
                                      for index in parts]
            found[f"{name}_file_backed"] = [isinstance(getattr(index, column), np.memmap) for index in parts
                                            if len(index)  # a file of no records holds no memory
                                            for column in ("starts", "lengths", "fingerprints", "raw_hashes")] + \
                [isinstance(getattr(source, column), np.memmap) for column in ("fingerprints", "row_sizes")]
    (Path(out_dir) / f"index{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


def test_ranks_index_their_byte_ranges_and_all_get_the_single_process_index(tmp_path):
    """Two gloo processes index plain JSONL together (each its half of the bytes): both hold the index
    one process builds, for one file (blank lines, a BOM, one record across the middle), several
    files of very different sizes, and a bad record in the second half (the single process's message)."""
    import pytest
    import torch.multiprocessing as mp

    from diversity_order import sources
    from diversity_order.errors import UserError
    from diversity_order.records import IndexPart

    one = tmp_path / "one.jsonl"
    lines = [b'{"text": "short %d"}' % i for i in range(7)] + [b'{"text": "%s"}' % (b"long " * 400)] + \
        [b"", b"  "] + [b'{"text": "after %d"}' % i for i in range(5)]
    one.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    # Files of no records among the others (as an empty shard of a sharded output): first, between, last.
    many = [tmp_path / f"m{i}.jsonl" for i in range(6)]
    many[0].write_bytes(b"")
    many[1].write_bytes(b'{"text": "tiny"}')
    many[2].write_bytes(b"".join(b'{"text": "middle %d"}\n\n' % i for i in range(40)))
    many[3].write_bytes(b"\n \n")
    many[4].write_bytes(b'{"text": "end"}\n')
    many[5].write_bytes(b"")
    bad = tmp_path / "bad.jsonl"
    # Bad records in both ranks' halves: counted together, with the last, as one pass counts them.
    bad.write_bytes(b"".join(b'{"text": "fine %d"}\n' % i if i != 4 else b'{"text": 4}\n' for i in range(30)) +
                    b'{"text": nope}\n{"text": "x"}\n{"text": null}\n')
    inputs = {"one": [str(one)], "many": [str(m) for m in many], "bad": [str(bad)],
              "none": [str(many[0]), str(many[3]), str(many[5])]}
    mp.spawn(_indexing_worker, args=(str(tmp_path / "store"), inputs, str(tmp_path)), nprocs=2)
    for rank in range(2):
        found = json.loads((tmp_path / f"index{rank}.json").read_text())
        for name in ("one", "many"):
            single = sources.open_source([Path(f) for f in inputs[name]], ("text",), progress=False)
            parts = single.parts if hasattr(single, "parts") else [single]
            assert found[name] == [{column: getattr(index, column).tolist() for column in IndexPart.COLUMNS} | {
                "identity": list(index.identity), "where": [single.where(r) for r in range(len(single))]}
                for index in parts], (rank, name)
        for name in ("one", "many"):
            single = sources.open_source([Path(f) for f in inputs[name]], ("text",), progress=False)
            own = found[f"{name}_own"]
            bounds = own["bounds"]
            assert bounds[0] == 0 and bounds[-1] == len(single) == own["length"] and bounds == sorted(bounds)
            rows = np.arange(bounds[rank], bounds[rank + 1])
            assert rows.size > 0 and own["where"] == [single.where(int(r)) for r in rows]
            assert own["texts"] == [t for _, texts in single.iter_documents(rows) for t in texts]
            assert own["spill_left"] == []  # the files have no names: nothing to clean up after a crash
            if rank == 0:
                assert found[f"{name}_whole"] == [{column: getattr(index, column).tolist()
                                                   for column in IndexPart.COLUMNS}
                                                  for index in (single.parts if hasattr(single, "parts") else [single])]
                assert all(found[f"{name}_file_backed"])
        with pytest.raises(UserError, match=r"bad\.jsonl:5: field 'text' is a JSON number") as single_error:
            scan_jsonl(bad, progress=False)
        assert found["bad"] == str(single_error.value)
        assert found["bad"].endswith(f"(3 records of this file cannot be read; the last: {bad}:33)")
        with pytest.raises(UserError, match=r"none of the 3 files holds a record") as single_error:
            sources.open_source([Path(f) for f in inputs["none"]], ("text",), progress=False)
        assert found["none"] == str(single_error.value)


def test_shutdown_ends_the_world_groups_threads_although_transformers_imported_torch_distributed_nn(tmp_path):
    """transformers imports torch.distributed.nn while loading a model; its functions take
    group.WORLD as a default value. Imported after init, that default kept the group (and its
    worker threads) alive past destroy_process_group, and a worker dropping a tensor during
    interpreter shutdown aborted a finished rank now and then. Here the group must really end."""
    script = tmp_path / "probe.py"
    script.write_text(f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
from diversity_order import distributed

def threads():
    return len(os.listdir("/proc/self/task"))

before = threads()
ctx = distributed.init_from_env(False)
import torch.distributed.nn.functional  # what transformers does while loading a model
import torch
import torch.distributed as dist
dist.all_reduce(torch.ones(1))
assert threads() > before, "the gloo group started no threads: this probe tests nothing"
distributed.shutdown(ctx)
# one file per rank: two ranks printing to one pipe can interleave their lines character by character
with open(os.path.join({str(tmp_path)!r}, "left-" + os.environ["RANK"]), "w") as out:
    out.write(str(threads() - before))
""")
    proc = _torchrun_script(script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    left = {path.name: path.read_text() for path in tmp_path.glob("left-*")}
    assert left == {"left-0": "0", "left-1": "0"}, (left, proc.stdout + proc.stderr[-2000:])


@pytest.mark.parametrize("where", ["shards", "embeddings"])
def test_a_full_disk_on_rank_0_is_one_line_on_every_rank(tmp_path, tiny_model_dir, where):
    """Rank 0's disk full while writing its shards, or creating the shared embeddings file: it says so in one line
    and the other rank stops with its own line, not with gloo's "Connection closed by peer" traceback as rank 0
    left the collective it never reached."""
    src = write_jsonl(tmp_path / "in.jsonl", topical_records(per_topic=8))
    script = tmp_path / "full.py"
    script.write_text(f"""
import errno, os, sys
import curate_dataset
from diversity_order import scale_out, writers
from diversity_order.cli import run_main

def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

if os.environ["RANK"] == "0":
    if {where!r} == "shards":
        writers.write_shard = full
    else:
        scale_out._create_rows_file = full
sys.exit(run_main(curate_dataset.main, ["--input", {str(src)!r}, "--output", {str(tmp_path / "out.jsonl")!r},
         "--model-dir", {str(tiny_model_dir)!r}, "--n-clusters", "4", "--seq-len", "512", "--no-plot",
         "--output-shards", "4", "--no-progress"]))
""")
    env = {**os.environ, "DIVERSITY_ORDER_CACHE_DIR": "", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                                              "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    err = proc.stderr
    assert "no room left on the disk" in err, err[-3000:]
    said = ("another rank could not write its shards" if where == "shards"
            else "creating the embeddings file beside")
    assert said in err, err[-3000:]
    assert "Connection closed by peer" not in err and "RuntimeError" not in err, err[-3000:]
    assert not list(tmp_path.glob("out*.jsonl"))


def _torchrun_script(script: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], env=env, capture_output=True, text=True, timeout=300)


def test_a_join_that_times_out_is_one_line_naming_the_wait(monkeypatch):
    """A process that never joins: the others' join ended after the wait in a DistStoreError traceback (a
    reviewer's). One line now, naming the variable that sets the wait; other failures are left as they are."""
    import torch.distributed as dist

    from diversity_order import distributed
    from diversity_order.errors import UserError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "90")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)

    def times_out(**kwargs):
        raise dist.DistStoreError("wait timeout after 90000ms, keys: /default_pg/0//cuda//0")

    monkeypatch.setattr(dist, "init_process_group", times_out)
    with pytest.raises(UserError) as refused:
        distributed.init_from_env(use_cuda=False)
    assert str(refused.value) == (
        "the 2 processes did not all join the process group within 0:01:30 (DistStoreError): a process that stopped "
        f"before joining says why in its own node's output; {distributed.TIMEOUT_ENV} sets how long they wait")

    def fails(**kwargs):
        raise RuntimeError("Connection refused")

    monkeypatch.setattr(dist, "init_process_group", fails)
    with pytest.raises(RuntimeError, match="Connection refused"):
        distributed.init_from_env(use_cuda=False)
