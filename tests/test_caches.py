"""Row caches as units: manifests, dtype/shape, the registry, failed writes, stale temp files."""

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order import atomic, caches

ROOT = Path(__file__).resolve().parent.parent
KEY = {"model": "m", "text_field": "text"}


@pytest.fixture(autouse=True)
def registry(tmp_path_factory, monkeypatch):
    """Every test here gets its own registry (read from the environment at each call)."""
    folder = tmp_path_factory.mktemp("registry")
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(folder))
    return folder


def truth(fps: np.ndarray) -> np.ndarray:
    """The 'vector' of a record: derived from its fingerprint, so a misplaced row is visible."""
    fps = np.asarray(fps, dtype=np.float64)
    return np.stack([fps, -fps, fps * 0.5], axis=1).astype(np.float32)


def assert_rows_belong_to_their_records(found: caches.CacheLookup, fps: np.ndarray) -> None:
    if found.data is not None and found.hit.any():
        np.testing.assert_array_equal(found.data[found.hit], truth(fps[found.hit]))


# ---- a set is written and validated as one unit --------------------------------------------------

WRITER = textwrap.dedent("""
    import contextlib, sys, time
    from pathlib import Path
    import numpy as np
    import diversity_order.atomic as atomic
    from diversity_order import caches

    path, order, pause_after, ready, go = sys.argv[1:6]
    real = atomic.atomic_open

    @contextlib.contextmanager
    def pausing_open(target, mode="wb"):
        with real(target, mode) as handle:
            yield handle
        if Path(target).name == pause_after:  # this file is in place: let the other writer run
            Path(ready).touch()
            deadline = time.time() + 120
            while not Path(go).exists() and time.time() < deadline:
                time.sleep(0.01)

    atomic.atomic_open = pausing_open
    fps = np.arange(1, 41, dtype=np.uint64)
    if order == "reversed":
        fps = fps[::-1].copy()
    data = np.stack([fps.astype(np.float64), -fps.astype(np.float64), fps * 0.5], axis=1).astype(np.float32)
    caches.store(Path(path), {"model": "m", "text_field": "text"}, fps, data)
""")


def _writer(path, order, pause_after, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ready, go = tmp_path / f"{order}.ready", tmp_path / f"{order}.go"
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), order, pause_after, str(ready), str(go)],
                            env=env, cwd=ROOT), ready, go


@pytest.mark.parametrize("pause_after", ["c.npy", "c.fingerprints.npy"])
def test_two_processes_writing_one_cache_interleaved_never_mix_their_rows(tmp_path, pause_after, caplog):
    # Run A (records 1..40) writes part of the set, run B (the same records reversed) writes all
    # of it, then A finishes: the files on disk now come from both runs.
    path = tmp_path / "c.npy"
    a, a_ready, a_go = _writer(path, "forward", pause_after, tmp_path)
    deadline = time.time() + 120
    while not a_ready.exists():
        assert a.poll() is None and time.time() < deadline, "writer A never reached its pause"
        time.sleep(0.01)
    b, _, _ = _writer(path, "reversed", "-", tmp_path)
    assert b.wait(120) == 0
    a_go.touch()
    assert a.wait(120) == 0

    fps = np.arange(1, 41, dtype=np.uint64)
    caplog.set_level(logging.INFO)
    for current in (fps, fps[::-1].copy()):
        found = caches.lookup(path, KEY, current)
        assert_rows_belong_to_their_records(found, current)  # never B's vectors under A's fingerprints
    # A's manifest went last, B's data file is in place: the set is rejected, with a reason.
    assert not found.hit.any()
    assert "is not the file c.cache.json was written with" in found.reason


def test_files_swapped_between_two_sets_are_rejected(tmp_path):
    one, two = tmp_path / "one.npy", tmp_path / "two.npy"
    fps_one = np.arange(1, 21, dtype=np.uint64)
    fps_two = fps_one[::-1].copy()  # the same records in another order: same row count, same key
    caches.store(one, KEY, fps_one, truth(fps_one))
    caches.store(two, KEY, fps_two, truth(fps_two))
    for name in ("npy", "fingerprints.npy"):
        a, b = tmp_path / f"one.{name}", tmp_path / f"two.{name}"
        a.rename(tmp_path / "swap")
        b.rename(a)
        (tmp_path / "swap").rename(b)
        for path, fps in ((one, fps_one), (two, fps_two)):
            found = caches.lookup(path, KEY, fps)
            assert_rows_belong_to_their_records(found, fps)
            assert not found.hit.any() and "is not the file" in found.reason
        a.rename(tmp_path / "swap")  # swap back: both sets are whole again
        b.rename(a)
        (tmp_path / "swap").rename(b)
    assert caches.lookup(one, KEY, fps_one).in_order


