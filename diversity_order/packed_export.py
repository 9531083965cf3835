"""``--export-packed DIR``: the curated order as ready training sequences, so each sequence keeps
its diversity even in a trainer that shuffles sequences.

Documents are tokenized in the curated order (with the special tokens of
``--count-special-tokens``), concatenated and cut every ``seq_len`` tokens: the ``split`` packing
model (``packing.py``), so the exported sequences are exactly the windows whose diversity a
``--packing split`` run reports. The last, partial sequence is left out (as Hugging Face's
``group_texts`` and Megatron do); ``packed.json`` says how many tokens that drops.

Each Parquet row (``DIR/packed-00000-of-0000N.parquet``, loadable with
``datasets.load_dataset("parquet", data_files=...)``) holds:

    input_ids          exactly seq_len token ids (int32)
    document_starts    where each document piece in the sequence starts (int32; the first is 0;
                       a zero-token document repeats its neighbour's start), so a loader can mask
                       attention across documents
    document_rows      the input row (position in the input) of each piece (int64)
    document_clusters  its k-means cluster (int32)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .arrow_sources import replace_folder
from .atomic import give_plain_permissions, note_target, temp_prefix
from .errors import UserError
from .runtime import Progress

log = logging.getLogger(__name__)

# Token ids held at once: one row group of sequences (int32, 64 MiB), whatever the data's size; a Parquet file
# holds GROUPS_PER_SHARD of them (about 1 GiB of ids). A reader loads one row group at a time.
ROW_GROUP_TOKENS = 1 << 24
GROUPS_PER_SHARD = 16
DOCUMENTS_PER_READ = 4096
TOKENS_PER_READ = 1 << 19
MARKER = "packed.json"


def order_digest(order: np.ndarray) -> str:
    """The order an export holds, as a digest a later run compares its own order with."""
    return hashlib.blake2b(np.ascontiguousarray(order, dtype="<i8").tobytes(), digest_size=16).hexdigest()


def content_key(source, order: np.ndarray, counts: np.ndarray, labels: np.ndarray, tokenizer_fingerprint: str,
                seq_len: int, special_ids: list) -> str:
    """A digest of everything an export's bytes follow from: the documents (their fingerprints) in the order, their
    token counts and clusters, the tokenizer, the ids put around each document (the folder's EOS may change while
    its tokenizer.json does not), the length and the file layout."""
    order = np.ascontiguousarray(order, dtype="<i8")
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps([seq_len, special_ids, tokenizer_fingerprint, ROW_GROUP_TOKENS, GROUPS_PER_SHARD,
                              EXPORT_LAYOUT]).encode())
    for values in (order, np.asarray(source.fingerprints)[order], np.asarray(counts)[order],
                   np.asarray(labels)[order]):
        digest.update(np.ascontiguousarray(values, dtype="<i8").tobytes())
    return digest.hexdigest()


EXPORT_LAYOUT = 1  # the columns and their types; raised when they change, so an earlier export is not kept


def _unchanged_export(folder: Path, key: str) -> dict | None:
    """The marker of an export in ``folder`` made from the same content (``content_key``) whose files are all there
    at the sizes it recorded; None otherwise (it is made again)."""
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("content_key") != key or not isinstance(meta.get("file_bytes"), dict):
        return None
    sizes = meta["file_bytes"]
    try:
        # No Parquet file it does not list either: a reader of the folder's files would read it too.
        if sorted(sizes) != sorted(meta.get("files", [])) or \
                sorted(path.name for path in folder.glob("*.parquet")) != sorted(sizes) or \
                any((folder / name).stat().st_size != size for name, size in sizes.items()):
            return None
    except (OSError, TypeError):
        return None
    return meta


def check_folder(folder: Path) -> None:
    """The export replaces ``folder``: refuse one that holds anything but an earlier export."""
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / MARKER).is_file())):
        raise UserError(f"--export-packed {folder}: exists and is not an earlier packed export; the export "
                        "replaces the folder: choose a new one")


class _Packer:
    """Concatenate documents and cut every ``seq_len`` tokens into a buffer of ``group`` sequences (int32: the
    only memory that grows with tokens), keeping each piece's start and row per sequence. Each time the buffer is
    full, and at the end, ``emit(ids, starts, rows)`` takes its finished sequences."""

    def __init__(self, seq_len: int, group: int, emit):
        self.seq_len, self.group, self.emit = seq_len, group, emit
        self.ids = np.empty((group, seq_len), dtype=np.int32)
        self.sequence = 0  # the buffer's row being filled
        self.fill = 0  # its tokens so far
        self.starts: list[list[int]] = [[]]  # per buffered sequence, the last being filled
        self.rows: list[list[int]] = [[]]
        self.last_closed_row = -1  # the row of the last piece of the last full sequence

    def add(self, row: int, ids: np.ndarray) -> None:
        if not ids.size:  # a zero-token document belongs to the window of the token before it
            # its start: the next piece's, or, the window full, the piece before it's (seq_len is no position)
            self.starts[-1].append(self.fill if self.fill < self.seq_len else self.starts[-1][-1])
            self.rows[-1].append(row)
            return
        position = 0
        while position < ids.size:
            if self.fill == self.seq_len:
                self._close()
            take = min(ids.size - position, self.seq_len - self.fill)
            self.starts[-1].append(self.fill)
            self.rows[-1].append(row)
            self.ids[self.sequence, self.fill: self.fill + take] = ids[position: position + take]
            self.fill += take
            position += take

    def finish(self) -> tuple[int, int]:
        """Close the last sequence if full and emit what the buffer holds; returns the tokens left over (dropped)
        and the documents all of whose tokens they hold (the first of them may have begun in the last full
        sequence)."""
        if self.fill == self.seq_len:
            self._close()
        if self.sequence:
            self.emit(self.ids[: self.sequence], self.starts[: self.sequence], self.rows[: self.sequence])
        rows = set(self.rows[-1])
        rows.discard(self.last_closed_row)  # in the tail too: it began in the last full sequence
        return self.fill, len(rows)

    def _close(self) -> None:
        if self.rows[-1]:
            self.last_closed_row = self.rows[-1][-1]
        self.sequence += 1
        self.fill = 0
        if self.sequence == self.group:
            self.emit(self.ids, self.starts, self.rows)
            self.sequence, self.starts, self.rows = 0, [[]], [[]]
        else:
            self.starts.append([])
            self.rows.append([])


def _lists(pa, values: np.ndarray, lengths: list[int], item_type):
    """A Parquet list column from flat ``values`` and each list's length (no Python object per value)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=item_type))


