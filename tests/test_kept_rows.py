"""What an interrupted torchrun run kept (``kept_rows``), put together by the next run: the rows every rank said it
wrote become the embedding cache, part-filled, and their counts join the token-count cache; a set missing a rank's
word, copied in part, or of another key is removed, never used."""

import logging

import numpy as np
import pytest

from diversity_order import caches, kept_rows
from diversity_order.embed import Finished

KEY = {"kind": "test", "dim": 3}
COUNT_KEY = {"kind": "token_counts", "tokenizer": "t"}


def _unit(rows):
    """Row i's embedding in these tests: a unit vector, as every embedding is, that says which row it is."""
    angle = np.asarray(rows, np.float32) / 10
    return np.stack([np.cos(angle), np.sin(angle), np.zeros_like(angle)], axis=1)


def _interrupted_run(folder, n=10, ranks=2, written=((0, 1, 2), (6, 7)), copied_all=None, copies=True):
    """A shared file of ``n`` rows as the ranks leave it when stopped: rank r wrote rows ``written[r]`` (row i
    holds ``_unit(i)``)."""
    target = folder / "c_embeddings.npy"
    shared = folder / ".c_embeddings.npy.host.1.x.tmp"
    data = np.zeros((n, 3), np.float32)
    fingerprints = np.arange(100, 100 + n, dtype=np.uint64)
    for rows in written:
        data[list(rows)] = _unit(rows)
    with open(shared, "wb") as handle:
        np.save(handle, data)
    kept_rows.start(target, shared, KEY, COUNT_KEY, fingerprints, ranks, copies=copies)
    for rank, rows in enumerate(written):
        work = kept_rows.RankWork(copied_all=True if copied_all is None else copied_all[rank])
        work.computed = Finished(np.asarray(rows, np.int64), np.asarray(rows, np.int64) * 10)
        kept_rows.keep(rank, target, shared, work, KeyboardInterrupt())
    return target, fingerprints


def test_the_rows_every_rank_wrote_become_the_cache_and_their_counts_the_count_cache(tmp_path, caplog):
    target, fingerprints = _interrupted_run(tmp_path)
    counts_path = tmp_path / "d_token_counts.npy"
    caches.store(counts_path, COUNT_KEY, fingerprints, np.arange(10) * 10 + 1, filled=np.arange(10) == 9)
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        kept_rows.recover(target, KEY, [counts_path], COUNT_KEY)
    assert "5 of 10 rows kept by an interrupted torchrun run are now c_embeddings.npy" in caplog.text
    found = caches.lookup(target, KEY, fingerprints, dtype=np.float32, row_shape=(3,))
    assert np.flatnonzero(found.hit).tolist() == [0, 1, 2, 6, 7]
    assert np.array_equal(found.data[found.hit], _unit([0, 1, 2, 6, 7]))
    counted = caches.lookup(counts_path, COUNT_KEY, fingerprints, dtype=np.int64, row_shape=())
    assert np.flatnonzero(counted.hit).tolist() == [0, 1, 2, 6, 7, 9]  # the count cached before is kept
    assert counted.data[counted.hit].tolist() == [0, 10, 20, 60, 70, 91]
    assert sorted(p.name for p in tmp_path.iterdir() if "kept" in p.name or p.suffix == ".tmp") == []
    kept_rows.recover(target, KEY, [counts_path], COUNT_KEY)  # nothing left: nothing done
    assert caches.filled_rows(target) == (5, 10)