def test_matching_identities_read_no_data_and_a_copy_is_verified_once(tmp_path, monkeypatch):
    path = tmp_path / "a" / "x.npy"
    fps = np.arange(1, 11, dtype=np.uint64)
    caches.store(path, KEY, fps, truth(fps))
    digests = []
    real = caches._digest_fd
    monkeypatch.setattr(caches, "_digest_fd", lambda fd, size, *scheme: digests.append(size) or real(fd, size, *scheme))

    assert caches.lookup(path, KEY, fps, dtype=np.float32, row_shape=(3,)).in_order
    assert digests == []  # identities match: nothing digested

    copy = tmp_path / "b"
    shutil.copytree(path.parent, copy)  # new inodes (and the manifest still names the old ones)
    found = caches.lookup(copy / "x.npy", KEY, fps, dtype=np.float32, row_shape=(3,))
    assert found.in_order and len(digests) == 2  # data and fingerprints verified ...
    caches.lookup(copy / "x.npy", KEY, fps, dtype=np.float32, row_shape=(3,))
    assert len(digests) == 2  # ... once: the manifest was refreshed

    os.utime(path)  # touched, content unchanged
    assert caches.lookup(path, KEY, fps, dtype=np.float32, row_shape=(3,)).in_order
    assert len(digests) == 3


def test_an_edited_data_file_is_rejected(tmp_path):
    path = tmp_path / "x.npy"
    fps = np.arange(1, 11, dtype=np.uint64)
    caches.store(path, KEY, fps, truth(fps))
    np.save(path, truth(fps) + 1)  # same shape and dtype, other content
    found = caches.lookup(path, KEY, fps)
    assert not found.hit.any() and "is not the file" in found.reason


# ---- dtype and shape are part of the key ---------------------------------------------------------


@pytest.mark.parametrize("stored, dtype, row_shape", [
    (np.zeros((6, 32), np.int64), np.float32, (32,)),  # int64 zeros as embeddings
    (np.ones((6, 10), np.float32), np.float32, (32,)),  # N x 10 floats as 32-wide embeddings
    (np.ones(6, np.float64), np.int64, ()),  # token counts saved as float
    (np.ones((6, 1), np.int64), np.int64, ()),  # token counts saved 2-D
    (np.ones((6, 3), np.int64), np.int64, (2,)),  # deep token-cache rows are (kept, full)
])
def test_cache_of_another_dtype_or_shape_is_rejected(tmp_path, stored, dtype, row_shape):
    path = tmp_path / "x.npy"
    fps = np.arange(1, 7, dtype=np.uint64)
    caches.store(path, KEY, fps, stored)
    found = caches.lookup(path, KEY, fps, dtype=dtype, row_shape=row_shape)
    assert found.data is None and not found.hit.any()
    assert f"holds {stored.dtype} rows" in found.reason and "expected" in found.reason
    # Named correctly, the same set is reused.
    assert caches.lookup(path, KEY, fps, dtype=stored.dtype, row_shape=stored.shape[1:]).in_order


# ---- the set follows the input order -------------------------------------------------------------


def test_in_order_only_when_the_set_is_exactly_the_current_records(tmp_path):
    path = tmp_path / "x.npy"
    fps = np.array([5, 6, 7, 7, 8], dtype=np.uint64)  # a duplicated text is still "in order"
    caches.store(path, KEY, fps, truth(fps))
    assert caches.lookup(path, KEY, fps).in_order
    for changed in (fps[[1, 0, 2, 3, 4]], fps[:4], np.append(fps, 9).astype(np.uint64)):
        found = caches.lookup(path, KEY, changed)
        assert not found.in_order
        assert_rows_belong_to_their_records(found, changed)


