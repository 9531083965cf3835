"""--packing split runs report the statistics of a plain concatenate-and-cut loop, and
--export-packed writes exactly those sequences, loadable with datasets."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import curate_dataset
from conftest import topical_records, write_jsonl
from diversity_order.cli import run_main

SEQ_LEN = 256


def curate(*args):
    return run_main(curate_dataset.main, [str(a) for a in args] + ["--no-progress", "--no-plot"])


def concatenate_and_cut(labels, counts, order, seq_len):
    """Unique clusters per window, the plain way: one label per token, cut every seq_len tokens; a
    zero-token document counts in the window of the token before it."""
    windows = []
    tokens_in_window = 0
    current = set()
    for row in order:
        if counts[row] == 0:
            current.add(labels[row])
            continue
        for _ in range(counts[row]):
            if tokens_in_window == seq_len:
                windows.append(len(current))
                current, tokens_in_window = set(), 0
            current.add(labels[row])
            tokens_in_window += 1
    if tokens_in_window:
        windows.append(len(current))
    return np.array(windows)


@pytest.fixture()
def corpus(tmp_path):
    records = topical_records(per_topic=25, seed=3)
    records[7]["text"] = ""  # a zero-token document
    return write_jsonl(tmp_path / "data.jsonl", records), records


def test_split_packing_run_reports_the_concatenate_and_cut_statistics(tmp_path, corpus, tiny_model_dir):
    src, _ = corpus
    out = tmp_path / "o" / "c.jsonl"
    assert curate("--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--seq-len", SEQ_LEN, "--packing", "split", "--ordering", "bin-packing") == 0
    meta = json.loads((tmp_path / "o" / "c_meta.json").read_text())
    labels, order = np.load(tmp_path / "o" / "c_labels.npy"), np.load(tmp_path / "o" / "c_order.npy")
    counts = np.load(tmp_path / "data_token_counts.npy")
    assert meta["packing"] == "split"
    for name, rows in (("curated", order), ("original", np.arange(labels.size))):
        expected = concatenate_and_cut(labels, counts, rows, SEQ_LEN)
        reported = meta["token_window_diversity"][name]
        assert reported["n_sequences"] == expected.size
        assert reported["min"] == expected.min()
        assert reported["mean"] == pytest.approx(expected.mean(), abs=0.005)


@pytest.mark.parametrize("groups", ["one", "several"])
def test_packed_export_loads_with_datasets_and_has_the_reported_diversity(tmp_path, corpus, tiny_model_dir, groups,
                                                                          monkeypatch):
    """"several": row groups of 3 sequences, files of 2 groups, as a large export is cut (memory is held to one
    row group: a new user's export held every sequence of a file as Python lists, 43 bytes per token)."""
    datasets = pytest.importorskip("datasets")  # a dev extra (save_to_disk folders)
    import pyarrow.parquet as pq

    from diversity_order import packed_export
    from diversity_order.diversity import window_counts
    from diversity_order.tokenizer import DocumentTokenizer

    if groups == "several":
        monkeypatch.setattr(packed_export, "ROW_GROUP_TOKENS", 3 * SEQ_LEN)
        monkeypatch.setattr(packed_export, "GROUPS_PER_SHARD", 2)
        monkeypatch.setattr(packed_export, "TOKENS_PER_READ", 500)  # tokenized a few documents at a time
        batches = []
        real = packed_export._documents_in_order
        monkeypatch.setattr(packed_export, "_documents_in_order",
                            lambda *a: (batches.append(len(rows)) or (rows, docs) for rows, docs in real(*a)))
    src, records = corpus
    packed = tmp_path / "packed"
    assert curate("--input", src, "--output", tmp_path / "o" / "c.jsonl", "--model-dir", tiny_model_dir,
                  "--n-clusters", 6, "--seq-len", SEQ_LEN, "--packing", "split", "--count-special-tokens", "eos",
                  "--export-packed", packed) == 0
    labels, order = np.load(tmp_path / "o" / "c_labels.npy"), np.load(tmp_path / "o" / "c_order.npy")
    files = sorted(str(p) for p in packed.glob("packed-*.parquet"))
    data = datasets.load_dataset("parquet", data_files=files, split="train")
    summary = json.loads((packed / "packed.json").read_text())
    meta = json.loads((tmp_path / "o" / "c_meta.json").read_text())
    assert len(data) == summary["sequences"] == meta["total_tokens"] // SEQ_LEN
    sizes = [[pq.ParquetFile(f).metadata.row_group(g).num_rows for g in range(pq.ParquetFile(f).num_row_groups)]
             for f in files]
    if groups == "several":
        assert len(batches) > 10 and sum(batches) == len(records)  # batches of up to 500 tokens, or one document
        assert len(files) == summary["shards"] == -(-len(data) // 6) >= 3
        assert all(s == [3, 3] for s in sizes[:-1]) and sum(sizes[-1]) == len(data) - 6 * (len(files) - 1)
        assert files[0].endswith(f"packed-00000-of-{len(files):05d}.parquet")
    else:
        assert sizes == [[len(data)]]
    assert meta["empty_documents"] == 1  # record 7's text has no tokens, though its count holds the EOS
    assert all(len(ids) == SEQ_LEN for ids in data["input_ids"])
    # The tokens: every document's ids plus its EOS, in the curated order, cut every SEQ_LEN tokens.
    tokenizer = DocumentTokenizer(tiny_model_dir)
    eos = tokenizer.special_tokens_per_document("eos")[1]
    stream = [t for row in order for t in tokenizer.encode(records[row]["text"]) + eos]
    assert [t for ids in data["input_ids"] for t in ids] == stream[: len(data) * SEQ_LEN]
    assert summary["tokens_dropped"] == len(stream) - len(data) * SEQ_LEN
    # Documents left out whole: those beginning at or past the last full sequence's end (each has its EOS).
    lengths = [len(tokenizer.encode(records[row]["text"])) + len(eos) for row in order]
    begins = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    assert summary["documents_dropped"] == int((begins >= len(data) * SEQ_LEN).sum())
    # Boundaries: each piece's tokens are its document's, and the diversity is what the run reports.
    unique, _ = window_counts(labels, np.load(tmp_path / "data_token_counts.npy") + 1, SEQ_LEN, order, "split")
    recomputed = [len(set(labels[rows].tolist())) for rows in data["document_rows"]]
    assert recomputed == unique[: len(data)].tolist()
    assert [list(c) for c in data["document_clusters"]] == [labels[rows].tolist() for rows in data["document_rows"]]
    for ids, starts, rows in zip(data["input_ids"][:5], data["document_starts"][:5], data["document_rows"][:5]):
        ends = list(starts[1:]) + [SEQ_LEN]
        for start, end, row in zip(starts, ends, rows):
            document = tokenizer.encode(records[row]["text"]) + eos
            assert _is_slice(ids[start:end], document)
    assert summary["unique_clusters_per_sequence"]["mean"] == pytest.approx(np.mean(recomputed))
    # animate_ordering, given the run's metadata, packs as the run did.
    from diversity_order.animate import load_inputs

    inputs = load_inputs(tmp_path / "data_token_counts.npy", meta=tmp_path / "o" / "c_meta.json")
    assert inputs.packing == "split" and inputs.token_counts.sum() == meta["total_tokens"]


def _is_slice(piece, document):
    return any(document[i: i + len(piece)] == piece for i in range(len(document) - len(piece) + 1))


def test_a_rerun_without_the_export_says_the_earlier_one_is_of_another_order(tmp_path, corpus, tiny_model_dir,
                                                                             caplog):
    """A new user appended records and reran without --export-packed: the export of the earlier order stayed,
    unmentioned. Now a warning names it on that run and every later one whose order differs from the one it
    holds (not removed: a trainer may be reading it); a run of the same order, or exporting there again, says
    nothing."""
    import logging

    src, _ = corpus
    packed = tmp_path / "packed"
    common = ["--input", src, "--output", tmp_path / "o" / "c.jsonl", "--model-dir", tiny_model_dir,
              "--n-clusters", 6, "--seq-len", SEQ_LEN, "--no-plot"]
    assert curate(*common, "--export-packed", packed) == 0
    said = f"{packed} holds the packed sequences of an earlier run's order, not this one's"
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--export-packed", packed) == 0
        assert curate(*common, "--output-shards", 2) == 0  # the same order (a second user saw it warned of)
        assert said not in caplog.text
        assert curate(*common, "--ordering", "random") == 0
        assert said in caplog.text
        caplog.clear()
        assert curate(*common, "--ordering", "random", "--seed", 7) == 0  # and so does every later run
        assert said in caplog.text
        caplog.clear()
        assert curate(*common, "--export-packed", packed) == 0  # the folder's order again: nothing to say
        assert said not in caplog.text
    assert (packed / "packed.json").is_file()


def test_a_stats_only_trial_leaves_the_curated_files_export(tmp_path, corpus, tiny_model_dir, caplog):
    """A --stats-only trial of another order, exporting into the folder that holds the curated file's export,
    replaced it without a word, while the curated file's metadata still described it. Now the trial leaves it,
    said; a trial of the same order, or into another folder, exports."""
    import logging

    src, _ = corpus
    packed = tmp_path / "packed"
    common = ["--input", src, "--output", tmp_path / "o" / "c.jsonl", "--model-dir", tiny_model_dir,
              "--n-clusters", 6, "--seq-len", SEQ_LEN, "--no-plot", "--packing", "split"]
    assert curate(*common, "--export-packed", packed) == 0
    real = {path.name: path.read_bytes() for path in packed.iterdir()}
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--export-packed", packed, "--stats-only", "--ordering", "paced") == 0
    assert {path.name: path.read_bytes() for path in packed.iterdir()} == real
    assert (f"--export-packed {packed}: holds the packed sequences of the curated file's order (its metadata "
            "records them); this --stats-only trial leaves them and exports nothing") in caplog.text
    assert json.loads((tmp_path / "o" / "c_stats-only_meta.json").read_text())["packed_export"] is None
    assert curate(*common, "--export-packed", tmp_path / "trial", "--stats-only", "--ordering", "paced") == 0
    assert (tmp_path / "trial" / "packed.json").is_file()


def test_the_export_folder_is_recorded_absolute(tmp_path, corpus, tiny_model_dir, monkeypatch, caplog):
    """Every path in the metadata is absolute: a relative --export-packed was recorded as given (a new user saw
    "out/packed" beside absolute paths), so a later run from another folder could not find the export to warn of."""
    import logging

    src, _ = corpus
    common = ["--input", src, "--output", tmp_path / "o" / "c.jsonl", "--model-dir", tiny_model_dir,
              "--n-clusters", 6, "--seq-len", SEQ_LEN, "--no-plot"]
    monkeypatch.chdir(tmp_path)
    assert curate(*common, "--export-packed", "packed") == 0
    assert json.loads((tmp_path / "o" / "c_meta.json").read_text())["packed_export"]["folder"] == str(tmp_path / "packed")
    monkeypatch.chdir(tmp_path / "o")
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--ordering", "random") == 0
    assert f"{tmp_path / 'packed'} holds the packed sequences of an earlier run's order" in caplog.text


def test_an_export_without_a_separator_or_packed_whole_is_warned_of_before_the_work(tmp_path, corpus, tiny_model_dir,
                                                                                     caplog):
    """A new user's export joined documents with no token between them, and its statistics (packed whole, 11.84
    clusters per window) were not those of the sequences exported (split: 13.09), without a word."""
    import logging

    src, _ = corpus
    common = ["--input", src, "--output", tmp_path / "o" / "c.jsonl", "--model-dir", tiny_model_dir,
              "--n-clusters", 6, "--seq-len", SEQ_LEN, "--export-packed", tmp_path / "packed"]
    with caplog.at_level(logging.WARNING):
        assert curate(*common) == 0
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("--export-packed with --count-special-tokens none: the documents' tokens are "
                            "concatenated with no token between them") for m in said)
    assert any(m.startswith("--export-packed cuts documents across sequences (packing split), while the statistics "
                            "follow --packing whole") for m in said)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--count-special-tokens", "eos", "--packing", "split") == 0
    assert not [r for r in caplog.records if r.getMessage().startswith("--export-packed")]


def test_a_run_stopped_while_exporting_leaves_the_earlier_files_and_export_known(tmp_path, corpus, tiny_model_dir,
                                                                                 monkeypatch, caplog):
    """A new user's run at another length was stopped while packing: it had replaced the curated file and removed
    the metadata naming the earlier export, so the next run, without --export-packed, never warned of it. The
    export is now made first and put in place with the curated file."""
    import logging

    from diversity_order import packed_export

    src, _ = corpus
    packed, out = tmp_path / "packed", tmp_path / "o" / "c.jsonl"
    common = ["--input", src, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6, "--no-plot",
              "--count-special-tokens", "eos", "--packing", "split"]
    assert curate(*common, "--seq-len", SEQ_LEN, "--export-packed", packed) == 0
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
              and (p.parent == packed or p.name in ("c.jsonl", "c_meta.json"))}

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(packed_export._Packer, "add", stopped)
    assert curate(*common, "--seq-len", 2 * SEQ_LEN, "--export-packed", packed, "--ordering", "random") == 130
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()
             and (p.parent == packed or p.name in ("c.jsonl", "c_meta.json"))}
    assert after == before  # the curated file, its metadata and the export, as they were
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".packed")]  # no staging left
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--seq-len", 2 * SEQ_LEN, "--ordering", "random") == 0
    assert f"{packed} holds the packed sequences of an earlier run's order, not this one's" in caplog.text


