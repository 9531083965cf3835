"""Where a curate run writes, and the checks made before any long work.

For ``--output B.jsonl`` every file is named after ``B`` (``B_meta.json``, ``B_order.npy``,
``B_ordering_comparison.png``, ...), so two runs into one folder never overwrite each other's
files; the token-count cache is named after the input and kept beside it. A run refuses, before
it loads a model, an output that is a folder, an unwritable folder, and any output that is one of
the files it reads (the input, ``--load-embeddings``).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

from .errors import UserError
from .fields import DEFAULT_TEXT_FIELD
from .records import COMPRESSED_SUFFIXES
from .sources import JSONL_SUFFIXES, PARQUET_SUFFIX

STATS_ONLY_TAG = "_stats-only"
# The files that describe one curated order; a --stats-only trial run beside a real run's output
# writes its own (see curate.write_outputs).
DESCRIBING_ORDER = ("meta", "labels", "order", "ordering_plot", "cloud_plot", "clusters_md", "clusters_json")


def output_stem(output: Path) -> Path:
    """``dir/name.jsonl[.gz|.zst]`` or ``dir/name.parquet`` -> ``dir/name``: the prefix of the files
    written beside it (a datasets folder, and a name that is only a suffix, are their own stem)."""
    cut = data_suffix_length(output.name)
    return output if cut in (0, len(output.name)) else output.with_name(output.name[:-cut])


def data_suffix_length(name: str) -> int:
    """The length of ``name``'s data-file suffix (``.parquet``, ``.jsonl.gz``, ...; an input's in any case,
    ``UP.JSONL``: outputs are refused one in upper case); 0 without one."""
    name = name.lower()
    if name.endswith(PARQUET_SUFFIX):
        return len(PARQUET_SUFFIX)
    for compressed in ("", *COMPRESSED_SUFFIXES):
        for suffix in JSONL_SUFFIXES:
            if name.endswith(suffix + compressed):
                return len(suffix + compressed)
    return 0


def output_paths(input_path: Path, output: Path, text_field: str | tuple[str, ...] = DEFAULT_TEXT_FIELD,
                 counts_beside_output: bool = False) -> dict[str, Path]:
    """Every file a curate run may write, by role. The token counts beside the input are named after the
    text field when it is not the default (``A_token_counts.FIELD.npy``; joined fields ``A+B``), so runs
    over other fields of one input keep a cache each. ``counts_beside_output`` (inputs in several folders, or
    read through /dev: ``Inputs.counts_beside_output``): they go beside the output, named after it
    (``B_token_counts.npy``)."""
    out_stem = output_stem(output)
    in_stem = out_stem if counts_beside_output else output_stem(input_path)
    fields = (text_field,) if isinstance(text_field, str) else tuple(text_field)
    field_part = "" if fields == (DEFAULT_TEXT_FIELD,) else "." + _safe_name("+".join(fields))
    return {
        "embeddings": Path(f"{out_stem}_embeddings.npy"),
        "token_counts": Path(f"{in_stem}_token_counts{field_part}.npy"),
        "meta": meta_path(output),
        "labels": Path(f"{out_stem}_labels.npy"),
        "order": Path(f"{out_stem}_order.npy"),
        "umap": Path(f"{out_stem}_umap2d.npy"),
        "kmeans": Path(f"{out_stem}_kmeans.npy"),
        "calibration": Path(f"{out_stem}_calibration.json"),
        "ordering_plot": Path(f"{out_stem}_ordering_comparison.png"),
        "cloud_plot": Path(f"{out_stem}_cluster_cloud.png"),
        "clusters_md": Path(f"{out_stem}_clusters.md"),
        "clusters_json": Path(f"{out_stem}_clusters.json"),
    }


def meta_path(output: Path) -> Path:
    """``B_meta.json`` beside ``--output B.jsonl``: the run's metadata."""
    return Path(f"{output_stem(output)}_meta.json")


def _safe_name(text: str) -> str:
    """``text`` as part of a file name: characters other than letters, digits and ``._+-`` as ``_``."""
    return re.sub(r"[^\w.+-]", "_", text)


def stats_only_paths(paths: dict[str, Path], output: Path) -> dict[str, Path]:
    """The paths of a --stats-only run that must not replace the files describing ``output``'s order."""
    stem = output_stem(output)
    tagged = Path(f"{stem}{STATS_ONLY_TAG}")
    return {**paths, **{role: Path(str(paths[role]).replace(str(stem), str(tagged), 1)) for role in DESCRIBING_ORDER}}


def same_file(a: Path, b: Path) -> bool:
    """The same path, or two names of one existing file."""
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_outside_model_dir(output: Path, model_dir: Path | None, flag: str = "--output") -> None:
    """Refuse an output inside ``--model-dir``: a run reads the model folder and never writes it (a JSONL named
    chat_template.jinja or config.json, or seven files of deep embeddings, had gone there)."""
    if model_dir is not None and Path(model_dir).resolve() in [Path(output).resolve(), *Path(output).resolve().parents]:
        raise UserError(f"{flag} {output}: inside --model-dir {model_dir}, which this run reads and never writes; "
                        "choose another folder")