def test_the_log_says_how_many_cached_rows_belong_to_records_gone_since(tmp_path):
    """A new user removed 5 records and edited 10: the rerun said '5999 of 5999 rows reused' and nothing of the
    rows left behind. Rows of texts no current record has are counted (a duplicate's second row is not: its
    text is still there), and rows an interrupted run left unfilled are not; nothing is said where none is."""
    path = tmp_path / "x.npy"
    fps = np.arange(1, 11, dtype=np.uint64)
    caches.store(path, KEY, fps, truth(fps))
    now = np.array([1, 2, 3, 4, 5, 6, 7, 8, 8, 20], dtype=np.uint64)  # 9 and 10 gone, 20 new, 8 twice
    for found in (caches.lookup(path, KEY, now), caches.find_rows(path, KEY, now, dtype=np.float32, row_shape=(3,))):
        # 8 twice: more records given rows than the set has rows for them (a new user read 20,159 of its 20,000)
        assert found.reason == ("9 of 10 rows reused from x.npy (1 of them share a row with another record of the same text) "
                                "(2 of its rows, of records removed or edited since, left out)")
    assert "left out" not in caches.lookup(path, KEY, np.append(fps, 11).astype(np.uint64)).reason
    assert "another record" not in caches.lookup(path, KEY, fps[:5]).reason
    caches.store(path, KEY, fps, truth(fps), filled=np.arange(10) < 6)  # an interrupted run's: rows 6-9 unfilled
    assert caches.lookup(path, KEY, fps[:5]).reason == (
        "5 of 5 rows reused from x.npy (stored part-filled by an interrupted run) (1 of its rows, of records removed "
        "or edited since, left out)")


# ---- the registry: sets found by content ---------------------------------------------------------


def test_missing_rows_come_from_the_registered_set_with_most_of_them(tmp_path, registry, caplog):
    fps = np.arange(1, 31, dtype=np.uint64)
    caches.store(tmp_path / "few.npy", KEY, fps[:5], truth(fps[:5]))
    caches.store(tmp_path / "many.npy", KEY, fps[:25], truth(fps[:25]))
    caches.store(tmp_path / "other_key.npy", {"model": "x", "text_field": "text"}, fps, truth(fps))
    assert (registry / "registry.jsonl").exists()

    found = caches.lookup(tmp_path / "new.npy", KEY, fps)
    assert found.hit.sum() == 25 and "many.npy" in found.reason
    assert not found.in_order  # rows from elsewhere: the caller stores the new set
    assert_rows_belong_to_their_records(found, fps)

    # A changed set is skipped (its digest fails), a deleted one too.
    np.save(tmp_path / "many.npy", truth(fps[:25]) * 2)
    caplog.set_level(logging.INFO)
    found = caches.lookup(tmp_path / "new.npy", KEY, fps)
    assert found.hit.sum() == 5 and "few.npy" in found.reason and "many.npy skipped" in caplog.text
    assert_rows_belong_to_their_records(found, fps)
    for path in tmp_path.glob("few*"):
        path.unlink()
    found = caches.lookup(tmp_path / "new.npy", KEY, fps)
    assert found.data is None and not found.hit.any()


def test_registered_sets_of_another_dtype_are_passed_over_without_a_line_each(tmp_path, registry, caplog):
    """Sets of the same key in float16 (another --embedding-dtype) were each said to be "skipped" on every run."""
    fps = np.arange(1, 31, dtype=np.uint64)
    for i in range(3):
        caches.store(tmp_path / f"half{i}.npy", KEY, fps, truth(fps).astype(np.float16))
    caches.store(tmp_path / "changed.npy", KEY, fps[:20], truth(fps[:20]))
    np.save(tmp_path / "changed.npy", truth(fps[:20]) * 2)  # a real fault: still said
    caplog.set_level(logging.DEBUG)
    found = caches.lookup(tmp_path / "new.npy", KEY, fps, dtype=np.float32, row_shape=(3,))
    assert not found.hit.any()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "skipped" in r.getMessage()]
    assert len(said) == 1 and "changed.npy skipped" in said[0]
    assert sum("half" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG) == 3


def test_a_registered_set_whose_fingerprints_file_was_replaced_is_skipped_not_a_crash(tmp_path, registry, caplog):
    """A new user's extraction wrote a 16 x 576 array over a cache's fingerprints file: every later run of any
    input crashed in the registry search (IndexError), until the file was deleted."""
    fps = np.arange(1, 31, dtype=np.uint64)
    caches.store(tmp_path / "a.npy", KEY, fps, truth(fps))
    np.save(tmp_path / "a.fingerprints.npy", np.zeros((16, 3), np.float32))
    caplog.set_level(logging.INFO)
    found = caches.lookup(tmp_path / "new.npy", KEY, np.arange(100, 140, dtype=np.uint64))
    assert not found.hit.any()
    assert "Registered cache " in caplog.text and "a.fingerprints.npy is not one uint64 per row" in caplog.text