def _documents_in_order(source, order: np.ndarray, counts: np.ndarray):
    """(rows, documents) in ``order``, read and tokenized a batch at a time: at most ``DOCUMENTS_PER_READ``
    documents and ``TOKENS_PER_READ`` tokens (the tokenizer holds ~350 bytes per token of a batch while it works;
    a document longer than that goes alone)."""
    lo = 0
    while lo < order.size:
        chunk = order[lo: lo + DOCUMENTS_PER_READ]
        fits = int(np.searchsorted(np.cumsum(counts[chunk]), TOKENS_PER_READ, side="right"))
        chunk = chunk[: max(fits, 1)]
        lo += chunk.size
        found = {}
        for rows, documents in source.iter_documents(np.sort(chunk)):
            found.update(zip(rows.tolist(), documents))
        yield chunk.tolist(), [found[row] for row in chunk.tolist()]


@dataclass
class StagedExport:
    """An export written beside its folder, not yet in place: ``place`` puts it there (replacing an earlier one,
    atomically), ``discard`` removes it."""

    summary: dict  # what packed.json says, and the folder
    staging: Path | None
    folder: Path

    def place(self) -> None:
        if self.staging is not None:  # None: the folder already holds this export (kept)
            replace_folder(self.staging, self.folder)

    def discard(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)


