"""Checked .npy inputs: a file that is not a .npy array says what it looks like."""

import gzip

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order.arrays import load_npy
from diversity_order.errors import UserError


def test_a_real_npy_loads(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(6, dtype=np.int64).reshape(2, 3))
    assert load_npy(path, "--labels").tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("content,looks", [
    (b'{"text": "a record"}\n{"text": "another"}\n', "JSONL text"),
    (b"text,label\nhello,1\n", "text"),
    (gzip.compress(b"whatever", mtime=0), "gzip data"),
    (b"PK\x03\x04rest of a zip", "a zip archive"),
    (b"\x80\x04\x95pickle bytes", "a Python pickle"),
])
def test_not_an_npy_file_says_what_it_looks_like(tmp_path, content, looks):
    path = tmp_path / "embeddings.npy"
    path.write_bytes(content)
    with pytest.raises(UserError) as caught:
        load_npy(path, "--load-embeddings")
    message = str(caught.value)
    assert message.startswith(f"--load-embeddings {path}: not a .npy array") and looks in message
    assert "allow_pickle" not in message and "\n" not in message


def test_a_truncated_npy_is_named(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros((100, 8), dtype=np.float32))
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(UserError, match=r"--labels .*a\.npy: not a readable \.npy file"):
        load_npy(path, "--labels")


def test_a_folder_is_said_to_be_one_naming_an_array_in_it(tmp_path):
    """A reviewer's compare_clusterings.py --shallow out (the run's folder) was told "file not found"."""
    with pytest.raises(UserError, match=rf"^--shallow {tmp_path}: is a folder; give the .npy file$"):
        load_npy(tmp_path, "--shallow")
    np.save(tmp_path / "c_embeddings.fingerprints.npy", np.zeros(2, np.uint64))  # a reviewer was pointed at this
    np.save(tmp_path / "a_labels.npy", np.zeros(2, np.int64))
    np.save(tmp_path / "c_embeddings.npy", np.zeros((2, 2), np.float32))
    with pytest.raises(UserError, match=r"is a folder; give the .npy file \(e.g. .*/c_embeddings.npy\)$"):
        load_npy(tmp_path, "--shallow")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=60), st.sampled_from([np.int64, np.uint64, np.int32]))
def test_distinct_is_numpys_unique(values, dtype):
    """The sorting ``distinct`` (numpy 2.4's hashing unique took 15 s on 10M row numbers) against np.unique."""
    from diversity_order.arrays import distinct

    info = np.iinfo(dtype)
    x = np.array([v for v in values if info.min <= v <= info.max], dtype=dtype)
    np.testing.assert_array_equal(distinct(x), np.unique(x))
    assert distinct(x).dtype == x.dtype


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=50), st.lists(st.integers(0, 40), max_size=50),
       st.sampled_from([np.int64, np.uint64]), st.booleans())
def test_member_is_numpys_isin(values, pool, dtype, other_dtype):
    """The sorting ``member`` (numpy 2.4's isin dedupes with its hashing unique) against np.isin, including empty
    arrays, repeats and a pool of another dtype."""
    from diversity_order.arrays import member

    x = np.array(values, dtype=dtype)
    y = np.array(pool, dtype=np.int32 if other_dtype else dtype)
    np.testing.assert_array_equal(member(x, y), np.isin(x, y))
    assert member(x, y).dtype == bool