@pytest.mark.parametrize("line", ['{"data": 5, "marker": null}', '[1, 2]', '"text"', '{"marker": "m"}'])
def test_a_damaged_registry_line_is_passed_over_not_a_crash(tmp_path, registry, line):
    """A reviewer's registry line {"data": 5, "marker": null} ended every later run in a TypeError."""
    fps = np.arange(1, 31, dtype=np.uint64)
    caches.store(tmp_path / "a.npy", KEY, fps, truth(fps))
    with open(registry / "registry.jsonl", "a") as handle:
        handle.write(line + "\n")
    found = caches.lookup(tmp_path / "new.npy", KEY, fps)
    assert found.hit.all() and "a.npy" in found.reason


@pytest.mark.parametrize("entry", ["x", 5, None, ["size"]])
def test_a_manifest_whose_file_entries_are_no_objects_is_recomputed_not_a_crash(tmp_path, entry):
    """A reviewer's cache.json with "files": {"data": "x"} ended the run in an AttributeError."""
    path = tmp_path / "x.npy"
    fps = np.arange(1, 11, dtype=np.uint64)
    caches.store(path, KEY, fps, truth(fps))
    marker = tmp_path / "x.cache.json"
    manifest = json.loads(marker.read_text())
    manifest["files"]["data"] = entry
    marker.write_text(json.dumps(manifest))
    found = caches.lookup(path, KEY, fps, registry=False)
    assert not found.hit.any() and "does not describe its files" in found.reason


def test_a_registered_set_of_exactly_these_records_is_linked_not_copied(tmp_path, registry, caplog):
    fps = np.arange(1, 31, dtype=np.uint64)
    first = tmp_path / "a" / "first.npy"
    first.parent.mkdir()
    caches.store(first, KEY, fps, truth(fps))
    caplog.set_level(logging.INFO)
    for lazy in (False, True):
        target = tmp_path / f"b{lazy}" / "second.npy"
        target.parent.mkdir()
        found = caches.lookup(target, KEY, fps, lazy=lazy)
        assert found.in_order and found.hit.all() and "linked as second.npy, not copied" in found.reason
        assert os.path.samefile(target, first)  # one file on disk for both names
        assert os.path.samefile(target.with_suffix(".fingerprints.npy"), first.with_suffix(".fingerprints.npy"))
        np.testing.assert_array_equal(np.asarray(found.data), truth(fps))
        again = caches.lookup(target, KEY, fps, registry=False)  # the new name is a set of its own
        assert again.in_order and again.reason.startswith("all 30 rows reused from second.npy")
    # Records in another order, or fewer of them: rows are copied as before, nothing linked.
    target = tmp_path / "c" / "third.npy"
    target.parent.mkdir()
    found = caches.lookup(target, KEY, fps[::-1])
    assert not found.in_order and found.hit.all() and not target.exists()
    assert_rows_belong_to_their_records(found, fps[::-1])
    # Rewriting one name replaces its file whole: the other keeps its rows.
    caches.store(tmp_path / "bFalse" / "second.npy", KEY, fps, truth(fps) * 0)
    assert caches.lookup(first, KEY, fps, registry=False).in_order
    np.testing.assert_array_equal(np.load(first), truth(fps))


def test_of_sets_holding_every_record_the_one_of_exactly_these_records_is_linked(tmp_path, registry):
    """A new user's third output copied the rows of a later, larger set (the same records and 1% more) although an
    earlier set held exactly its records, in order, and could be linked."""
    fps = np.arange(1, 31, dtype=np.uint64)
    more = np.arange(1, 41, dtype=np.uint64)
    caches.store(tmp_path / "a" / "exact.npy", KEY, fps, truth(fps))
    caches.store(tmp_path / "b" / "larger.npy", KEY, more, truth(more))  # registered last: tried first before
    found = caches.lookup(tmp_path / "c" / "third.npy", KEY, fps)
    assert found.in_order and "exact.npy, linked as third.npy" in found.reason
    assert os.path.samefile(tmp_path / "c" / "third.npy", tmp_path / "a" / "exact.npy")


def test_of_equal_sets_the_one_on_the_targets_filesystem_is_linked(tmp_path, registry, monkeypatch):
    fps = np.arange(1, 31, dtype=np.uint64)
    caches.store(tmp_path / "same" / "s.npy", KEY, fps, truth(fps))
    caches.store(tmp_path / "other" / "o.npy", KEY, fps, truth(fps))  # registered last: tried first before
    real = caches._device
    monkeypatch.setattr(caches, "_device", lambda folder: -1 if folder.name == "other" else real(folder))
    found = caches.lookup(tmp_path / "target" / "t.npy", KEY, fps)
    assert found.in_order and "s.npy, linked as t.npy" in found.reason


