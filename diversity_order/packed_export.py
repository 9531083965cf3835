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
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .arrow_sources import replace_folder
from .atomic import give_plain_permissions
from .errors import UserError
from .runtime import Progress

SEQUENCES_PER_SHARD = 16384
DOCUMENTS_PER_READ = 4096
MARKER = "packed.json"


def order_digest(order: np.ndarray) -> str:
    """The order an export holds, as a digest a later run compares its own order with."""
    return hashlib.blake2b(np.ascontiguousarray(order, dtype="<i8").tobytes(), digest_size=16).hexdigest()


def check_folder(folder: Path) -> None:
    """The export replaces ``folder``: refuse one that holds anything but an earlier export."""
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / MARKER).is_file())):
        raise UserError(f"--export-packed {folder}: exists and is not an earlier packed export; the export "
                        "replaces the folder: choose a new one")


class _Packer:
    """Concatenate documents and cut every ``seq_len`` tokens, keeping each piece's start, row and cluster."""

    def __init__(self, seq_len: int):
        self.seq_len = seq_len
        self.ids: list[int] = []
        self.starts: list[int] = []
        self.rows: list[int] = []
        self.done: list[tuple[list[int], list[int], list[int]]] = []
        self.last_closed_row = -1  # the row of the last piece of the last full sequence

    def add(self, row: int, ids: list[int]) -> None:
        if not ids:  # a zero-token document belongs to the window of the token before it
            self.starts.append(len(self.ids))
            self.rows.append(row)
            return
        position = 0
        while position < len(ids):
            if len(self.ids) == self.seq_len:
                self._close()
            take = min(len(ids) - position, self.seq_len - len(self.ids))
            self.starts.append(len(self.ids))
            self.rows.append(row)
            self.ids.extend(ids[position: position + take])
            position += take

    def finish(self) -> tuple[int, int]:
        """Close the last sequence if full; returns the tokens left over (dropped) and the documents all of whose
        tokens they hold (the first of them may have begun in the last full sequence)."""
        if len(self.ids) == self.seq_len:
            self._close()
        rows = set(self.rows)
        rows.discard(self.last_closed_row)  # in the tail too: it began in the last full sequence
        return len(self.ids), len(rows)

    def _close(self) -> None:
        if self.rows:
            self.last_closed_row = self.rows[-1]
        self.done.append((self.ids, self.starts, self.rows))
        self.ids, self.starts, self.rows = [], [], []


def _documents_in_order(source, order: np.ndarray):
    """(row, document) in ``order``, read a few thousand at a time."""
    for lo in range(0, order.size, DOCUMENTS_PER_READ):
        chunk = order[lo: lo + DOCUMENTS_PER_READ]
        found = {}
        for rows, documents in source.iter_documents(np.sort(chunk)):
            found.update(zip(rows.tolist(), documents))
        yield chunk.tolist(), [found[row] for row in chunk.tolist()]


def export(source, order: np.ndarray, counts: np.ndarray, tokenizer, seq_len: int, special_mode: str, folder: Path,
           labels: np.ndarray, progress: bool = True) -> dict:
    """Write the packed sequences of ``order`` to ``folder`` (replaced atomically); returns what was written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_folder(folder)
    before, after = tokenizer.special_tokens_per_document(special_mode)
    n_sequences = int(counts.sum()) // seq_len
    n_shards = max(1, -(-n_sequences // SEQUENCES_PER_SHARD))
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    packer = _Packer(seq_len)
    written = shard = 0
    unique = []

    def flush(limit: int) -> None:
        nonlocal written, shard
        while len(packer.done) >= limit and packer.done:
            rows = packer.done[:SEQUENCES_PER_SHARD]
            del packer.done[:SEQUENCES_PER_SHARD]
            clusters = [labels[np.asarray(r, dtype=np.int64)].astype(np.int32) for _, _, r in rows]
            unique.extend(int(np.unique(c).size) for c in clusters)
            table = pa.table({
                "input_ids": pa.array([ids for ids, _, _ in rows], pa.list_(pa.int32())),
                "document_starts": pa.array([starts for _, starts, _ in rows], pa.list_(pa.int32())),
                "document_rows": pa.array([r for _, _, r in rows], pa.list_(pa.int64())),
                "document_clusters": pa.array([c.tolist() for c in clusters], pa.list_(pa.int32())),
            })
            path = staging / f"packed-{shard:05d}-of-{n_shards:05d}.parquet"
            pq.write_table(table, path)
            give_plain_permissions(path)
            written += len(rows)
            shard += 1

    try:
        with Progress(int(order.size), "Packing", bar=progress) as bar:
            for rows, documents in _documents_in_order(source, np.asarray(order, dtype=np.int64)):
                flat, lengths = tokenizer.encode_batch(documents)
                offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
                for i, row in enumerate(rows):
                    ids = before + flat[offsets[i]: offsets[i + 1]].tolist() + after
                    if len(ids) != int(counts[row]):
                        raise UserError(f"{source.where(row)}: {len(ids)} tokens now, {int(counts[row])} when counted; "
                                        "the input or the tokenizer changed during the run")
                    packer.add(row, ids)
                flush(SEQUENCES_PER_SHARD)
                bar.update(len(rows))
        dropped, documents_dropped = packer.finish()
        flush(1)
        meta = {"seq_len": seq_len, "order_blake2b": order_digest(order), "sequences": written, "shards": shard,
                "tokens": written * seq_len,
                "tokens_dropped": dropped, "documents_dropped": documents_dropped, "count_special_tokens": special_mode,
                "tokenizer": tokenizer.fingerprint,
                "unique_clusters_per_sequence": {"mean": float(np.mean(unique)) if unique else 0.0,
                                                 "min": int(min(unique)) if unique else 0},
                "files": sorted(p.name for p in staging.glob("packed-*.parquet"))}
        (staging / MARKER).write_text(json.dumps(meta, indent=2) + "\n")
        give_plain_permissions(staging / MARKER)
        os.chmod(staging, 0o755)
        replace_folder(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {**meta, "folder": os.path.abspath(folder)}