def export(source, order: np.ndarray, counts: np.ndarray, tokenizer, seq_len: int, special_mode: str, folder: Path,
           labels: np.ndarray, progress: bool = True) -> StagedExport:
    """Write the packed sequences of ``order`` beside ``folder``, to be put there by the caller (with the curated
    files it describes: a run stopped before then leaves the earlier export, and the metadata naming it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_folder(folder)
    before, after = (np.asarray(tokens, dtype=np.int64) for tokens in tokenizer.special_tokens_per_document(special_mode))
    key = content_key(source, order, counts, labels, tokenizer.fingerprint, seq_len, [before.tolist(), after.tolist()])
    kept = _unchanged_export(folder, key)
    if kept is not None:
        log.info("%s already holds these packed sequences (the same documents in the same order, tokenizer and "
                 "settings; every file at its recorded size, no other): kept, not made again", folder)
        return StagedExport({**kept, "folder": os.path.abspath(folder)}, None, folder)
    n_sequences = int(counts.sum()) // seq_len
    group = max(1, ROW_GROUP_TOKENS // seq_len)
    per_shard = group * GROUPS_PER_SHARD
    n_shards = max(1, -(-n_sequences // per_shard))
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Named as atomic writes' temps (host, process): a killed run's is removed by a later run (``sweep_stale_temps``).
    note_target(folder)
    staging = Path(tempfile.mkdtemp(prefix=temp_prefix(folder), suffix=".tmp", dir=folder.parent))
    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("document_starts", pa.list_(pa.int32())),
                        ("document_rows", pa.list_(pa.int64())), ("document_clusters", pa.list_(pa.int32()))])
    state = {"writer": None, "in_shard": 0, "shard": 0, "written": 0}
    unique = []

    def emit(ids: np.ndarray, starts: list[list[int]], rows: list[list[int]]) -> None:
        lengths = [len(r) for r in rows]
        flat_rows = np.fromiter((row for r in rows for row in r), dtype=np.int64, count=sum(lengths))
        clusters = labels[flat_rows].astype(np.int32)
        bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        unique.extend(int(np.unique(clusters[lo:hi]).size) for lo, hi in zip(bounds[:-1], bounds[1:]))
        table = pa.table([_lists(pa, ids.ravel(), [seq_len] * len(rows), pa.int32()),
                          _lists(pa, np.fromiter((x for r in starts for x in r), dtype=np.int32, count=sum(lengths)),
                                 lengths, pa.int32()),
                          _lists(pa, flat_rows, lengths, pa.int64()),
                          _lists(pa, clusters, lengths, pa.int32())], schema=schema)
        if state["writer"] is None:
            path = staging / f"packed-{state['shard']:05d}-of-{n_shards:05d}.parquet"
            state["writer"] = pq.ParquetWriter(path, schema)
        state["writer"].write_table(table, row_group_size=len(rows))
        state["in_shard"] += len(rows)
        state["written"] += len(rows)
        if state["in_shard"] >= per_shard:
            close_shard()

    def close_shard() -> None:
        if state["writer"] is not None:
            state["writer"].close()
            give_plain_permissions(staging / f"packed-{state['shard']:05d}-of-{n_shards:05d}.parquet")
            state["writer"], state["in_shard"] = None, 0
            state["shard"] += 1

    packer = _Packer(seq_len, group, emit)
    try:
        with Progress(int(order.size), "Packing", bar=progress) as bar:
            for rows, documents in _documents_in_order(source, np.asarray(order, dtype=np.int64), counts):
                flat, lengths = tokenizer.encode_batch(documents)
                offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
                for i, row in enumerate(rows):
                    ids = flat[offsets[i]: offsets[i + 1]]
                    if before.size or after.size:
                        ids = np.concatenate([before, ids, after])
                    if ids.size != int(counts[row]):
                        raise UserError(f"{source.where(row)}: {ids.size} tokens now, {int(counts[row])} when counted; "
                                        "the input or the tokenizer changed during the run")
                    packer.add(row, ids)
                bar.update(len(rows))
        dropped, documents_dropped = packer.finish()
        close_shard()
        written = state["written"]
        file_bytes = {p.name: p.stat().st_size for p in sorted(staging.glob("packed-*.parquet"))}
        meta = {"seq_len": seq_len, "order_blake2b": order_digest(order), "sequences": written,
                "shards": state["shard"], "tokens": written * seq_len,
                "tokens_dropped": dropped, "documents_dropped": documents_dropped, "count_special_tokens": special_mode,
                "tokenizer": tokenizer.fingerprint,
                "unique_clusters_per_sequence": {"mean": float(np.mean(unique)) if unique else 0.0,
                                                 "min": int(min(unique)) if unique else 0},
                "files": sorted(file_bytes), "file_bytes": file_bytes,
                "content_key": key}
        (staging / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        give_plain_permissions(staging / MARKER)
        os.chmod(staging, 0o755)
    except BaseException:
        if state["writer"] is not None:
            state["writer"].close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return StagedExport({**meta, "folder": os.path.abspath(folder)}, staging, folder)