@pytest.mark.parametrize("damage, why", [
    ("a rank said nothing", "rank 1 was stopped before it said what it had written"),
    ("a rank's file cut short", "rank 1's file c_embeddings.kept.rank1.npz is damaged"),
    ("copied in part", "a rank was stopped while copying the cached rows in"),
    ("another key", "computed with another dim); removed; their 5 token counts are"),
    ("another count key", "counted with another tokenizer"),
    ("no rows file", "its rows file is gone"),
])
def test_what_cannot_be_trusted_is_removed_and_said(tmp_path, caplog, damage, why):
    target, fingerprints = _interrupted_run(tmp_path, copied_all=(True, damage != "copied in part"))
    if damage == "a rank said nothing":
        kept_rows.rank_path(target, 1).unlink()
    if damage == "a rank's file cut short":  # (a reviewer's was a zipfile.BadZipFile traceback)
        cut = kept_rows.rank_path(target, 1)
        cut.write_bytes(cut.read_bytes()[:100])
    if damage == "no rows file":
        (tmp_path / "c_embeddings.kept.npy").unlink()
    counts = tmp_path / "counts" / "t.npy"
    counts.parent.mkdir()
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        kept_rows.recover(target, KEY if damage != "another key" else {**KEY, "dim": 4}, [counts],
                          COUNT_KEY if damage != "another count key" else {**COUNT_KEY, "tokenizer": "u"})
    assert f"not reused ({why}" in caplog.text
    assert not target.exists() and [p.name for p in tmp_path.iterdir()] == ["counts"]
    # Embeddings of another model, the same tokenizer: their counts are taken.
    assert caches.filled_rows(counts) == ((5, 10) if damage == "another key" else None)


def test_when_nothing_was_copied_the_ranks_that_said_are_taken_without_one_that_did_not(tmp_path, caplog):
    """A rank killed outright (out of memory) says nothing; where no rank had cached rows to copy in, the cache the
    kept rows replace loses nothing, so the others' rows are taken."""
    target, fingerprints = _interrupted_run(tmp_path, copies=False)
    kept_rows.rank_path(target, 1).unlink()
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        kept_rows.recover(target, KEY, [tmp_path / "t.npy"], COUNT_KEY)
    assert "(rank(s) 1 said nothing: their rows are done again)" in caplog.text
    found = caches.lookup(target, KEY, fingerprints, dtype=np.float32, row_shape=(3,))
    assert np.flatnonzero(found.hit).tolist() == [0, 1, 2]


def test_a_run_that_embeds_nothing_takes_the_counts_and_leaves_the_rows_for_one_that_does(tmp_path, caplog):
    target, fingerprints = _interrupted_run(tmp_path)
    counts = tmp_path / "t.npy"
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        kept_rows.recover(target, None, [counts], COUNT_KEY, embeds=False)
    assert "are left for a run that embeds" in caplog.text and caches.filled_rows(counts) == (5, 10)
    assert (tmp_path / "c_embeddings.kept.npy").exists() and not target.exists()
    kept_rows.recover(target, KEY, [counts], COUNT_KEY)
    assert caches.filled_rows(target) == (5, 10) and not (tmp_path / "c_embeddings.kept.npy").exists()


def test_the_ranks_files_say_what_each_wrote_and_rank_0_moves_the_shared_file(tmp_path):
    target, _ = _interrupted_run(tmp_path, written=((0, 1), (), (5,)), ranks=3)
    assert (tmp_path / "c_embeddings.kept.npy").exists() and not list(tmp_path.glob(".*.tmp"))
    said = [np.load(kept_rows.rank_path(target, rank)) for rank in range(3)]
    assert [part["computed"].tolist() for part in said] == [[0, 1], [], [5]]
    assert [part["counts"].tolist() for part in said] == [[0, 10], [], [50]]


