"""Every input format as one kind of source: the pipeline asks the same questions of each.

``--input`` may be given several times, and each may be a file, a folder or a glob
(``data/*.parquet``); together they must be one format:

- JSONL (``.jsonl``/``.json``/``.ndjson``, also ``.gz`` and ``.zst``): ``records.RecordIndex``,
  several files as ``JsonlFiles``;
- Parquet files (``.parquet``), streamed by row group, and Hugging Face ``datasets`` folders
  written by ``save_to_disk``: ``arrow_sources.ArrowTableSource``.

A source is a sequence of records, each known by (file, row), with these members:

    kind            "jsonl", "parquet" or "arrow" (a save_to_disk folder)
    name, files     what to call it in messages; the files it reads
    fingerprints    uint64 per record: the caches are keyed by them, so a corpus converted from
                    one format to another reuses its counts and embeddings
    row_sizes       bytes per record (torchrun shares and batches are balanced by them)
    where(row)      "file:line" or "file row N", for messages
    iter_documents(rows, max_batch_bytes, max_batch_rows) -> (rows ascending, documents)
                    a document is a text or a ``fields.Conversation``
    field_values(name)   the value at a dotted path of every record (``fields.MISSING`` where absent)
    check_unchanged()    a UserError if any file changed since it was indexed
    write_rows(rows, output)  those records, in that order, in the input's own format (atomically)
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import arrays, records
from .arrow_sources import dataset_folder_files, is_dataset_folder, open_arrow_source
from .errors import UserError
from .runtime import Progress

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIX = ".parquet"
KINDS = {"jsonl": "JSONL", "parquet": "Parquet", "arrow": "a datasets folder"}


def is_jsonl_name(name: str) -> bool:
    return _ends_with(name, JSONL_SUFFIXES)


def _ends_with(name: str, suffixes: tuple[str, ...]) -> bool:
    """``name`` ends with one of ``suffixes``, compressed or not, in any case (``UP.JSONL``, ``a.jsonl.GZ``)."""
    name = name.lower()
    return any(name.endswith(suffix + compressed) for suffix in suffixes for compressed in ("", *records.COMPRESSED_SUFFIXES))


def is_parquet_name(name: str) -> bool:
    return name.lower().endswith(PARQUET_SUFFIX)


def kind_of_file(path: Path) -> str:
    """A file's format by its name: Parquet by ``.parquet``; a name of neither format (``--output x
    --output-format parquet`` writes one) by its first bytes; JSONL otherwise (its reader says what it is if not)."""
    if is_parquet_name(path.name):
        return "parquet"
    if not is_jsonl_name(path.name):
        with contextlib.suppress(OSError), open(path, "rb") as handle:
            if handle.read(4) == records.PARQUET_MAGIC:
                return "parquet"
    return "jsonl"


@dataclass
class Inputs:
    """The files behind the ``--input`` values, resolved before any long work."""

    kind: str
    files: list[Path]
    folder: Path | None = None  # the (first) save_to_disk folder
    given: tuple[Path, ...] = ()  # the --input values as typed

    @property
    def name(self) -> Path:
        """One path standing for all inputs: the file, the datasets folder, or several files' common folder.
        The token-count cache is named after it."""
        if self.folder is not None and len(self.given) == 1:  # also a folder of one data file: the folder
            return self.folder
        if len(self.files) == 1:
            return self.files[0]
        return Path(_common_folder(self.files))

    @property
    def folders(self) -> set[Path]:
        """The folders the files are in."""
        return {f.absolute().parent for f in self.files}

    @property
    def spread(self) -> bool:
        """Several files in more than one folder: their common folder may be any ancestor (``/`` for ``/tmp/a.jsonl``
        and ``/data/b.jsonl``), no place to name a cache after or write one beside."""
        return self.folder is None and len(self.folders) > 1

    @property
    def system_folder(self) -> bool:
        """A file read through ``/dev`` or ``/proc`` (``--input /dev/stdin < data.jsonl``): no place for a cache (as
        root, a run wrote its token counts into ``/dev``)."""
        return any(f.absolute().parts[1:2] in (("dev",), ("proc",)) for f in self.files)

    @property
    def counts_beside_output(self) -> bool:
        """The token counts are cached beside the output: see ``spread`` and ``system_folder``."""
        return self.spread or self.system_folder

    def describe(self) -> str:
        return str(self.name) if len(self.files) == 1 or self.folder else f"{len(self.files):,} files in {self.name}"


def _common_folder(files: list[Path]) -> str:
    return os.path.commonpath([str(f.absolute().parent) for f in files])


def _is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")


def _folder_files(folder: Path) -> tuple[str, list[Path]]:
    """The data files of a plain folder (searched recursively; hidden files, such as temps, left out, and so are
    --export-packed folders inside it: a curate run's output folder reads back as its shards)."""
    from .packed_export import MARKER

    exports = {p.parent for p in folder.rglob(MARKER) if p.parent != folder and any(p.parent.glob("packed-*.parquet"))}
    found = sorted(p for p in folder.rglob("*") if p.is_file() and p.parent not in exports)
    hidden = [p for p in found if any(part.startswith(".") for part in p.relative_to(folder).parts)]
    found = [p for p in found if not any(part.startswith(".") for part in p.relative_to(folder).parts)]
    if exports:
        log.info("--input %s: %s left out (packed sequences an --export-packed wrote, not records)", folder,
                 ", ".join(str(p) for p in sorted(exports)))
    if hidden:
        log.info("--input %s: %d hidden file(s) left out (%s%s)", folder, len(hidden),
                 hidden[0].relative_to(folder), " ..." if len(hidden) > 1 else "")
    arrow = [p for p in found if p.suffix.lower() == ".arrow"]
    inner = sorted({p.parent for p in arrow if is_dataset_folder(p.parent)})
    if inner:
        raise UserError(f"--input {folder}: holds the datasets folder {inner[0]}; give that folder as --input"
                        + (f" (it holds {len(inner)} of them: give each, or a glob such as {folder}/*)"
                           if len(inner) > 1 else ""))
    if arrow and not any(is_parquet_name(p.name) or is_jsonl_name(p.name) and not _is_plain_json(p.name)
                         for p in found):
        # Its dataset_info.json would otherwise be read as JSONL: "not valid JSON ... must be JSONL"
        raise UserError(f"--input {folder}: holds Arrow files ({arrow[0].name}) but is no datasets folder "
                        f"({arrow[0].parent / 'state.json'} is missing: save_to_disk writes it); copy the folder whole, "
                        "or give Parquet or JSONL")
    data = _data_files(f"--input {folder}", found, take_unnamed=False)
    parquet = [p for p in data if is_parquet_name(p.name)]
    jsonl = [p for p in data if not is_parquet_name(p.name)]
    if parquet and jsonl:
        raise UserError(f"--input {folder}: holds both Parquet ({parquet[0].name}) and JSONL ({jsonl[0].name}) files; "
                        f"give one format (e.g. a glob such as {parquet[0].parent}/*.parquet or "
                        f"{jsonl[0].parent}/*{''.join(jsonl[0].suffixes)})")
    if not parquet and not jsonl:
        from .caches import MANIFEST_SUFFIX

        unnamed = [p for p in found if not p.name.lower().endswith(MANIFEST_SUFFIX)]
        holds = (f"; it holds {len(unnamed):,} file(s) named otherwise ({unnamed[0].relative_to(folder)}"
                 f"{' ...' if len(unnamed) > 1 else ''}): a folder's files are taken by their names, a file given "
                 f"alone or by a glob (such as {folder}/*) by what it holds") if unnamed else ""
        raise UserError(f"--input {folder}: a folder with no .parquet or .jsonl/.json/.ndjson[.gz|.zst] files (nor a "
                        f"datasets folder written by save_to_disk){holds}")
    return ("parquet", parquet) if parquet else ("jsonl", jsonl)


def _data_files(given: str, found: list[Path], take_unnamed: bool) -> list[Path]:
    """The data files among ``found`` (a folder's files, or a glob's matches): those named .parquet or
    .jsonl/.json/.ndjson[.gz|.zst], in any case; plain .json files only where nothing else is named as data (beside
    data files they are metadata: a curate run's B_meta.json, B_clusters.json); never a cache's manifest (the
    input's token counts are cached beside it). What is left out is said. ``take_unnamed`` (a glob's matches):
    where no file is named as data, the others are taken (JSONL files named otherwise; their reader says what
    they are if not)."""
    from .caches import MANIFEST_SUFFIX
    from .outputs import is_json_document

    manifests = [p for p in found if p.name.lower().endswith(MANIFEST_SUFFIX)]
    if manifests:
        log.info("%s: %d cache manifest(s) left out (%s%s)", given, len(manifests), manifests[0].name,
                 " ..." if len(manifests) > 1 else "")
    candidates = [p for p in found if not p.name.lower().endswith(MANIFEST_SUFFIX)]
    # Indented JSON (a curate run's metadata and reports beside a .json output's shards) is no JSON Lines file.
    documents = [p for p in candidates if _is_plain_json(p.name) and is_json_document(p)]
    if documents:
        log.info("%s: %d .json file(s) left out (%s%s): JSON documents (metadata, reports), not JSON Lines", given,
                 len(documents), documents[0].name, " ..." if len(documents) > 1 else "")
        candidates = [p for p in candidates if p not in documents]
    named = [p for p in candidates if is_parquet_name(p.name) or is_jsonl_name(p.name)]
    if not named:
        return candidates if take_unnamed else []
    plain_json = [p for p in named if _is_plain_json(p.name)]
    if plain_json and len(plain_json) < len(named):
        named = [p for p in named if not _is_plain_json(p.name)]
        _say_left_out(given, ".json file(s) left out", plain_json, ": the data are its " + (
            "Parquet" if any(is_parquet_name(p.name) for p in named) else ".jsonl/.ndjson") + " files")
    taken = set(named) | set(plain_json)
    others = [p for p in candidates if p not in taken]
    if others:
        _say_left_out(given, "file(s) not named as data left out", others)
    return named


# Files left out of a folder or glob that are looked into, to warn where one holds records (at most this many).
_LOOKED_INTO = 200


def _say_left_out(given: str, what: str, left_out: list[Path], why: str = "") -> None:
    """``given: N <what> (first ...)<why>``, said at INFO; a WARNING naming those that hold records by their first
    bytes (Parquet, or JSON Lines: their records would be missing from the output without a word)."""
    holding = [(path, kind) for path in left_out[:_LOOKED_INTO] if (kind := _holds_records(path))]
    first = left_out[0].name + (" ..." if len(left_out) > 1 else "")
    if not holding:
        log.info("%s: %d %s (%s)%s", given, len(left_out), what, first, why)
        return
    named = ", ".join(f"{path.name} ({kind})" for path, kind in holding[:5]) + (" ..." if len(holding) > 5 else "")
    log.warning("%s: %d %s (%s)%s; not read, though their first bytes say they hold records: %s; name them as data "
                "(.parquet, .jsonl) or give them as --input", given, len(left_out), what, first, why, named)


def _holds_records(path: Path) -> str | None:
    """"Parquet" or "JSON Lines" where ``path``'s first bytes say it holds records (two lines that are each a JSON
    object: a pretty-printed metadata file's first line is "{" alone), else None."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 16)
    except OSError:
        return None
    if head.startswith(records.PARQUET_MAGIC):
        return "Parquet"
    lines = [line for line in head.split(b"\n")[:-1] if line.strip()][:2]  # (complete lines only)
    try:
        return "JSON Lines" if len(lines) == 2 and all(isinstance(json.loads(line), dict) for line in lines) else None
    except ValueError:
        return None


def _is_plain_json(name: str) -> bool:
    return _ends_with(name, (".json",))


def _resolve_one(value: Path | str) -> list[tuple[str, Path, Path | None]]:
    """(kind, file, datasets folder) for one --input value."""
    path = Path(value)
    text = str(value)
    if not path.exists() and _is_pattern(text):
        matches = sorted(Path(m) for m in glob.glob(text, recursive=True))
        if not matches:
            raise UserError(f"--input {text}: no file matches this pattern")
        folders = [match for match in matches if match.is_dir()]
        files = _data_files(f"--input {text}", [match for match in matches if not match.is_dir()], take_unnamed=True)
        if not files and not folders:
            raise UserError(f"--input {text}: matches no data file (only a cache's manifest, "
                            f"{matches[0].name}{' ...' if len(matches) > 1 else ''})")
        return [item for match in sorted(folders + files) for item in _resolve_one(match)]
    if path.is_dir():
        if is_dataset_folder(path) or (path / "dataset_dict.json").is_file():
            return [("arrow", f, path) for f in dataset_folder_files(path)]
        kind, files = _folder_files(path)
        return [(kind, f, None) for f in files]
    records.check_input(path)  # not found, a pipe, ...: one line
    return [(kind_of_file(path), path, None)]


def resolve_inputs(values) -> Inputs:
    """Resolve ``--input`` values (paths, folders, globs) to files of one format."""
    values = [values] if isinstance(values, str | Path) else list(values)
    if not values:
        raise UserError("--input is required")
    items = [item for value in values for item in _resolve_one(value)]
    if not items:  # only a datasets folder of no data files resolves to none (one saved from an empty dataset)
        raise UserError(f"--input {values[0]}: no rows (a datasets folder with no data files)")
    kinds = sorted({kind for kind, _, _ in items})
    if len(kinds) > 1:
        first = {kind: path for kind, path, _ in reversed(items)}
        raise UserError(f"--input: the inputs mix formats ({', '.join(f'{KINDS[k]}: {first[k]}' for k in kinds)}); "
                        "give files of one format")
    seen: set = set()
    for _, path, _ in items:
        key = path.resolve()
        if key in seen:
            raise UserError(f"--input: {path} is given twice; every record must appear once in the output")
        seen.add(key)
    _refuse_earlier_outputs_of_these([path for _, path, _ in items])
    folders = [folder for _, _, folder in items if folder is not None]
    return Inputs(kinds[0], [path for _, path, _ in items], folders[0] if folders else None,
                  tuple(Path(v) for v in values))


def _refuse_earlier_outputs_of_these(files: list[Path]) -> None:
    """A curate run's output read together with the inputs it was made from (a folder or glob holding both, after
    a run wrote its output among its inputs) holds their records again: each would be read twice. Found by the
    metadata (``*_meta.json``) beside the files read."""
    read = {path.resolve() for path in files}
    for folder in sorted({path.resolve().parent for path in files}):
        for meta_path in sorted(folder.glob("*_meta.json")):
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                outputs = {Path(name).resolve() for name in meta.get("output_files") or ()}
                inputs = {Path(name).resolve() for name in meta.get("input_files") or ()}
            except (OSError, UnicodeDecodeError, ValueError, AttributeError, TypeError):
                continue  # not a curate run's metadata
            both_out, both_in = sorted(outputs & read), inputs & read
            # By name too, beside the metadata: a folder moved or copied whole keeps the stub, its paths not.
            named_here = {folder / Path(name).name for name in meta.get("output_files") or () if isinstance(name, str)}
            stopped = sorted((outputs | named_here) & read)
            if len(named_here) > 1 and stopped and meta.get("complete") is False:
                # (one file is renamed into place whole: always one run's; shards are renamed one by one)
                # Killed while renaming its shards, a run leaves some new and some earlier: records twice and missing.
                raise UserError(f"--input: {stopped[0]} is among the files of a curate run that stopped before it "
                                f"finished ({meta_path.name} says so): they may be some of its shards and some of an "
                                "earlier run's; run that curate command again to complete them, then read them")
            if both_out and both_in:
                raise UserError(f"--input: {both_out[0]} is an earlier curate run's output of {len(both_in)} of the "
                                f"other files read ({meta_path.name} says so): every record of those would be read "
                                "twice; leave it out (move it, or name the input files or a narrower glob)")


def open_source(inputs, text_fields, progress: bool = True, ctx=None):
    """Index the inputs (an ``Inputs``, or ``--input`` values): a source (see the module doc).

    Under torchrun (``ctx``) the ranks index plain JSONL together, each its own byte range of the
    files (see ``_index_jsonl_across_ranks``); every rank gets the same source."""
    inputs, field = _resolved(inputs, text_fields)
    if inputs.kind == "jsonl" and _splittable(ctx, inputs):
        return _jsonl_source(_index_jsonl_across_ranks(ctx, inputs.files, field, progress, everyone=True)[0],
                             inputs.name)
    return _open_whole(inputs, field, progress)


def open_rank_source(inputs, text_fields, ctx, progress: bool = True,
                     spill_folder: Path | None = None) -> tuple[object, np.ndarray | None]:
    """Under torchrun: (the source, the input rows of each rank: ``world_size + 1`` bounds). Plain
    JSONL is indexed by the ranks together and only rank 0 gathers it whole (24 bytes per record, in
    unnamed files in ``spill_folder`` when given: page cache the kernel can reclaim, not rank 0's own
    memory); every other rank keeps its own rows (a ``RecordPieces``: what it embeds), so no rank
    holds per-record state for the whole input in its memory. Other inputs: every rank's whole
    source, bounds None."""
    inputs, field = _resolved(inputs, text_fields)
    if inputs.kind != "jsonl" or not _splittable(ctx, inputs):
        return open_source(inputs, text_fields, progress, ctx), None
    indexes, mine, bounds = _index_jsonl_across_ranks(ctx, inputs.files, field, progress, everyone=False,
                                                      spill_folder=spill_folder)
    if ctx.is_main:
        return _jsonl_source(indexes, inputs.name, spill_folder), bounds
    parts = [records.index_of_part(inputs.files[f], field, part) for f, part in mine]
    own = [] if not parts else [(bounds[ctx.rank], parts[0] if len(parts) == 1 else JsonlFiles(parts, inputs.name))]
    return RecordPieces(own, int(bounds[-1]), inputs.name), bounds


def _resolved(inputs, text_fields):
    inputs = inputs if isinstance(inputs, Inputs) else resolve_inputs(inputs)
    text_fields = (text_fields,) if isinstance(text_fields, str) else tuple(text_fields)
    return inputs, (text_fields[0] if len(text_fields) == 1 else text_fields)


def _splittable(ctx, inputs: Inputs) -> bool:
    """Ranks can share the indexing: several processes, and files that can be entered mid-way."""
    return ctx is not None and ctx.active and not any(records.is_compressed(path) for path in inputs.files)


def _jsonl_source(indexes: list[records.RecordIndex], name: Path, spill_folder: Path | None = None):
    return indexes[0] if len(indexes) == 1 else JsonlFiles(indexes, name, spill_folder)


def _open_whole(inputs: Inputs, field, progress: bool):
    if inputs.kind == "jsonl":
        return _jsonl_source(records.scan_files(inputs.files, field, progress=progress), inputs.name)
    text_fields = field if isinstance(field, tuple) else (field,)
    # Counted in records (the files' metadata gives the total; their bytes, encoded and compressed, are not the
    # records' bytes the log gives after).
    with Progress(None, f"Indexing {inputs.describe()}", unit="records", rate_unit="records", bar=progress) as bar:
        return open_arrow_source(inputs.files, inputs.kind, text_fields, inputs.folder, progress=bar)


def _index_jsonl_across_ranks(ctx, files: list[Path], field, progress: bool, everyone: bool,
                              spill_folder: Path | None = None):
    """The files' indexes, built by the ranks together: the bytes of all files, end to end, are cut
    into ``world_size`` equal ranges, each rank indexes the records starting in its range, and the
    parts (24 bytes per record) are gathered by every rank (``everyone``) or by rank 0 only (into
    file-backed arrays in ``spill_folder`` when given: ``arrays.file_backed``). Each
    rank reads 1/world_size of the input instead of all of it. A bad record stops every rank with the
    message a single process gives (the first in file order).

    Returns (one index per file, or None on a rank that gathers nothing; this rank's own parts as
    (file number, ``IndexPart``), kept only when it gathers nothing; each rank's first input row,
    ``world_size + 1`` bounds)."""
    from . import distributed

    for path in files:
        records.check_input(path)
    sizes = np.asarray([os.stat(path).st_size for path in files], dtype=np.int64)
    file_starts = np.concatenate([[0], np.cumsum(sizes)])
    cuts = np.linspace(0, int(file_starts[-1]), ctx.world_size + 1).astype(np.int64)
    lo, hi = int(cuts[ctx.rank]), int(cuts[ctx.rank + 1])
    # An empty file lies in no range: the rank whose range holds its place indexes it (to no records).
    empty_owner = np.minimum(np.searchsorted(cuts, file_starts[:-1], side="right") - 1, ctx.world_size - 1)
    mine, error, f = [], None, 0
    try:
        for f, path in enumerate(files):
            a, b = max(lo, file_starts[f]) - file_starts[f], min(hi, file_starts[f + 1]) - file_starts[f]
            if a < b or (sizes[f] == 0 and empty_owner[f] == ctx.rank):
                mine.append((f, records.scan_range(path, field, int(a), int(b), progress and ctx.is_main)))
    except records.BadRecords as exc:
        error = (f, exc)
    except UserError as exc:
        error = (f, str(exc))
    errors = [e for e in distributed.all_gather_object(ctx, error) if e is not None]
    if errors:
        raise _first_error(errors)
    # Which file each part belongs to, its row count and its identity (small); then the columns one at
    # a time, each joined file by file at once, so the gather holds two copies of one column at most.
    shapes = distributed.all_gather_object(ctx, [(f, len(part), part.non_record_lines.size, part.identity, part.kinds)
                                                 for f, part in mine])
    bounds = np.concatenate([[0], np.cumsum([sum(n for _, n, *_ in pieces) for pieces in shapes])]).astype(np.int64)
    for f, path in enumerate(files):  # every rank refuses alike, before any gathering
        records.check_one_identity(path, [identity for _, _, _, identity, _ in _pieces_of(shapes, f)])
    records.require_records(files, [sum(n for _, n, *_ in _pieces_of(shapes, f)) for f in range(len(files))])
    receives = everyone or ctx.is_main
    joined: list[dict] = [{} for _ in files]
    for name, dtype in records.IndexPart.COLUMNS.items():
        local = [getattr(part, name) for _, part in mine]
        flat = np.concatenate(local) if local else np.zeros(0, dtype)
        gathered = (distributed.all_gather_arrays(ctx, flat) if everyone
                    else distributed.gather_to_main(ctx, flat, distributed.comm_device()))
        del local, flat
        if receives:
            for _, part in mine:
                setattr(part, name, None)  # this rank's own copy, now in ``gathered``
        else:
            continue
        chunks: list[list[np.ndarray]] = [[] for _ in files]
        for rank, pieces in enumerate(shapes):
            at = 0
            for f, n, n_lines, *_ in pieces:
                size = n_lines if name == "non_record_lines" else n
                chunks[f].append(gathered[rank][at: at + size])
                at += size
        for f, file_chunks in enumerate(chunks):
            if name == "non_record_lines":  # rows counted from each part's first record: from the file's
                before = np.cumsum([0] + [n for g, n, *_ in _pieces_of(shapes, f)][:-1])
                file_chunks = [chunk + first for chunk, first in zip(file_chunks, before.tolist())]
            joined[f][name] = _joined(file_chunks, dtype, None if name == "non_record_lines" else spill_folder)
        del gathered, chunks
    if not receives:
        return None, mine, bounds
    indexes = []
    for f, path in enumerate(files):
        pieces = _pieces_of(shapes, f)
        firsts = np.cumsum([0] + [n for _, n, *_ in pieces][:-1]).tolist()
        kinds = records.DocumentKinds.joined([(first, piece[4]) for first, piece in zip(firsts, pieces)])
        indexes.append(records.index_from_parts(path, field, [records.IndexPart(identity=pieces[0][3], kinds=kinds,
                                                                                  **joined[f])]))
    return indexes, [], bounds


def _joined(chunks: list[np.ndarray], dtype, spill_folder: Path | None) -> np.ndarray:
    """``chunks`` end to end, in memory or (``spill_folder``) in a file-backed array."""
    if spill_folder is None:
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype)
    joined = arrays.file_backed(sum(chunk.size for chunk in chunks),
                                np.result_type(*chunks) if chunks else dtype, spill_folder)
    at = 0
    for chunk in chunks:
        joined[at: at + chunk.size] = chunk
        at += chunk.size
    return joined


def _first_error(errors: list[tuple]) -> UserError:
    """The ranks' (file, error) in rank order, which is file order: the first, as one pass over the files
    raises it; bad records with those of the same file the next ranks counted (one pass counts them all)."""
    f, first = errors[0]
    if not isinstance(first, records.BadRecords):
        return UserError(first)
    same = []
    for g, error in errors:
        if g != f or not isinstance(error, records.BadRecords):
            break
        same.append(error)
    return records.BadRecords.joined(same)


def _pieces_of(shapes: list[list[tuple]], f: int) -> list[tuple]:
    """The parts of file ``f``, in rank order (= byte order)."""
    return [piece for pieces in shapes for piece in pieces if piece[0] == f]


class RecordPieces:
    """Some of the input's records: pieces of consecutive input rows, each a ``RecordIndex`` (or
    ``JsonlFiles``) of its own, in ascending row order (``JsonlFiles``: all records of several files,
    one piece per file). It reads them by their input rows, as the whole source would, and knows
    where each lies in its file; its length is the input's. A torchrun
    rank holds its own records this way (those that start in its byte range; see
    ``open_rank_source``), and the records other ranks hand it to embed (``records_slice``)."""

    kind = "jsonl"

    def __init__(self, pieces: list[tuple[int, object]], n_records: int, name: Path):
        self.pieces = [(int(first), part) for first, part in pieces]
        self.firsts = np.asarray([first for first, _ in self.pieces], dtype=np.int64)
        self.ends = np.asarray([first + len(part) for first, part in self.pieces], dtype=np.int64)
        if np.any(self.firsts[1:] < self.ends[:-1]):
            raise ValueError("record pieces overlap or are not in row order")
        self.n_records = int(n_records)
        self.name = name
        self.kinds = records.DocumentKinds.joined([(first, part.kinds) for first, part in self.pieces])

    def __len__(self) -> int:
        return self.n_records

    @property
    def files(self) -> list[Path]:
        return list(dict.fromkeys(path for _, part in self.pieces for path in part.files))

    @property
    def total_bytes(self) -> int:
        """The held records' bytes."""
        return sum(part.total_bytes for _, part in self.pieces)

    def holds_all(self) -> bool:
        return int((self.ends - self.firsts).sum()) == self.n_records

    def _piece_of(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        piece = np.searchsorted(self.firsts, rows, side="right") - 1
        held = (piece >= 0) & (rows < self.ends[np.maximum(piece, 0)]) if self.pieces else np.zeros(rows.size, bool)
        if not held.all():
            raise ValueError(f"row {int(rows[~held][0])} is not among the records held here")
        return piece

    def where(self, row: int) -> str:
        piece = int(self._piece_of(np.asarray([row]))[0])
        first, part = self.pieces[piece]
        return part.where(row - first)

    def row_bytes(self, rows: np.ndarray) -> np.ndarray:
        """Bytes of each of ``rows`` (held records)."""
        rows = np.asarray(rows, dtype=np.int64)
        piece = self._piece_of(rows)
        sizes = np.zeros(rows.size, dtype=np.int64)
        for p in np.unique(piece).tolist():
            at = piece == p
            first, part = self.pieces[p]
            sizes[at] = part.row_sizes[rows[at] - first]
        return sizes

    def iter_documents(self, rows: np.ndarray | None = None, max_batch_bytes: int = 4 << 20,
                       max_batch_rows: int = 1 << 30):
        rows = (np.concatenate([np.arange(a, b) for a, b in zip(self.firsts, self.ends)] or [np.zeros(0, np.int64)])
                if rows is None else np.sort(np.asarray(rows, dtype=np.int64)))
        piece = self._piece_of(rows)
        for p in np.unique(piece).tolist():
            first, part = self.pieces[p]
            for batch, documents in part.iter_documents(rows[piece == p] - first, max_batch_bytes, max_batch_rows):
                yield batch + first, documents

    def check_unchanged(self) -> None:
        for _, part in self.pieces:
            part.check_unchanged()

    def read_raw(self, rows: np.ndarray) -> list[bytes]:
        """The bytes of records ``rows`` (held ones), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        owner = self._piece_of(rows)
        found: list[bytes] = [b""] * rows.size
        for p in np.unique(owner).tolist():
            at = np.flatnonzero(owner == p)
            first, part = self.pieces[p]
            for j, raw in zip(at.tolist(), part.read_raw(rows[at] - first)):
                found[j] = raw
        return found


# Files whose documents are mostly another file's too: at least this share of their distinct documents, and at
# least OVERLAP_LEAST of them (shards sharing a license header or an empty text are no copy of each other).
OVERLAP_SHARE = 0.5
OVERLAP_LEAST = 10
# Distinct documents compared at most; past it, those whose fingerprint is a multiple of a modulus (a subset
# keeps its subset relation under the same rule, so a file inside another still shows up whole).
OVERLAP_SAMPLE = 1 << 24


def copied_files(source) -> list[tuple[Path, Path, bool]]:
    """(file, the earlier file it copies, whether in the same order) for each input file whose documents are an
    earlier file's (by their fingerprints: the same file twice under two names, compressed beside the plain one, or
    shuffled), of at least ``OVERLAP_LEAST`` documents (two 2-record shards alike by chance are no copy). One pass
    over the fingerprints; none for a single file or a source that does not say its files' rows."""
    import hashlib
    from collections import Counter

    spans = source.file_rows() if hasattr(source, "file_rows") else []
    sizes = Counter(hi - lo for _, lo, hi in spans)
    seen: dict[tuple[int, bytes], tuple[Path, bytes]] = {}
    copies = []
    for path, lo, hi in spans:
        if sizes[hi - lo] < 2 or hi - lo < OVERLAP_LEAST:
            continue  # no other file has as many documents (nothing to hash), or too few to be a copy, not chance
        rows = np.ascontiguousarray(source.fingerprints[lo:hi])
        in_order = hashlib.blake2b(rows.tobytes()).digest()
        key = (hi - lo, hashlib.blake2b(np.sort(rows).tobytes()).digest())
        if key in seen:
            original, original_order = seen[key]
            copies.append((path, original, in_order == original_order))
        else:
            seen[key] = (path, in_order)
    return copies