def test_a_killed_exports_staging_folder_is_removed_by_a_later_run(tmp_path, corpus, tiny_model_dir):
    """A reviewer's killed exports left .packed.XXXX.tmp folders (up to 64 MiB a row group) that no run removed."""
    from diversity_order import atomic

    src, _ = corpus
    packed = tmp_path / "packed"
    dead = tmp_path / f".packed.{atomic._HOST}.999999999.abcd1234.tmp"  # no such process
    live = tmp_path / f".packed.{atomic._HOST}.1.abcd1234.tmp"  # pid 1 is alive: never a live run's
    for folder in (dead, live):
        folder.mkdir()
        (folder / "packed-00000-of-00001.parquet").write_bytes(b"partial")
    assert curate("--input", src, "--output", tmp_path / "o" / "c.jsonl", "--model-dir", tiny_model_dir,
                  "--n-clusters", 6, "--seq-len", SEQ_LEN, "--packing", "split", "--count-special-tokens", "eos",
                  "--export-packed", packed) == 0
    assert not dead.exists() and live.exists() and (packed / "packed.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".packed")] == [live.name]


def test_an_unchanged_export_is_kept_and_any_change_makes_it_again(tmp_path, corpus, tiny_model_dir, caplog):
    """A reviewer's reruns of an unchanged 1M-record run rebuilt the export each time (22-35 s). The same documents in
    the same order, with the same tokenizer and settings, and every file at its recorded size, keep it; another
    order, length or separator, an edited record, or a damaged file make it again, and what is made equals a first
    export byte for byte."""
    import logging

    src, records = corpus
    packed = tmp_path / "packed"
    common = ["--input", src, "--output", tmp_path / "o" / "c.jsonl", "--model-dir", tiny_model_dir,
              "--n-clusters", 6, "--seq-len", SEQ_LEN, "--packing", "split", "--export-packed", packed]
    kept = "already holds these packed sequences"
    assert curate(*common) == 0
    first = {p.name: p.read_bytes() for p in packed.iterdir()}
    with caplog.at_level(logging.INFO):
        assert curate(*common) == 0
    assert kept in caplog.text and {p.name: p.read_bytes() for p in packed.iterdir()} == first
    meta = json.loads((tmp_path / "o" / "c_meta.json").read_text())
    assert meta["packed_export"]["folder"] == str(packed) and meta["packed_export"]["sequences"] > 0

    def made_again(*extra) -> bool:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert curate(*common, *extra) == 0
        return kept not in caplog.text

    assert made_again("--ordering", "random")
    assert made_again("--ordering", "random", "--count-special-tokens", "eos")
    assert made_again()  # back to the first: equal to the first export
    assert {p.name: p.read_bytes() for p in packed.iterdir()} == first
    shard = next(packed.glob("packed-*.parquet"))
    shard.write_bytes(shard.read_bytes()[:-10])  # a damaged file
    assert made_again() and {p.name: p.read_bytes() for p in packed.iterdir()} == first
    (packed / "packed-00001-of-00001.parquet").write_bytes(shard.read_bytes())  # a copy a reader would read too
    assert made_again() and {p.name: p.read_bytes() for p in packed.iterdir()} == first
    # The folder's EOS changed (tokenizer.json, which its fingerprint covers, did not): the separators differ.
    assert made_again("--count-special-tokens", "eos")
    config = tiny_model_dir / "tokenizer_config.json"
    original = config.read_bytes()
    settings = json.loads(original)
    vocab = json.loads((tiny_model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    other = next(token for token in vocab if token != settings.get("eos_token") and token.startswith("<"))
    config.write_text(json.dumps({**settings, "eos_token": other}))
    try:
        assert made_again("--count-special-tokens", "eos")
    finally:
        config.write_bytes(original)
    edited = [dict(r) for r in records]
    edited[3]["text"] += " edited"
    write_jsonl(src, edited)
    assert made_again()


def test_the_export_says_what_it_wrote_and_warns_when_it_is_empty(tmp_path, corpus, tiny_model_dir, caplog):
    """The log gives the sequences written and the tokens left out (it said only "Exporting ... done"); an export of
    no full sequence (a --seq-len above the data's tokens) is warned of: the folder holds no packed files, and the
    README's loader then fails on an empty file list."""
    import logging

    src, _ = corpus
    common = ["--input", src, "--model-dir", tiny_model_dir, "--n-clusters", 6, "--no-plot"]
    with caplog.at_level(logging.INFO):
        assert curate(*common, "--output", tmp_path / "a" / "c.jsonl", "--seq-len", SEQ_LEN,
                      "--export-packed", tmp_path / "a" / "packed") == 0
    said = json.loads((tmp_path / "a" / "packed" / "packed.json").read_text())
    assert said["sequences"] > 0
    assert (f"Packed export: {said['sequences']} sequences of {SEQ_LEN} tokens in {said['shards']} shard(s); the last "
            f"{said['tokens_dropped']:,} tokens") in caplog.text
    total = int(np.load(tmp_path / "a" / "c_order.npy").size)  # (a count of records, for the next run's length)
    caplog.clear()
    huge = 10_000_000
    with caplog.at_level(logging.WARNING):
        assert curate(*common, "--output", tmp_path / "b" / "c.jsonl", "--seq-len", huge,
                      "--export-packed", tmp_path / "b" / "packed") == 0
    said = json.loads((tmp_path / "b" / "packed" / "packed.json").read_text())
    assert said["sequences"] == 0 and said["documents_dropped"] == total
    assert (f"--export-packed {tmp_path / 'b' / 'packed'}: no sequence of {huge} tokens could be filled (the data "
            f"hold {said['tokens_dropped']} tokens)") in caplog.text


@given(st.lists(st.integers(0, 9), min_size=1, max_size=40), st.integers(1, 8), st.integers(1, 3))
@settings(max_examples=300, deadline=None)
def test_packed_starts_are_positions_and_a_zero_token_document_repeats_a_neighbours(lengths, seq_len, group):
    """Every start lies in the sequence (a zero-token document after a full sequence's last token was given start
    seq_len, which a loader would take for a piece of no tokens at the end); the starts of one sequence never go
    down; a zero-token document's start is the next piece's, or where none follows in its sequence the previous
    one's; the ids are the documents' tokens, cut every seq_len."""
    from diversity_order.packed_export import _Packer

    emitted = []
    packer = _Packer(seq_len, group, lambda ids, starts, rows: emitted.extend(
        (list(i), list(s), list(r)) for i, s, r in zip(ids.tolist(), starts, rows)))
    stream = []
    for row, length in enumerate(lengths):
        ids = np.arange(len(stream), len(stream) + length, dtype=np.int32)
        stream += ids.tolist()
        packer.add(row, ids)
    packer.finish()
    assert [t for ids, _, _ in emitted for t in ids] == stream[: len(emitted) * seq_len]
    for _, starts, rows in emitted:
        assert all(0 <= start < seq_len for start in starts) and starts == sorted(starts)
        for i, row in enumerate(rows):
            if lengths[row] == 0:
                following = [starts[j] for j in range(i + 1, len(rows)) if lengths[rows[j]] > 0]
                before = [starts[j] for j in range(i) if lengths[rows[j]] > 0]
                assert starts[i] == (following[0] if following else before[-1])