def test_counts_alone_kept_by_ranks_join_the_count_cache(tmp_path, caplog):
    """Ranks that only counted tokens (--load-embeddings) keep their counts; no embedding set is written."""
    target = tmp_path / "d_token_counts.npy"
    fingerprints = np.arange(100, 110, dtype=np.uint64)
    kept_rows.start(target, None, None, COUNT_KEY, fingerprints, 2)
    for rank, rows in enumerate(((0, 1), (5, 6, 7))):
        work = kept_rows.RankWork(copied_all=True, computed=Finished(np.asarray(rows), np.asarray(rows) * 3))
        kept_rows.keep(rank, target, None, work, KeyboardInterrupt())
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        kept_rows.recover(target, None, [target], {**COUNT_KEY, "tokenizer": "another"})
    assert "not reused (counted with another tokenizer); removed" in caplog.text
    assert not target.exists() and not list(tmp_path.iterdir())
    kept_rows.start(target, None, None, COUNT_KEY, fingerprints, 2)
    for rank, rows in enumerate(((0, 1), (5, 6, 7))):
        work = kept_rows.RankWork(copied_all=True, computed=Finished(np.asarray(rows), np.asarray(rows) * 3))
        kept_rows.keep(rank, target, None, work, KeyboardInterrupt())
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        kept_rows.recover(target, None, [target], COUNT_KEY)
    assert "Token counts: 5 of 10 rows kept by an interrupted torchrun run are now in d_token_counts.npy" in caplog.text
    counted = caches.lookup(target, COUNT_KEY, fingerprints, dtype=np.int64, row_shape=())
    assert np.flatnonzero(counted.hit).tolist() == [0, 1, 5, 6, 7]
    assert counted.data[counted.hit].tolist() == [0, 3, 15, 18, 21]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d_token_counts.cache.json", "d_token_counts.fingerprints.npy",
                                                          "d_token_counts.npy"]


def test_a_rank_that_finished_before_the_stop_is_counted_by_what_it_said_when_done(tmp_path, caplog):
    """A rank done with its part says so before the collective that ends the work; stopped later (outside the work),
    it writes nothing more, and the rows it said are taken with those of the rank stopped mid-way."""
    target = tmp_path / "c_embeddings.npy"
    shared = tmp_path / ".c_embeddings.npy.host.1.x.tmp"
    data = _unit(np.arange(10))
    with open(shared, "wb") as handle:
        np.save(handle, data)
    fingerprints = np.arange(100, 110, dtype=np.uint64)
    kept_rows.start(target, shared, KEY, COUNT_KEY, fingerprints, 2)
    done = kept_rows.RankWork(copied_all=True, computed=Finished(np.arange(5, 10), np.arange(5, 10)))
    assert kept_rows.say(1, target, done)
    with pytest.raises(KeyboardInterrupt):
        with kept_rows.keeping(0, target, shared, kept_rows.RankWork(copied_all=True)) as work:
            work.computed = Finished(np.arange(0, 2), np.arange(0, 2))
            raise KeyboardInterrupt
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        kept_rows.recover(target, KEY, [tmp_path / "counts.npy"], COUNT_KEY)
    found = caches.lookup(target, KEY, fingerprints, dtype=np.float32, row_shape=(3,))
    assert np.flatnonzero(found.hit).tolist() == [0, 1, 5, 6, 7, 8, 9]
    assert np.array_equal(found.data[found.hit], data[found.hit])


def test_kept_rows_damaged_on_disk_are_embedded_again(tmp_path, caplog):
    """A reviewer flipped a byte of row 100 in a kept file no digest covers: 5.26e36 in the cache, and every later
    run trusted it. A kept row that is not what an embedding is (a unit vector, or zeros) is not taken: the rows
    around it are."""
    target, fingerprints = _interrupted_run(tmp_path)
    kept = tmp_path / "c_embeddings.kept.npy"
    header = kept.stat().st_size - 10 * 3 * 4
    raw = bytearray(kept.read_bytes())
    raw[header + (6 * 3 + 1) * 4 + 3] ^= 0x7F  # row 6, its second value's sign and exponent
    raw[header + (1 * 3 + 0) * 4 + 3] ^= 0x01  # row 1: one exponent bit, the value halved or doubled
    kept.write_bytes(bytes(raw))
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        kept_rows.recover(target, KEY, [tmp_path / "counts.npy"], COUNT_KEY)
    assert ("2 of them are not unit vectors, as every embedding is (damaged on disk since?; the first: row 1); "
            "embedded again") in caplog.text
    found = caches.lookup(target, KEY, fingerprints, dtype=np.float32, row_shape=(3,))
    assert np.flatnonzero(found.hit).tolist() == [0, 2, 7]
    assert np.array_equal(found.data[found.hit], _unit([0, 2, 7]))