def test_a_set_stored_with_the_registry_off_is_registered_when_next_used(tmp_path, registry, monkeypatch):
    fps = np.arange(1, 31, dtype=np.uint64)
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")
    caches.store(tmp_path / "a" / "first.npy", KEY, fps, truth(fps))
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(registry))
    assert caches.registered_sets(KEY) == []
    assert caches.lookup(tmp_path / "a" / "first.npy", KEY, fps).in_order  # used as it is: registered now
    assert caches.lookup(tmp_path / "a" / "first.npy", KEY, fps).in_order  # (once)
    assert [f.data for f in caches.registered_sets(KEY)] == [(tmp_path / "a" / "first.npy").absolute()]
    assert len((registry / "registry.jsonl").read_text().splitlines()) == 1
    found = caches.lookup(tmp_path / "b" / "second.npy", KEY, fps)
    assert found.in_order and "linked as second.npy" in found.reason


def test_a_set_that_cannot_be_linked_is_copied(tmp_path, registry, monkeypatch, caplog):
    fps = np.arange(1, 31, dtype=np.uint64)
    caches.store(tmp_path / "first.npy", KEY, fps, truth(fps))

    def cross_device(source, target):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    caplog.set_level(logging.INFO)
    target = tmp_path / "second.npy"
    found = caches.lookup(target, KEY, fps)
    assert "Invalid cross-device link" in caplog.text and "copied instead" in caplog.text
    assert not found.in_order and found.hit.all() and "taken from" in found.reason  # the caller stores a copy
    assert_rows_belong_to_their_records(found, fps)
    assert not list(tmp_path.glob(".second*.tmp")) and not (tmp_path / "second.cache.json").exists()


def test_a_registered_file_replaced_after_its_check_is_not_linked(tmp_path, registry, monkeypatch, caplog):
    fps = np.arange(1, 31, dtype=np.uint64)
    first = tmp_path / "first.npy"
    caches.store(first, KEY, fps, truth(fps))
    real_link = atomic.atomic_link

    @contextlib.contextmanager
    def replaced_first(source, path):  # another writer replaces the data between the check and the link
        if Path(source) == first.absolute():  # replaced whole, as every writer here does
            np.save(tmp_path / "elsewhere.npy", truth(fps) * 2)
            os.replace(tmp_path / "elsewhere.npy", first)
        with real_link(source, path) as temp:
            yield temp

    monkeypatch.setattr(atomic, "atomic_link", replaced_first)
    caplog.set_level(logging.INFO)
    target = tmp_path / "second.npy"
    found = caches.lookup(target, KEY, fps)
    assert "changed since it was checked" in caplog.text
    assert not found.in_order and not (tmp_path / "second.cache.json").exists()
    assert not target.exists() and not list(tmp_path.glob(".second*.tmp"))
    assert_rows_belong_to_their_records(found, fps)  # the rows validated before the replacement


def test_registry_location_is_read_at_each_call(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(tmp_path / "r1"))
    assert caches.registry_dir() == tmp_path / "r1"
    monkeypatch.delenv("DIVERSITY_ORDER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert caches.registry_dir() == tmp_path / "xdg" / "diversity-order"
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", "")
    assert caches.registry_dir() is None
    fps = np.arange(1, 4, dtype=np.uint64)
    assert caches.store(tmp_path / "x.npy", KEY, fps, truth(fps))  # registry off: stored all the same


def test_registry_keeps_one_line_per_existing_set(tmp_path, registry, monkeypatch):
    monkeypatch.setattr(caches, "REGISTRY_COMPACT_LINES", 5)
    fps = np.arange(1, 4, dtype=np.uint64)
    for _ in range(8):  # the same set stored again and again, and one that is deleted
        caches.store(tmp_path / "x.npy", KEY, fps, truth(fps))
    caches.store(tmp_path / "gone.npy", KEY, fps, truth(fps))
    (tmp_path / "gone.cache.json").unlink()
    assert [f.data for f in caches.registered_sets(KEY)] == [(tmp_path / "x.npy").absolute()]
    assert len((registry / "registry.jsonl").read_text().splitlines()) == 1  # compacted


# ---- writes that fail ----------------------------------------------------------------------------


def test_a_cache_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch, caplog):
    path = tmp_path / "x.npy"
    fps = np.arange(1, 4, dtype=np.uint64)
    real = atomic.atomic_open

    def refused(target, mode="wb"):
        if Path(target).parent == tmp_path:
            raise PermissionError(1, "Operation not permitted", str(target))
        return real(target, mode)

    monkeypatch.setattr(atomic, "atomic_open", refused)
    caplog.set_level(logging.WARNING)
    assert caches.store(path, KEY, fps, truth(fps)) is False
    assert "not written (Operation not permitted" in caplog.text
    from diversity_order.errors import UserError

    with pytest.raises(UserError, match="cannot write"):  # a product, not a cache: a one-line error
        caches.store(path, KEY, fps, truth(fps), required=True)


