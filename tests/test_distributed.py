"""torchrun with 2 CPU processes (gloo) gives exactly the single-process result."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import curate_dataset
from conftest import topical_records, write_jsonl
from diversity_order.cli import run_main
from diversity_order.distributed import DistContext, my_share, split_by_bytes

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


def torchrun(args, nproc=2):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "curate_dataset.py", *map(str, args), "--no-progress"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def test_torchrun_two_cpu_ranks_equals_single_process(tmp_path, tiny_model_dir):
    records = topical_records(per_topic=25, long_every=7)
    single, multi = tmp_path / "single", tmp_path / "multi"
    for folder in (single, multi):
        folder.mkdir()
        write_jsonl(folder / "d.jsonl", records)
    common = ["--model-dir", tiny_model_dir, "--n-clusters", 6, "--seq-len", 2000, "--no-plot"]
    assert run_main(curate_dataset.main, [str(a) for a in ["--input", single / "d.jsonl", "--output",
                                                           single / "c.jsonl", *common, "--no-progress"]]) == 0
    log = torchrun(["--input", multi / "d.jsonl", "--output", multi / "c.jsonl", *common])
    assert "Rank 0 of 2" in log and "Rank 1 of 2" not in log  # only rank 0 logs at INFO
    for name in ["c.jsonl", "c_embeddings.npy", "d_token_counts.npy", "c_labels.npy", "c_order.npy"]:
        assert (multi / name).read_bytes() == (single / name).read_bytes(), name

    # Counting only (precomputed embeddings, no count cache yet) is split across ranks too.
    (multi / "d_token_counts.cache.json").unlink()
    np.save(tmp_path / "ext.npy", np.load(single / "c_embeddings.npy"))
    torchrun(["--input", multi / "d.jsonl", "--output", multi / "e.jsonl", "--load-embeddings",
              tmp_path / "ext.npy", *common])
    assert np.array_equal(np.load(multi / "d_token_counts.npy"), np.load(single / "d_token_counts.npy"))
    assert (multi / "e.jsonl").read_bytes() == (single / "c.jsonl").read_bytes()