def repeated_documents(source) -> tuple[int, tuple[int, int] | None]:
    """How many records hold the same document as an earlier record (by the fingerprints; the same text, or
    conversation, whatever the other fields), and the earliest such record with the first that holds its
    document (None where none does). Past ``OVERLAP_SAMPLE`` records the count is of the fingerprints a
    modulus keeps (every copy of a kept fingerprint with it), scaled up: an estimate, said so by
    ``overlap_sampled``."""
    n = len(source.fingerprints)
    modulus = _sample_modulus(n)
    rows, prints = _sampled_fingerprints(source, 0, n, modulus)
    by_print = np.argsort(prints, kind="stable")  # (stable: each run of equal prints starts at its first row)
    prints, rows = prints[by_print], rows[by_print]
    again = np.flatnonzero(prints[1:] == prints[:-1]) + 1
    if not again.size:
        return 0, None
    earliest = again[np.argmin(rows[again])]
    first = earliest
    while first > 0 and prints[first - 1] == prints[earliest]:
        first -= 1
    return int(again.size) * int(modulus), (int(rows[earliest]), int(rows[first]))


def _sample_modulus(total: int) -> np.uint64:
    """The modulus that keeps about ``OVERLAP_SAMPLE`` of ``total`` fingerprints (1: all of them)."""
    return np.uint64(max(1, -(-total // OVERLAP_SAMPLE)))


def _sampled_fingerprints(source, lo: int, hi: int, modulus: np.uint64) -> tuple[np.ndarray, np.ndarray]:
    """Rows lo .. hi - 1 whose fingerprint ``modulus`` keeps (every copy of a kept fingerprint with it), and those
    fingerprints; read a block at a time (a billion fingerprints are file-backed, 8 GB)."""
    rows, prints = [np.zeros(0, np.int64)], [np.zeros(0, np.uint64)]
    for at in range(lo, hi, OVERLAP_SAMPLE):
        block = np.asarray(source.fingerprints[at:min(at + OVERLAP_SAMPLE, hi)], dtype=np.uint64)
        kept = np.flatnonzero(block % modulus == 0) if modulus > 1 else np.arange(block.size)
        rows.append(kept + at)
        prints.append(block[kept])
    return np.concatenate(rows), np.concatenate(prints)


def overlap_sampled(source) -> bool:
    """Whether ``overlapping_files`` counts a sample of ``source``'s fingerprints (it holds more than
    ``OVERLAP_SAMPLE``)."""
    return len(source) > OVERLAP_SAMPLE


def overlapping_files(source, leave_out: set[Path] = frozenset()) -> list[tuple[Path, Path, int, int]]:
    """(file, another file holding some of its documents, how many it shares, its distinct documents) for
    each input file of which at least ``OVERLAP_SHARE`` of the distinct documents are in other input files too (a
    prefix or a subset of another file, a later export of the same data): its documents are curated once per
    file. By the documents' fingerprints; files in ``leave_out`` (copies already said) are not compared. Counts
    are of a fingerprint sample past ``OVERLAP_SAMPLE`` documents (``overlap_sampled`` says whether)."""
    spans = [span for span in (source.file_rows() if hasattr(source, "file_rows") else []) if span[0] not in leave_out]
    if len(spans) < 2:
        return []
    total = sum(hi - lo for _, lo, hi in spans)
    modulus = _sample_modulus(total)
    parts = []
    for number, (_, lo, hi) in enumerate(spans):
        prints = arrays.distinct(_sampled_fingerprints(source, lo, hi, modulus)[1])
        parts.append((prints, np.full(prints.size, number, dtype=np.int64)))
    prints = np.concatenate([p for p, _ in parts])
    owners = np.concatenate([o for _, o in parts])
    by_print = np.argsort(prints, kind="stable")  # (runs already sorted: a merge)
    prints, owners = prints[by_print], owners[by_print]
    # Each file's prints are distinct, so a print seen twice is held by two files.
    shared = np.zeros(prints.size, dtype=bool)
    shared[1:] |= prints[1:] == prints[:-1]
    shared[:-1] |= prints[:-1] == prints[1:]
    files = len(spans)
    distinct = np.bincount(owners, minlength=files)
    held_elsewhere = np.bincount(owners[shared], minlength=files)
    # Each shared print's partner: the first file of its run of equal prints, or the second where that is its own.
    at = np.flatnonzero(shared)
    if not at.size:
        return []
    positions = np.arange(prints.size)
    first = np.maximum.accumulate(np.where(np.r_[True, prints[1:] != prints[:-1]], positions, 0))
    second = owners[np.minimum(first[at] + 1, prints.size - 1)]
    partners = np.where(owners[first[at]] != owners[at], owners[first[at]], second)
    pairs, times = np.unique(owners[at] * files + partners, return_counts=True)
    most = np.lexsort((-times, pairs // files))  # each file's partners, the most often met first
    firsts = most[np.r_[True, (pairs // files)[most][1:] != (pairs // files)[most][:-1]]]
    partner_of = dict(zip((pairs[firsts] // files).tolist(), (pairs[firsts] % files).tolist()))
    flagged = (held_elsewhere >= OVERLAP_SHARE * distinct) & (held_elsewhere * int(modulus) >= OVERLAP_LEAST)
    return [(spans[number][0], spans[partner_of[number]][0], int(held_elsewhere[number]), int(distinct[number]))
            for number in np.flatnonzero((distinct > 0) & flagged).tolist()]


def files_with_byte_order_mark(inputs: Inputs) -> list[Path]:
    """The JSONL files of ``inputs`` whose content starts with a UTF-8 byte order mark (read past, never written)."""
    if inputs.kind != "jsonl":
        return []
    marked = []
    for path in inputs.files:
        with contextlib.suppress(OSError, UserError), records.open_binary(path) as handle:
            if handle.read(len(records.UTF8_BOM)) == records.UTF8_BOM:
                marked.append(path)
    return marked


def record_bytes(source, rows: np.ndarray) -> np.ndarray:
    """Bytes of each of records ``rows`` of a JSONL source, whole (``row_sizes``) or holding some (``RecordPieces``)."""
    if isinstance(source, RecordPieces):
        return source.row_bytes(rows)
    return np.asarray(source.row_sizes[rows], dtype=np.int64)


def records_slice(source, a: int, b: int) -> list[records.RecordIndex]:
    """Input rows ``a`` to ``b`` - 1 of a JSONL source that holds them (a ``RecordIndex`` or a
    ``RecordPieces``, ``JsonlFiles`` included), as indexes of their own, one per file they lie in."""
    if a >= b:
        return []
    if isinstance(source, records.RecordIndex):
        return [source.rows_slice(a, b)]
    found = []
    for first, part in source.pieces:
        found.extend(records_slice(part, max(a, first) - first, min(b, first + len(part)) - first))
    return found


class JsonlFiles(RecordPieces):
    """Several JSONL files as one source: their records one after another, each known by (file, line)."""

    def __init__(self, indexes: list[records.RecordIndex], name: Path, spill_folder: Path | None = None):
        """``spill_folder``: the joined per-record arrays go into file-backed arrays there."""
        self.parts = indexes
        sizes = [len(index) for index in indexes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        super().__init__(list(zip(self.offsets[:-1].tolist(), indexes)), int(self.offsets[-1]), name)
        self.fingerprints = _joined([index.fingerprints for index in indexes], np.uint64, spill_folder)
        self.row_sizes = _joined([index.row_sizes for index in indexes], np.uint32, spill_folder)

    @property
    def files(self) -> list[Path]:
        return [index.path for index in self.parts]

    def file_rows(self) -> list[tuple[Path, int, int]]:
        """(file, first row, end row) of each file that holds rows, in row order (a file indexed in parts, by
        torchrun ranks, is one)."""
        spans: list[tuple[Path, int, int]] = []
        for lo, hi, index in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist(), self.parts):
            if spans and spans[-1][0] == index.path and spans[-1][2] == lo:
                spans[-1] = (index.path, spans[-1][1], hi)
            elif hi > lo:
                spans.append((index.path, lo, hi))
        return spans

    @property
    def total_bytes(self) -> int:
        return int(self.row_sizes.sum())

    def record_keys(self, row: int) -> str:
        part = int(self._piece_of(np.asarray([row]))[0])
        return records.record_keys(self.parts[part], row - int(self.offsets[part]))

    def field_values(self, name: str) -> list:
        return [value for index in self.parts for value in index.field_values(name)]

    def check_unchanged(self) -> None:
        for index in self.parts:
            index.check_unchanged()

    def write_rows(self, rows: np.ndarray, output: Path, max_pass_bytes: int = 1 << 30) -> int:
        """Records ``rows``, in that order, byte for byte, to one JSONL file (atomically)."""
        self.check_unchanged()
        rows = np.asarray(rows, dtype=np.int64)
        written = 0
        bounds = records.batch_bounds(self.row_sizes[rows], max_pass_bytes, 1 << 62)
        with records.open_output(Path(output)) as sink:
            for lo, hi in zip(bounds[:-1], bounds[1:]) if rows.size else ():
                raws = self.read_raw(rows[lo:hi])
                sink.write(b"\n".join(raws))
                sink.write(b"\n")
                written += sum(map(len, raws)) + len(raws)
        return written