def test_an_unwritable_registry_is_one_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DIVERSITY_ORDER_CACHE_DIR", str(blocker / "registry"))
    monkeypatch.setattr(caches, "_registry_warned", False)
    caplog.set_level(logging.WARNING)
    fps = np.arange(1, 4, dtype=np.uint64)
    assert caches.store(tmp_path / "x.npy", KEY, fps, truth(fps))
    assert caches.store(tmp_path / "y.npy", KEY, fps, truth(fps))
    assert caplog.text.count("Cache registry") == 1


# ---- temp files of dead writers ------------------------------------------------------------------


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


def test_manifest_lists_each_file_with_identity_and_digest(tmp_path):
    fps = np.arange(1, 4, dtype=np.uint64)
    files = caches.files_for(tmp_path / "x.npy", extras=("ids",))
    caches.store(files, KEY, fps, truth(fps), extras={"ids": np.arange(7, dtype=np.int32)})
    manifest = json.loads(files.marker.read_text())
    assert set(manifest["files"]) == {"data", "fingerprints", "extra:ids"}
    for role, path in (("data", files.data), ("fingerprints", files.fingerprints), ("extra:ids", files.extras["ids"])):
        entry, stat = manifest["files"][role], path.stat()
        assert (entry["size"], entry["mtime_ns"], entry["inode"]) == (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        assert entry["digest"] == plain_digest(path.read_bytes(), xxhash.xxh3_128)
    assert manifest["rows"] == 3 and manifest["dtype"] == "float32" and manifest["shape"] == [3, 3]
    assert manifest["digest"] == caches.XXH3
    np.testing.assert_array_equal(np.load(files.data), truth(fps))  # still a plain .npy


def plain_digest(content: bytes, new_hash, chunk: int = 64 << 20) -> str:
    """What a manifest records for a file: the hash of "size:" and each chunk's hash, one loop."""
    combined = new_hash()
    combined.update(f"{len(content)}:".encode())
    for start in range(0, max(len(content), 1), chunk):
        combined.update(new_hash(content[start: start + chunk]).digest())
    return combined.hexdigest()


def test_digests_of_many_chunks_match_the_plain_loop(tmp_path, monkeypatch):
    monkeypatch.setattr(caches, "DIGEST_CHUNK", 1000)
    fps = np.arange(1, 400, dtype=np.uint64)
    files = caches.files_for(tmp_path / "x.npy")
    caches.store(files, KEY, fps, truth(fps))
    entry = json.loads(files.marker.read_text())["files"]["data"]
    assert entry["digest"] == plain_digest(files.data.read_bytes(), xxhash.xxh3_128, 1000)
    with open(files.data, "rb") as handle:
        assert caches._digest_fd(handle.fileno(), files.data.stat().st_size, caches.BLAKE2B) == plain_digest(
            files.data.read_bytes(), lambda *data: hashlib.blake2b(*data, digest_size=32), 1000)


def _as_blake2b_manifest(files) -> None:
    """Rewrite a set's manifest as versions before XXH3 wrote it: blake2b digests in a "blake2b" field."""
    manifest = json.loads(files.marker.read_text())
    for entry in manifest["files"].values():
        path = files.data.parent / entry["name"]
        del entry["digest"]
        entry["blake2b"] = plain_digest(path.read_bytes(), lambda *data: hashlib.blake2b(*data, digest_size=32))
    manifest["digest"] = caches.BLAKE2B
    files.marker.write_text(json.dumps(manifest))


def test_a_set_digested_with_blake2b_before_is_still_verified_and_reused(tmp_path):
    fps = np.arange(1, 11, dtype=np.uint64)
    files = caches.files_for(tmp_path / "a" / "x.npy")
    caches.store(files, KEY, fps, truth(fps))
    _as_blake2b_manifest(files)
    assert caches.lookup(files.data, KEY, fps).in_order  # identities match: nothing to digest
    shutil.copytree(files.data.parent, tmp_path / "b")  # new identities: the blake2b digests are checked
    found = caches.lookup(tmp_path / "b" / "x.npy", KEY, fps)
    assert found.in_order, found.reason
    np.save(tmp_path / "b" / "x.npy", truth(fps) + 1)  # other content: the blake2b digest differs
    found = caches.lookup(tmp_path / "b" / "x.npy", KEY, fps)
    assert "is not the file" in found.reason
    assert_rows_belong_to_their_records(found, fps)  # rows, if any, from the registered set "a", not the edit
    assert found.in_order and "linked as x.npy" in found.reason  # "a" holds exactly these records: linked


def test_a_digest_scheme_this_version_cannot_check_is_recomputed(tmp_path):
    fps = np.arange(1, 11, dtype=np.uint64)
    files = caches.files_for(tmp_path / "x.npy")
    caches.store(files, KEY, fps, truth(fps))
    manifest = json.loads(files.marker.read_text())
    files.marker.write_text(json.dumps(dict(manifest, digest="sha3-512 of everything")))
    assert caches.lookup(files.data, KEY, fps).in_order  # identities match: the scheme is never needed
    os.utime(files.data)
    found = caches.lookup(files.data, KEY, fps)
    assert not found.hit.any() and "sha3-512 of everything" in found.reason


def test_a_set_written_before_manifests_is_reused_and_rewritten(tmp_path):
    path = tmp_path / "x.npy"
    fps = np.arange(1, 6, dtype=np.uint64)
    np.save(path, truth(fps))
    np.save(tmp_path / "x.fingerprints.npy", fps)
    (tmp_path / "x.cache.json").write_text(json.dumps({"key": KEY, "rows": 5, "dtype": "float32", "shape": [5, 3]}))
    found = caches.lookup(path, KEY, fps, dtype=np.float32, row_shape=(3,))
    assert found.hit.all() and not found.in_order and "without a manifest" in found.reason
    assert_rows_belong_to_their_records(found, fps)
    caches.store(path, KEY, fps, found.data)  # what the callers do when not in_order
    assert caches.lookup(path, KEY, fps, dtype=np.float32, row_shape=(3,)).in_order


def _stored(tmp_path, fps, data, name="e.npy"):
    caches.store(tmp_path / name, {"kind": "t"}, np.asarray(fps, dtype=np.uint64), data)
    return tmp_path / name


def test_a_lazy_lookup_copies_the_same_rows_a_gathering_one_returns(tmp_path):
    rng = np.random.default_rng(0)
    old = rng.normal(size=(50, 4)).astype(np.float32)
    target = _stored(tmp_path, np.arange(50), old)
    other = _stored(tmp_path, np.arange(100, 120), rng.normal(size=(20, 4)).astype(np.float32), "other.npy")
    # Moved, removed, new, and rows only the other set holds.
    fps = np.concatenate([np.arange(40, 0, -3), [7777, 7778], np.arange(100, 110)]).astype(np.uint64)
    kwargs = dict(dtype=np.float32, row_shape=(4,), alternatives=(other,))
    gathered = caches.lookup(target, {"kind": "t"}, fps, **kwargs)
    lazy = caches.lookup(target, {"kind": "t"}, fps, lazy=True, **kwargs)
    assert lazy.data is None and np.array_equal(lazy.hit, gathered.hit) and lazy.reason == gathered.reason
    copied = np.zeros_like(gathered.data)
    lazy.copy_into(copied, chunk_rows=3)
    np.testing.assert_array_equal(copied, gathered.data)
    assert gathered.hit.sum() == len(fps) - 2


def test_a_fill_is_trusted_only_once_committed(tmp_path):
    rng = np.random.default_rng(1)
    old = rng.normal(size=(30, 3)).astype(np.float32)
    target = _stored(tmp_path, np.arange(30), old)
    fps = np.arange(5, 40).astype(np.uint64)
    new = rng.normal(size=(35, 3)).astype(np.float16)

    fill = caches.Fill(target, new.shape, np.float16)
    fill.rows[np.arange(35)] = new
    fill.abandon()  # e.g. the run failed: the old set stands, nothing of the new one is left
    assert caches.lookup(target, {"kind": "t"}, np.arange(30).astype(np.uint64), lazy=True).in_order
    assert not list(tmp_path.glob(".*.tmp"))

    fill = caches.Fill(target, new.shape, np.float16)
    assert not caches.lookup(target, {"kind": "t"}, fps).in_order  # written in place, not trusted yet
    fill.rows[np.arange(0, 35, 2)] = new[::2]
    fill.rows[np.arange(1, 35, 2)] = new[1::2]
    read = fill.commit({"kind": "t"}, fps)
    assert read.path == target and read.dtype == np.float16
    np.testing.assert_array_equal(np.load(target), new)
    found = caches.lookup(target, {"kind": "t"}, fps, dtype=np.float16, row_shape=(3,), lazy=True)
    assert found.in_order and "all 35 rows reused" in found.reason
    assert not list(tmp_path.glob(".*.tmp"))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 60), st.integers(1, 5), st.sampled_from([np.float32, np.float16]), st.integers(1, 9),
       st.sampled_from([64, 100, 4096]), st.booleans(), st.integers(0, 2**31), st.integers(0, 70))
