"""Atomic writes and row caches: stale temp files."""

import os
import subprocess
import sys

from diversity_order import atomic

# ---- temp files of dead writers -----------------------------------------------------------------


def test_stale_temps_of_dead_processes_are_removed_never_a_live_ones(tmp_path):
    target = tmp_path / "x_embeddings.npy"
    host = atomic._HOST
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        temps = {
            "dead": tmp_path / f".x_embeddings.npy.{host}.{dead.pid}.abcd1234.tmp",
            "live": tmp_path / f".x_embeddings.npy.{host}.{live.pid}.abcd1234.tmp",
            "mine": tmp_path / f".x_embeddings.npy.{host}.{os.getpid()}.abcd1234.tmp",
            "other_host": tmp_path / f".x_embeddings.npy.elsewhere.example.{dead.pid}.abcd1234.tmp",
            "older_version": tmp_path / ".x_embeddings.npy.k2j3h4g5.tmp",
            "other_file": tmp_path / f".x_embeddings.npy.fingerprints.npy.{host}.{dead.pid}.abcd1234.tmp",
        }
        for temp in temps.values():
            temp.write_bytes(b"half")
        atomic.note_target(target)
        removed = atomic.sweep_stale_temps()
        assert sorted(removed) == sorted([temps["dead"], temps["older_version"]])
        assert all(temps[k].exists() for k in ("live", "mine", "other_host", "other_file"))
    finally:
        live.kill()
        live.wait()


def test_temp_names_carry_host_and_pid(tmp_path):
    target = tmp_path / "x.npy"
    seen = []
    with atomic.atomic_open(target) as handle:
        seen = [p.name for p in tmp_path.iterdir()]
        handle.write(b"x")
    assert len(seen) == 1 and seen[0].startswith(f".x.npy.{atomic._HOST}.{os.getpid()}.") and seen[0].endswith(".tmp")
    assert atomic._temp_owner(target, tmp_path / seen[0]) == (atomic._HOST, os.getpid())