def check_locations(output: Path, written: dict[str, Path], read: dict[str, Path | None],
                    folder_output: bool = False) -> None:
    """Refuse, before any long work, outputs that cannot be written or would destroy an input.

    ``written``: role -> path this run writes; ``read``: flag -> file it reads (None: not given);
    ``folder_output``: the curated data is a datasets folder (which an earlier run's may be).
    """
    if folder_output and output.is_dir() and any(output.iterdir()) and not (output / "state.json").is_file():
        raise UserError(f"--output {output}: a folder that is not a datasets folder; the curated datasets folder "
                        "would replace it: choose a new path")
    if output.is_dir() and not folder_output:
        raise UserError(f"--output {output}: is a folder; give the path of the curated file to write, "
                        f"e.g. {output / 'curated.jsonl'}")
    check_plain_output(output, "--output")
    check_not_folders({"metadata" if role == "meta" else role.replace("_", " "): target
                       for role, target in written.items()}, "--output", output)
    for flag, source in read.items():
        if source is None:
            continue
        what = "the input file" if flag == "--input" else f"the {flag} file"
        for role, target in {"output": output, **written}.items():
            if not same_file(source, target):
                continue
            if role == "output":
                raise UserError(f"--output {output} is {what}; choose another output path")
            raise UserError(f"{flag} {source} is also where this run would write its {role.replace('_', ' ')} "
                            f"({target}); choose another --output")
    if output.is_file() and is_json_document(output):
        raise UserError(f"--output {output}: is not JSON Lines (its first line is no JSON value: another run's "
                        "metadata or report, such as B_meta.json?), and the curated records would replace it; choose "
                        "another output path")
    check_writable_folder(output.parent, "--output")


def is_json_document(path: Path) -> bool:
    """A plain (uncompressed, not Parquet) file whose first line that is not blank is not a whole JSON value: indented
    JSON (the metadata and reports runs write), which no JSON Lines file starts with (each of its lines is one)."""
    import json

    if not path.name.endswith((".json", ".jsonl", ".ndjson")):
        return False  # compressed or Parquet: its bytes are no lines
    try:
        with open(path, "rb") as handle:
            for line in iter(lambda: handle.readline(1 << 20), b""):
                if line.strip():
                    break
            else:
                return False
    except OSError:
        return False
    if not line.endswith(b"\n") and len(line) >= 1 << 20:
        return False  # a first record longer than this look: not judged
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


# Folders this process created for its outputs, innermost first: a run that fails removes those left empty.
_created_folders: list[Path] = []


def check_not_folders(written: dict[str, Path], flag: str, given: Path) -> None:
    """Refuse, before the work, a file to write (``written``: what it is -> its path, named after ``flag given``)
    that is an existing folder (found when writing, after the work, it was a traceback)."""
    for role, path in written.items():
        if Path(path).is_dir():
            named = "" if Path(path) == Path(given) else f" {path}"
            raise UserError(f"{flag} {given}:{named} is a folder, where this run writes its {role}; move it or choose "
                            f"another {flag}")


def check_plain_output(path: Path, flag: str) -> None:
    """Refuse, before the work, an output path that is not a file this run can replace with its own: ``-`` (a file
    of that name, not stdout, with every companion file named after it), a symbolic link (the atomic rename
    replaces the link, and the file it points to, which a trainer may read, keeps the old data), a device, pipe
    or socket (``/dev/stdout`` was replaced by a regular file, and the run's files went into ``/dev``)."""
    path = Path(path)
    if str(path) == "-":
        raise UserError(f"{flag} -: this run writes files (the output and its metadata beside it), not to standard "
                        "output; give a file path")
    if path.is_symlink():
        raise UserError(f"{flag} {path}: a symbolic link (to {os.readlink(path)}); writing replaces the link, not the "
                        "file it points to: give that file's path, or remove the link")
    if path.exists() and not path.is_file() and not path.is_dir():
        raise UserError(f"{flag} {path}: not a regular file (a device, pipe or socket); give the path of a file to "
                        "write")


def check_writable_folder(folder: Path, flag: str) -> None:
    """Create ``folder`` if needed and make sure a file can be created in it."""
    try:
        missing = [path for path in (folder, *folder.parents) if not path.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        _created_folders.extend(missing)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise UserError(f"{flag}: cannot write in {folder} ({exc.strerror or exc})") from None


def remove_created_folders(failed: bool) -> None:
    """After a run: where it failed, the folders it created that are still empty go (it wrote nothing there)."""
    while _created_folders:
        folder = _created_folders.pop(0)
        if failed:
            with contextlib.suppress(OSError):  # not empty (another run's files, or a cache written), or gone
                folder.rmdir()