def test_a_fill_digested_while_written_records_the_digest_of_its_file(tmp_path_factory, n, d, dtype, batch, chunk,
                                                                     in_order, seed, written):
    """Rows written in file order are digested on the way in (no re-read at commit), those never written
    after them (a run interrupted part-way: ``written`` of the ``n`` rows) as the zeros they read as; any
    other order is digested at commit. Either way the manifest holds the digest of the file's bytes, in
    chunks of any size; a part-filled set gives a lookup exactly its filled rows."""
    folder = tmp_path_factory.mktemp("fill")
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n, d)).astype(dtype)
    rows = np.arange(n) if in_order else rng.permutation(n)
    rows = rows[: min(written, n)]
    filled = np.zeros(n, dtype=bool)
    filled[rows] = True
    fingerprints = rng.permutation(2 * n)[:n].astype(np.uint64)  # 0 among them at times: another marks the unfilled
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(caches, "DIGEST_CHUNK", chunk)
        fill = caches.Fill(folder / "c.npy", (n, d), dtype)
        for at in range(0, rows.size, batch):
            fill.rows[rows[at: at + batch]] = values[rows[at: at + batch]]
        fill.commit({"kind": "t"}, fingerprints, None if filled.all() else filled)
        manifest = json.loads(caches._files(folder / "c.npy").marker.read_text())
        with open(folder / "c.npy", "rb") as handle:
            assert manifest["files"]["data"]["digest"] == caches._digest_fd(handle.fileno(),
                                                                            os.fstat(handle.fileno()).st_size)
    assert caches.filled_rows(folder / "c.npy") == (None if filled.all() else (rows.size, n))
    np.testing.assert_array_equal(np.load(folder / "c.npy"), np.where(filled[:, None], values, 0))
    found = caches.lookup(folder / "c.npy", {"kind": "t"}, fingerprints, registry=False)
    np.testing.assert_array_equal(found.hit, filled)
    assert found.in_order == bool(filled.all())
    np.testing.assert_array_equal(found.data[filled], values[filled])


def test_fingerprints_beside_rows_that_cannot_be_theirs_are_refused(tmp_path):
    """A reviewer's rows in shuffled order beside a stale fingerprints file (10 entries, or floats, or text) were taken
    unchecked and unsaid; a part-filled set copied without its manifest was taken with its unfilled rows as zeros."""
    from diversity_order.errors import UserError

    fps = np.arange(1, 11, dtype=np.uint64)
    path, beside = tmp_path / "deep.npy", tmp_path / "deep.fingerprints.npy"
    np.save(path, truth(fps))

    def check():
        caches.require_row_order(path, fps, "--load-embeddings deep.npy", "row", "record", "the input's records")

    check()  # no fingerprints beside it: taken unchecked
    np.save(beside, fps[:4])
    with pytest.raises(UserError, match=r"^--load-embeddings deep.npy: deep.fingerprints.npy beside it is not its rows' "
                                        r"fingerprints \(4 entries for 10 rows\), so the rows' order cannot be checked"):
        check()
    for stale in (lambda: np.save(beside, fps.astype(np.float64)), lambda: beside.write_text("not numpy")):
        stale()
        with pytest.raises(UserError, match=r"not one uint64 per row \(unreadable\)"):
            check()
    caches.store(path, KEY, fps, truth(fps), filled=np.arange(10) < 6)
    (tmp_path / "deep.cache.json").unlink()
    with pytest.raises(UserError, match=r"4 of its rows were never computed \(an interrupted curate run's part-filled "
                                        r"set, copied without its manifest: deep.fingerprints.npy marks them\)"):
        check()
    caches.store(path, KEY, fps[::-1].copy(), truth(fps[::-1]))
    with pytest.raises(UserError, match="the rows are not in the order of the input's records"):
        check()
    caches.store(path, KEY, fps, truth(fps))
    check()
