"""The curate pipeline: records -> token counts + embeddings -> labels -> order -> stats and outputs.

``curate(config)`` runs the stages below in order, each one function a reader can find by name:

    index_input -> counts_and_embeddings -> reduce -> cluster -> order
                -> (measure | write_outputs | describe, side by side) -> plot -> write_metadata

``calibrate(config)`` (``--calibrate-k``) shares the first three stages, then sweeps k instead.
Per-document state stays in flat arrays indexed by input position, carried between the stages
by a ``Run``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import (
    arrow_json,
    atomic,
    caches,
    clustering,
    distributed,
    diversity,
    features,
    fields,
    kept_rows,
    matrix,
    ordering_report,
    outputs,
    plots,
    records,
    scale_out,
    sources,
    writers,
)
from .atomic import atomic_open, replaced_together, save_json, save_npy, sweep_stale_temps
from .defaults import DEFAULT_N_CLUSTERS, DEFAULT_ORDERING
from .errors import MAX_COUNT, EveryRankError, UserError, check_range
from .features import EXTERNAL_METHOD, SHALLOW_METHOD, ModelParts
from .fields import DEFAULT_TEXT_FIELD, KNOWN_ROLES, as_tuple, cache_key
from .orderings import ORDERINGS, SCORE_ORDERINGS, SPECS, OrderingOptions, registry
from .orderings.options import flag_fields, flag_of
from .packing import PACKING_MODELS, SPLIT
from .projection import projection_or_none
from .runtime import StageTimer, heartbeat, side_by_side, start

log = logging.getLogger(__name__)


# From this many documents the last three stages (statistics, curated file, cluster descriptions) run
# side by side: they are independent, and at scale each waits mostly on the disk (10M documents: 18.4 s
# one after another, 10.5 s side by side). Below it they are short and compete for the cores, and their
# working memory adds up (20K documents: 1.08 s one after another, 1.2 s side by side, +125 MB peak).
SIDE_BY_SIDE_ROWS = 1_000_000
# Records longer than a window holding this share of the tokens or more: said as a warning, not a note.
LONG_RECORDS_WARN_SHARE = 0.1


@dataclass
class CurateConfig:
    input: Path | str | tuple  # one --input value or several (files, folders, globs; see sources.py)
    output: Path
    model_dir: Path | None = None
    device: str = "auto"
    gpu: int = 0
    embed_batch_size: int = 1024
    n_clusters: int = DEFAULT_N_CLUSTERS
    text_field: str | tuple[str, ...] = DEFAULT_TEXT_FIELD  # several: their texts joined (fields.py)
    output_format: str | None = None  # None: the output's suffix, else the input's format (writers.py)
    output_shards: int = 1
    count_special_tokens: str = "none"  # tokenizer.SPECIAL_TOKEN_MODES
    export_packed: Path | None = None
    stats_only: bool = False
    calibrate_k_samples: int = 10000
    no_plot: bool = False
    load_embeddings: Path | None = None
    pca_components: int = 0
    cluster_backend: str = clustering.CLUSTER_BACKENDS[0]
    cluster_fit_sample: int = 0
    # Bytes the embeddings may take in memory for the exact path (None: matrix.memory_budget()'s default).
    memory_budget: int | None = None
    embedding_dtype: str = features.EMBEDDING_DTYPES[0]
    progress: bool = True
    ordering: str = DEFAULT_ORDERING
    # More packed lengths for --compare-strategies (ordering_options.seq_len is always compared first).
    extra_seq_lens: tuple[int, ...] = ()
    compare_strategies: bool = False
    # Everything the orderings read: the sequence length, the seed and the ordering flags.
    ordering_options: OrderingOptions = field(default_factory=OrderingOptions)
    # Set by validate(): the files behind --input, and the format of the curated output.
    inputs: sources.Inputs | None = field(default=None, repr=False, compare=False)
    written_kind: str = field(default="", repr=False, compare=False)

    @property
    def seq_len(self) -> int:
        return self.ordering_options.seq_len

    @property
    def seed(self) -> int:
        return self.ordering_options.seed

    def validate(self) -> None:
        """Flags in range and outputs writable, before any long work (each failure one line naming the flag)."""
        check_range(self.n_clusters, "--n-clusters", 1, 2**31)
        check_range(self.embed_batch_size, "--embed-batch-size", 1, 2**31)
        check_range(self.calibrate_k_samples, "--calibrate-k-samples", 0, MAX_COUNT, "0 = all")
        check_range(self.pca_components, "--pca-components", 0, 2**31, "0 = off")
        check_range(self.cluster_fit_sample, "--cluster-fit-sample", 0, MAX_COUNT, "0 = all")
        check_range(self.gpu, "--gpu", 0, 2**16)
        checks = [
            (self.cluster_backend in clustering.CLUSTER_BACKENDS,
             f"--cluster-backend {self.cluster_backend}: choose one of {', '.join(clustering.CLUSTER_BACKENDS)}"),
            (self.ordering in ORDERINGS, f"--ordering {self.ordering}: choose one of {', '.join(ORDERINGS)}"),
            (self.embedding_dtype in features.EMBEDDING_DTYPES,
             f"--embedding-dtype {self.embedding_dtype}: choose one of {', '.join(features.EMBEDDING_DTYPES)}"),
            (self.memory_budget is None or self.memory_budget > 0, "--memory-budget: must be a positive size"),
            (self.ordering not in SCORE_ORDERINGS or self.ordering_options.score_field is not None,
             f"--ordering {self.ordering} orders by a per-document score: name its JSON field with --score-field"),
            (not self.extra_seq_lens or self.compare_strategies,
             "--seq-len takes several values only with --compare-strategies (the curated file follows the first)"),
            (not 0 < self.cluster_fit_sample < self.n_clusters,
             f"--cluster-fit-sample {self.cluster_fit_sample}: fewer rows than --n-clusters {self.n_clusters} "
             f"centres to fit; give at least {self.n_clusters} (0: all rows)"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        if self.memory_budget is not None and self.memory_budget > matrix.total_memory_bytes():
            log.warning("--memory-budget %s GiB: more than the %.1f GiB of memory this process may use (the "
                        "machine's, or its container's limit); embeddings that size would be loaded and the run "
                        "killed for want of memory rather than fitted on a sample", f"{self.memory_budget / 2**30:,.1f}",
                        matrix.total_memory_bytes() / 2**30)
        for value in self.extra_seq_lens:
            check_range(value, "--seq-len", 1, MAX_COUNT, "tokens")
        self.ordering_options.validate()
        self._validate_data_flags()
        paths = outputs.output_paths(self.inputs.name, self.output, self.text_field, self.inputs.counts_beside_output)
        written = files_written(self, paths)
        if self.load_embeddings is not None:
            for role in ("embeddings", "embeddings fingerprints", "embeddings manifest"):
                del written[role]  # precomputed embeddings: no shallow cache is written
        for path in self.inputs.files:
            outputs.check_locations(self.output, written, {"--input": path, "--load-embeddings": self.load_embeddings},
                                    folder_output=self.written_kind == "arrow")
        if self.export_packed is not None:
            from .packed_export import check_folder

            outputs.check_outside_model_dir(self.export_packed, self.model_dir, "--export-packed")
            export = self.export_packed.resolve()  # resolved: "../w/EP" is EP too
            for path in [*self.inputs.files, self.load_embeddings]:
                if path is not None and (outputs.same_file(self.export_packed, path)
                                         or export in Path(path).resolve().parents):
                    raise UserError(f"--export-packed {self.export_packed}: holds the input {path}, which the export "
                                    "would replace; give the export a folder of its own")
            for role, path in {"output": self.output, **written}.items():
                same = outputs.same_file(self.export_packed, path)
                if same or export in Path(path).resolve().parents:
                    what = "--output" if role == "output" else f"this run's {role.replace('_', ' ')}"
                    raise UserError(f"--export-packed {self.export_packed}: {'is' if same else 'would hold'} {what} "
                                    f"({path}); give the export a folder of its own")
            check_folder(self.export_packed)
            outputs.check_writable_folder(self.export_packed.absolute().parent, "--export-packed")

    def _validate_data_flags(self) -> None:
        """The inputs exist and are one format; the output format, shards and token flags make sense."""
        from .tokenizer import SPECIAL_TOKEN_MODES

        check_range(self.output_shards, "--output-shards", 1, 99999)
        if self.count_special_tokens not in SPECIAL_TOKEN_MODES:
            raise UserError(f"--count-special-tokens {self.count_special_tokens}: choose one of "
                            f"{', '.join(SPECIAL_TOKEN_MODES)}")
        self.inputs = sources.resolve_inputs(self.input)
        self.written_kind = writers.output_kind(self.inputs.kind, self.output, self.output_format)
        if outputs.data_suffix_length(self.output.name) == len(self.output.name):
            raise UserError(f"--output {self.output}: give the file a name before its suffix (e.g. "
                            f"{self.output.with_name('curated' + self.output.name)})")
        inside = [f for f in self.inputs.files if self.output.absolute() in f.absolute().parents]
        if inside:
            raise UserError(f"--output {self.output}: holds the input {inside[0]}; the curated folder would replace "
                            "it: choose another output path")
        folders = [Path(given) for given in self.inputs.given if Path(given).is_dir()]
        holding = [folder for folder in folders if folder.resolve() in self.output.resolve().parents]
        if holding:
            raise UserError(f"--output {self.output}: inside the --input folder {holding[0]}, which is read whole: "
                            "a later run would read the curated records as input too; write outside it")
        outputs.check_outside_model_dir(self.output, self.model_dir)
        if self.written_kind == "arrow" and self.output_shards > 1:
            raise UserError("--output-shards: a datasets folder is written as one folder; for shards write Parquet "
                            "(--output-format parquet)")
        if self.export_packed is not None and self.model_dir is None:
            raise UserError("--export-packed needs --model-dir: the packed sequences are token ids")

    @property
    def text_fields(self) -> tuple[str, ...]:
        return as_tuple(self.text_field)


@dataclass
class CurateResult:
    meta: dict
    labels: np.ndarray
    order: np.ndarray
    token_counts: np.ndarray
    embeddings: np.ndarray
    paths: dict[str, Path]
    calibration: list | None = None
    recommended_k: int | None = None
    timings: dict = field(default_factory=dict)


@dataclass
class Run:
    """The state one curate run carries from stage to stage (flat arrays indexed by input position)."""

    config: CurateConfig
    device: object
    ctx: object
    timer: StageTimer = field(default_factory=StageTimer)
    paths: dict = field(default_factory=dict)
    model: ModelParts | None = None
    index: records.RecordIndex | None = None
    options: OrderingOptions | None = None  # with the scores and balance fields read from the records
    counts: np.ndarray | None = None
    embeddings: np.ndarray | None = None
    method: str = ""
    pca_info: clustering.PCAInfo | None = None
    # rows -> reduced rows, where the embeddings are kept unreduced but the labels were found reduced (torchrun,
    # k-means fitted on a sample, with PCA); None elsewhere
    reduced: object = None
    labels: np.ndarray | None = None
    order: np.ndarray | None = None
    windows: dict = field(default_factory=dict)  # per order ("original", "curated", "random_shuffle"): window_counts
    quality: dict = field(default_factory=dict)  # ordering_quality per order
    field_quality: dict = field(default_factory=dict)
    similarity: dict = field(default_factory=dict)
    comparison: dict | None = None
    packed: dict | None = None  # what --export-packed wrote
    earlier_packed_export: str | None = None  # an earlier run's export folder, not replaced by this run
    curated_files: list = field(default_factory=list)
    parquet_schema: object = None  # JSONL converted to Parquet: the set's columns, checked before the long work
    special_tokens_per_document: int = 0  # added to every count (--count-special-tokens)
    chat_template: dict | None = None  # the template conversations are rendered with (file, hash), if any
    cluster_plan: clustering.Plan | None = None
    kmeans_fit_rows: int | None = None  # the rows the k-means centres were fitted on
    scratch: list = field(default_factory=list)  # temp files of this run, removed when it ends
    torchrun: dict | None = None  # how the ranks shared the work (for the metadata)
    rank_rows: np.ndarray | None = None  # under torchrun, each rank's own input rows (bounds), when it indexed them

    @property
    def n(self) -> int:
        return len(self.index)


def curate(config: CurateConfig) -> CurateResult | None:
    """Run the pipeline; under torchrun, ranks other than 0 return None after labelling their rows."""
    run = _start(config)
    if run.ctx.is_main:
        _warn_of_export_settings(config)
    try:
        if run.ctx.active:
            if not _embed_and_cluster_across_ranks(run):
                if _shards_across_ranks(run):
                    _write_shards_across_ranks(run)  # this rank's slices of the order rank 0 made
                return None  # rank 0 orders and writes the rest; the other ranks' work is done
        else:
            _embed(run, fail_fast=True, hold_fit_sample=True)
            reduce(run)
            if run.n < SIDE_BY_SIDE_ROWS:
                # k-means keeps about one core busy; the sampled similarity needs no labels and takes another.
                side_by_side(run.timer, (cluster, run), (similarity, run))
            else:
                cluster(run)
        order(run)
        settle_output_paths(run)
        last_stages = ((measure, run), (write_outputs, run), (describe, run))
        if not run.similarity:
            last_stages += ((similarity, run),)
        if run.n >= SIDE_BY_SIDE_ROWS:
            side_by_side(run.timer, *last_stages)
        else:
            for function, *args in last_stages:
                function(*args)
        report_measures(run)
        if not config.no_plot:
            # Drawing can take a minute (UMAP): a run stopped there still leaves metadata for the files it wrote.
            write_metadata(run, plots_drawn=False)
        plot(run)
        meta = write_metadata(run)
        # A killed run's temp files beside what this run wrote, and beside the shards of another count a killed
        # run was writing (never a live run's).
        sweep_stale_temps(writers.shard_names_with_temps(config.output))
        log.info("%s", run.timer.finished_line())
        return CurateResult(meta, run.labels, run.order, run.counts, run.embeddings, run.paths,
                            timings=run.timer.seconds)
    finally:
        _finish(run)


def _warn_of_export_settings(config: CurateConfig) -> None:
    """What --export-packed does that a user may not expect of the packing flag, said before the long work (of a
    missing separator, once the tokens are counted: ``_with_special_tokens``)."""
    if config.export_packed is None:
        return
    if config.ordering_options.packing != PACKING_MODELS[SPLIT]:
        log.warning("--export-packed cuts documents across sequences (packing split), while the statistics follow "
                    "--packing %s; give --packing split to measure, and to order for, what the export holds",
                    config.ordering_options.packing)


def calibrate(config: CurateConfig) -> CurateResult | None:
    """``--calibrate-k``: embed, reduce, then sweep k by silhouette and recommend one (no ordering, no output)."""
    run = _start(config)
    try:
        if run.ctx.active:
            # The ranks embed into the shared cache file; rank 0 sweeps k reading it (a sample of its
            # rows beyond the memory budget), so no vectors travel between processes.
            run.embeddings = _embed_across_ranks(run, fail_fast=False)
            if not run.ctx.is_main:
                return None
        elif not _embed(run, fail_fast=False):
            return None
        reduce(run)
        rows, recommended = sweep_k(run)
        sweep_stale_temps()
        return CurateResult({}, np.zeros(0, np.int64), np.zeros(0, np.int64), run.counts, run.embeddings, run.paths,
                            calibration=rows, recommended_k=recommended, timings=run.timer.seconds)
    finally:
        _finish(run)


def _start(config: CurateConfig) -> Run:
    """Validate the flags and join the ranks (under torchrun). A refusal on any rank is every rank's error: they
    join first and hear it (a rank of another node that left before joining kept the others waiting at the join
    for hours: a reviewer's input missing on one node)."""
    try:
        config.validate()
        refused = None
    except UserError as exc:
        if not distributed.launched_by_torchrun():
            raise
        refused = str(exc)
    device, ctx = start(config.device, config.gpu)
    if ctx.active:
        refusals = [said for said in distributed.all_gather_object(ctx, refused) if said is not None]
        if refusals:
            raise EveryRankError(refusals[0])
    if not ctx.is_main:
        logging.getLogger("diversity_order").setLevel(logging.WARNING)
    run = Run(config, device, ctx, paths=outputs.output_paths(config.inputs.name, config.output, config.text_field,
                                                              config.inputs.counts_beside_output))
    if ctx.is_main:
        _remove_what_killed_runs_left(run)
        if config.inputs.spread:
            log.info("The input files are in %d folders: their token counts are cached beside the output (%s), not "
                     "beside a folder they share", len(config.inputs.folders),
                     run.paths["token_counts"].name)
        elif config.inputs.system_folder:
            log.info("The input is read through a system folder (%s): its token counts are cached beside the output "
                     "(%s)", config.inputs.name, run.paths["token_counts"].name)
    return run


# The roles of output_paths that are caches (a data file with fingerprints and a manifest beside it).
CACHE_ROLES = ("embeddings", "token_counts", "umap", "kmeans")


def files_written(config: CurateConfig, paths: dict[str, Path]) -> dict[str, Path]:
    """Every file a run with these ``paths`` may write beside its output, by role: the files of ``paths``, each
    cache's fingerprints and manifest, the layout fit, the strategies reports and a --stats-only trial's own files,
    the shards. An input of one of these names would be overwritten (a reviewer's data_strategies.json was)."""
    from .caches import files_for
    from .projection import fit_path

    stem = outputs.output_stem(config.output)
    trial = outputs.stats_only_paths(paths, config.output)
    written = {**paths, **{f"{role} (of a --stats-only trial)": trial[role] for role in outputs.DESCRIBING_ORDER},
               "2-D layout fit": fit_path(paths["umap"]), "token counts (beside the output)": kept_rows.counts_target(paths)}
    for tagged, place in (("", stem), (" (of a --stats-only trial)", Path(f"{stem}{outputs.STATS_ONLY_TAG}"))):
        written.update({f"strategies {kind}{tagged}": path for kind, path in ordering_report.report_paths(place).items()})
    for role in CACHE_ROLES:  # a cache's companions
        written.update({f"{role} fingerprints": files_for(paths[role]).fingerprints,
                        f"{role} manifest": files_for(paths[role]).marker})
    # What an interrupted torchrun run keeps (its manifest is read, and removed, by the next run)
    for role, target in (("embeddings", paths["embeddings"]), ("token counts", kept_rows.counts_target(paths))):
        written.update({f"kept {role} {kind}": path for kind, path in kept_rows.kept_paths(target).items()
                        if kind != "rank"})
    registry = caches.registry_dir()
    if registry is not None:
        written["cache registry"] = registry / caches.REGISTRY_FILE
    if config.output_shards > 1:
        written.update({f"output shard {i}": path for i, path in
                        enumerate(writers.shard_paths(config.output, config.output_shards))})
    return written


def _remove_what_killed_runs_left(run: Run) -> None:
    """The temp files and staged shards of runs killed while writing this run's files (kill -9, an out-of-memory
    kill), removed before anything is written: a cache's temp file is as large as the cache (2.3 GB for 1M
    documents), and on a nearly full disk one left behind made every later run fail for want of room. Never a
    live process's (``atomic.remove_stale_temps``)."""
    config = run.config
    targets = [*files_written(config, run.paths).values(), config.output, *writers.shard_names_with_temps(config.output)]
    if config.export_packed is not None:
        targets.append(config.export_packed)
    removed = [path for target in targets for path in atomic.remove_stale_temps(target)]
    if removed:
        log.info("Removed %d file(s) that killed runs left beside this run's files (%s%s)", len(removed),
                 removed[0].name, f" ... {removed[-1].name}" if len(removed) > 1 else "")


def _finish(run: Run) -> None:
    for path in run.scratch:
        path.unlink(missing_ok=True)
    distributed.shutdown(run.ctx)


def _embed(run: Run, fail_fast: bool, hold_fit_sample: bool = False) -> bool:
    """The stages up to embeddings; True on the process that goes on (rank 0). ``hold_fit_sample``:
    keep the rows the first fit will read in memory as they are embedded (``_rows_read_first``)."""
    _prepare_model(run)
    index_input(run, fail_fast)
    counts_and_embeddings(run, _rows_read_first(run) if hold_fit_sample else None)
    return run.ctx.is_main


def _embed_across_ranks(run: Run, fail_fast: bool):
    """Under torchrun: token counts (rank 0) and the embeddings every rank reads, as a file: the shared
    cache file the ranks fill, or ``--load-embeddings``' file."""
    config, ctx = run.config, run.ctx
    _prepare_model(run)
    index_input(run, fail_fast)
    with run.timer.stage(f"{_counts_stage(config)} ({ctx.world_size} ranks)"):
        if config.load_embeddings is None:
            counts, vectors = scale_out.counts_and_shared_embeddings(
                ctx, run.index, run.paths, run.model, config.text_field, config.embed_batch_size, config.progress,
                run.rank_rows)
            run.method = SHALLOW_METHOD
        else:
            try:
                vectors = scale_out.external_embeddings(config.load_embeddings, run.n)
            except UserError as exc:  # every rank reads the same file
                raise EveryRankError(str(exc)) from None
            if ctx.is_main:  # its warnings once
                features.check_external_rows(config.load_embeddings, run.index.fingerprints)
            counts, _ = features.counts_and_embeddings(run.index, run.paths, run.model, config.text_field, False,
                                                       config.embed_batch_size, config.progress, ctx)
            run.method = EXTERNAL_METHOD
        # (rank 0's; the other ranks have none) As one process counts them: with the tokens the trainer adds. Under
        # torchrun they were left out, so --count-special-tokens changed nothing there but fail an export.
        run.counts = _with_special_tokens(run, counts)
    return vectors


def _embed_and_cluster_across_ranks(run: Run) -> bool:
    """Under torchrun: the ranks embed into the shared cache file and label their own rows with
    centres fitted on a seeded sample; only labels and token counts reach rank 0 (see scale_out).
    True on rank 0, which goes on."""
    config, ctx = run.config, run.ctx
    vectors = _embed_across_ranks(run, fail_fast=True)
    sample = scale_out.fit_rows(config.cluster_fit_sample, run.n)
    run.torchrun = {"ranks": ctx.world_size, "fit_rows": sample, "rows_gathered": sample == run.n}
    run.kmeans_fit_rows = sample
    if sample == run.n:  # small input: rank 0 takes every row and runs the single-process stages on them
        run.embeddings = scale_out.gather_all_rows(ctx, vectors)
        if ctx.is_main:
            reduce(run)
            cluster(run)
        return ctx.is_main
    with run.timer.stage(f"Clustering (k={config.n_clusters}, {config.cluster_backend}, fitted on {sample:,} sampled "
                         f"rows; {ctx.world_size} ranks assign their own)"):
        run.labels, run.pca_info, run.reduced = scale_out.labels_from_sample(
            ctx, vectors, config.n_clusters, config.seed, config.cluster_backend, sample, config.pca_components,
            run.device)
    run.embeddings = vectors  # the statistics and cluster descriptions read it a block at a time
    return ctx.is_main


def _prepare_model(run: Run) -> None:
    """Fail before the long work: the model folder must exist and hold an embedding table."""
    config = run.config
    run.model = ModelParts(config.model_dir, run.device)
    if config.load_embeddings is None:
        with run.timer.stage("Loading the embedding table"):
            run.model.table()
    elif config.model_dir is not None:
        run.model.require_dir("")


def index_input(run: Run, fail_fast: bool) -> None:
    """Validate and index every record; with ``fail_fast``, also read the score/balance fields now."""
    config = run.config
    with run.timer.stage("Indexing input"):
        if _ranks_keep_own_rows(run):
            # Rank 0's whole index goes into a file beside the outputs (written there anyway), not its memory.
            run.index, run.rank_rows = sources.open_rank_source(config.inputs, config.text_fields, run.ctx,
                                                                progress=config.progress,
                                                                spill_folder=config.output.absolute().parent)
        else:
            run.index = sources.open_source(config.inputs, config.text_fields, progress=config.progress, ctx=run.ctx)
    # The records' own bytes (no line ends, no file framing): the output line gives the files' size instead. Of
    # Parquet and datasets folders only their documents' text is measured (the columns are not read whole).
    log.info("%s: %d record(s), %.1f MB of %s", config.inputs.describe(), run.n, run.index.total_bytes / 1e6,
             "records" if config.inputs.kind == "jsonl" else "documents' text")
    if run.ctx.is_main:
        run.chat_template = _chat_template_used(run)
        _warn_of_copied_files(run)
        _say_repeated_documents(run)
        _warn_of_byte_order_marks(run)
    if not fail_fast:
        return
    if config.n_clusters > run.n:
        raise UserError(f"--n-clusters {config.n_clusters}: larger than the number of records ({run.n}); "
                        f"choose at most {run.n}")
    if run.ctx.is_main:  # a bad score or balance field fails before the long work
        run.options = _ordering_options(config, run.index)
    if not config.stats_only and writers.converts_to_parquet(run.index, config.written_kind):
        with run.timer.stage("Inferring the Parquet columns"), heartbeat(f"Inferring the Parquet columns of {run.n:,} records"):
            run.parquet_schema = _parquet_columns(run)


def _warn_of_copied_files(run: Run) -> None:
    """A folder holding a file twice (a.jsonl and a copy, or a.jsonl beside a.jsonl.gz) has every record of it read,
    curated and trained on once per copy: said, not refused (the user may mean it). So is a file most of whose
    documents other files hold too (the first lines of another file, saved apart; a subset exported again)."""
    copies = sources.copied_files(run.index)
    if copies:
        copy, original, _ = copies[0]
        shuffled = sum(not same_order for _, _, same_order in copies)
        log.warning("%d input file(s) hold the same documents as another input file%s (%s copies %s%s): each of their "
                    "records is curated, and trained on, once per copy; leave the copies out of --input if that is not "
                    "meant", len(copies), f", {shuffled} of them in another order" if shuffled else "", copy,
                    original.name, f"; the last: {copies[-1][0].name}" if len(copies) > 1 else "")
    overlapping = sources.overlapping_files(run.index, leave_out={copy for copy, _, _ in copies})
    if overlapping:
        named = [overlapping[0]] + ([overlapping[-1]] if len(overlapping) > 1 else [])
        shares = "; the last: ".join(["%s: %d of its %d distinct documents are in other files too, e.g. %s"] * len(named))
        sampled = " (counted on a sample of the fingerprints)" if sources.overlap_sampled(run.index) else ""
        log.warning("%d input file(s) hold mostly documents other input files hold too (" + shares + ")%s: those "
                    "documents are curated, and trained on, once per file; leave the overlapping files out of --input "
                    "if that is not meant", len(overlapping),
                    *[value for path, other, shared, distinct in named for value in (path, shared, distinct, other)],
                    sampled)


# Records repeating an earlier record's document: said at info level below this share of the records, warned of
# from it (a file concatenated with itself repeats a third or a half of them; SFT sets often repeat a few).
REPEATS_WARNED = 0.01


def _say_repeated_documents(run: Run) -> None:
    """Records whose document (the text or conversation) an earlier record holds too: each is curated, and trained
    on, once per record; said with the first, not refused (the other fields may differ on purpose)."""
    repeats, example = sources.repeated_documents(run.index)
    if not repeats:
        return
    where = getattr(run.index, "where", None)
    named = f", e.g. {where(example[0])} repeats {where(example[1])}" if where else ""
    sampled = " (estimated from a sample of the fingerprints)" if sources.overlap_sampled(run.index) else ""
    log.log(logging.WARNING if repeats >= REPEATS_WARNED * run.n else logging.INFO,
            "Records holding the same document as an earlier record: %d of %d%s%s; each is curated, and trained on, "
            "once per record", repeats, run.n, sampled, named)


def _warn_of_byte_order_marks(run: Run) -> None:
    """A JSONL file that starts with a UTF-8 byte order mark: read without it, and written without it (before its
    first record in the curated order it would sit mid-file, where no JSONL reader takes it), which a byte-for-byte
    check of the records then finds; said rather than silent."""
    marked = sources.files_with_byte_order_mark(run.config.inputs)
    if marked:
        log.warning("%d input file(s) start with a UTF-8 byte order mark (%s%s): it is not part of a record, so the "
                    "curated output does not have it; their records are otherwise written byte for byte", len(marked),
                    marked[0], f" ... {marked[-1].name}" if len(marked) > 1 else "")


def _parquet_columns(run: Run):
    """JSONL converted to Parquet: the set's one schema, its columns in the order the input first has them.
    Inferred when the input is read, so records that cannot share one table (a field a number in one record and
    a string in another) fail in seconds rather than after the embedding; the write takes it (no second pass).
    Under torchrun each rank infers its own rows; the parts are unified in rank order on every rank."""
    ctx = run.ctx
    if not ctx.active:
        return writers.parquet_schema(run.index, np.arange(run.n))
    bounds = scale_out.own_rows(ctx, run.index, run.rank_rows)
    schema, object_keys, failure = None, {}, None
    try:
        # Unchecked for a part of the records: a field holding {} there may hold fields in another part.
        schema, object_keys = writers.inferred_columns(run.index, np.arange(bounds[ctx.rank], bounds[ctx.rank + 1]))
    except UserError as exc:
        failure = str(exc)
    parts = distributed.all_gather_object(ctx, (None if schema is None else schema.serialize().to_pybytes(), failure,
                                                object_keys))
    failures = [message for _, message, _ in parts if message is not None]
    if failures:  # every rank stops with the first failing rank's message, which rank 0 says
        raise EveryRankError(failures[0])
    import pyarrow as pa

    def find_clash(fields: set[str]) -> str | None:
        # Every rank's part was typed alone: each finds where its own records first hold each kind of those fields.
        own = writers.kinds_at_fields(run.index, np.arange(bounds[ctx.rank], bounds[ctx.rank + 1]), fields)
        return writers.clash_in(distributed.all_gather_object(ctx, own))

    try:
        object_keys = arrow_json.merge_object_keys([keys for _, _, keys in parts])
        writers.refuse_signed_and_unsigned(run.index, object_keys, find_clash)
        # A path one rank holds as JSON text, or that is so only once the ranks' records are put together, is so in
        # every rank's part.
        as_text = arrow_json.uneven_object_paths(object_keys)
        schema = writers.unify_parquet_schemas(
            run.index, [arrow_json.with_json_at(pa.ipc.read_schema(pa.py_buffer(part)), as_text) for part, _, _ in parts],
            find_clash)
        return writers.finished_schema(run.index, schema, object_keys, say=ctx.is_main)
    except UserError as exc:  # every rank has every part: each finds the same
        raise EveryRankError(str(exc)) from None


def _chat_template_used(run: Run) -> dict | None:
    """The chat template conversations are rendered with, said once where the text field holds them; a field
    that holds conversations in some records and plain text in others is warned of, naming both."""
    from .tokenizer import say_chat_template

    kinds = run.index.kinds
    field = cache_key(run.config.text_field)  # ("prompt+completion", not a tuple's repr)
    if kinds is not None and kinds.encoded:
        log.warning("'%s' holds a conversation written as a JSON string in %d of %d records (the first: %s): it is "
                    "read as plain text, its JSON's tokens counted, not the chat template's rendering; store the "
                    "messages as a list of role/content objects (json.loads the column) to have them rendered",
                    field, kinds.encoded, run.n, run.index.where(kinds.first_encoded_row))
    if kinds is None or kinds.conversations == 0:
        return None
    if kinds.first_text_row >= 0:
        log.warning("'%s' holds a conversation in %d of %d records and plain text in the others (the first: %s; the "
                    "first conversation: %s): plain texts are tokenized as they are, without the chat template; give "
                    "every record the same kind", field, kinds.conversations, run.n, run.index.where(kinds.first_text_row),
                    run.index.where(kinds.first_conversation_row))
    _warn_unknown_roles(run, kinds)
    _warn_of_what_trl_reads_otherwise(run, kinds)
    if run.config.model_dir is None:
        # (--load-embeddings with cached token counts: the conversations were rendered by an earlier run)
        return {"file": None, "blake2b": None, "note": "not known: no --model-dir; the token counts were read from "
                                                       "a cache an earlier run made"}
    return say_chat_template(field, Path(run.config.model_dir))


def _warn_unknown_roles(run: Run, kinds: records.DocumentKinds) -> None:
    """Roles a chat template may not know (ShareGPT's human/gpt kept in role/content messages), as the index
    counted them in every conversation, said with where each is first."""
    if kinds.unknown_roles:
        listing = ", ".join(f"'{role}' in {count:,} of the {kinds.conversations:,} conversations (the first: "
                            f"{run.index.where(row)})" for role, (count, row)
                            in sorted(kinds.unknown_roles.items(), key=lambda item: (-item[1][0], item[0])))
        log.warning("'%s' has roles other than %s: %s. The chat template renders them as it renders a role it was not "
                    "written for (many, as a role of that name); rename them if they mean user and assistant",
                    cache_key(run.config.text_field), "/".join(sorted(KNOWN_ROLES)), listing)


def _warn_of_what_trl_reads_otherwise(run: Run, kinds: records.DocumentKinds) -> None:
    """Conversations this renders that TRL's SFT trainer fails on (a reviewer's curated files it could not train):
    chat_template_kwargs null, or absent beside records that have it (the datasets library reads it as null there);
    ShareGPT turns in a field not named as TRL converts."""
    notes, total = kinds.trainer_notes, kinds.conversations
    null, given, absent = (notes.get(note, [0, -1]) for note in (fields.KWARGS_NULL, fields.KWARGS_GIVEN,
                                                                fields.KWARGS_ABSENT))
    parts, counts, firsts = [], [], []
    if null[0]:
        parts.append("null in %d")
        counts.append(null[0])
        firsts.append(null[1])
    if absent[0] and given[0]:
        parts.append("absent in %d (beside %d that have it)")
        counts.extend((absent[0], given[0]))
        firsts.append(absent[1])
    if parts:
        log.warning("chat_template_kwargs is " + " and ".join(parts) + " of the %d conversations (the first: %s): the "
                    "chat template renders them without it here, but TRL's SFT trainer fails on them ('NoneType' "
                    "object is not a mapping; the datasets library reads a field some records lack as null for them); "
                    "give those records {} or no record the field", *counts, total, run.index.where(min(firsts)))
    sharegpt = notes.get(fields.SHAREGPT_ELSEWHERE)
    if sharegpt:
        one_field = isinstance(run.config.text_field, str)  # (a prompt and completion cannot both be renamed so)
        log.warning("%d conversation(s) of '%s' are ShareGPT turns (from/value; the first: %s): read here as "
                    "role/content, but TRL's SFT trainer converts them only in a field named '%s' and fails on them "
                    "elsewhere; %sgive the turns role/content keys", sharegpt[0], cache_key(run.config.text_field),
                    run.index.where(sharegpt[1]), fields.SHAREGPT_FIELD, "rename the field, or " if one_field else "")


def _ranks_keep_own_rows(run: Run) -> bool:
    """Under torchrun, a rank other than 0 holds only its own records' index when all it reads are
    those (to embed them); writing output shards reads any record, and so does counting tokens for
    --load-embeddings."""
    return run.ctx.active and run.config.load_embeddings is None and not _shards_across_ranks(run)


def _counts_stage(config) -> str:
    """The stage's name in the log: with --load-embeddings it only counts tokens."""
    return "Token counts" if config.load_embeddings is not None else "Token counts and embeddings"


def counts_and_embeddings(run: Run, hold_rows: np.ndarray | None = None) -> None:
    config = run.config
    with run.timer.stage(_counts_stage(config)):
        external = config.load_embeddings is not None
        if external:
            run.embeddings = features.load_external_embeddings(config.load_embeddings, run.n)
            features.check_external_rows(config.load_embeddings, run.index.fingerprints)
        counts, embeddings = features.counts_and_embeddings(
            run.index, run.paths, run.model, cache_key(config.text_field), not external, config.embed_batch_size,
            config.progress, run.ctx, config.embedding_dtype, hold_rows)
        run.counts = _with_special_tokens(run, counts)
        if not external:
            run.embeddings = embeddings
        run.method = EXTERNAL_METHOD if external else SHALLOW_METHOD
    # Nothing embeds after this: what embedding held goes back before k-means loads the matrix.
    run.model.release_table()
    matrix.return_freed_memory()


def reduce(run: Run) -> None:
    """Optional PCA (``--pca-components``), rows re-normalised; fitted on a sample when the matrix
    exceeds the memory budget (see ``_plan``), every row projected into a scratch file."""
    config = run.config
    if config.pca_components <= 0:
        return
    plan = _plan(run, "PCA")
    with run.timer.stage(f"PCA to {config.pca_components} components"):
        run.embeddings, run.pca_info = clustering.reduce_matrix(run.embeddings, config.pca_components, config.seed,
                                                                plan, None if plan.exact else _scratch(run, "pca"))
    if run.pca_info is not None:
        log.info("PCA kept %d of %d dimensions, %.1f%% of the variance", run.pca_info.n_components,
                 run.pca_info.original_dim, 100 * run.pca_info.explained_variance)


def _plan(run: Run, step: str) -> clustering.Plan:
    """Exact (the embeddings in memory, today's faithful results) while they fit --memory-budget,
    else fitted on a seeded sample read from the file; logged with the reason."""
    plan = clustering.plan_for(run.embeddings, matrix.memory_budget(run.config.memory_budget))
    log.info("%s %s: %s", step, "in memory" if plan.exact else "out of core", plan.reason)
    return plan


def _scratch(run: Run, role: str) -> Path:
    """A temp file beside the output for an intermediate matrix, removed when the run ends (a killed
    run's is swept by a later one, as any atomic write's temp is)."""
    target = Path(f"{outputs.output_stem(run.config.output)}_{role}.npy")
    atomic.note_target(target)
    handle, name = tempfile.mkstemp(prefix=atomic.temp_prefix(target), suffix=".tmp", dir=target.parent)
    os.close(handle)
    run.scratch.append(Path(name))
    return Path(name)


def sweep_k(run: Run):
    """Silhouette for each candidate k; the table is logged and saved. Calibrates on what would be
    clustered (after PCA when it is on), unlike the original toolkit, which calibrates before PCA.
    Out of core, k-means and the silhouette use seeded samples of at most the plan's size."""
    config = run.config
    plan = _plan(run, "k calibration")
    samples = config.calibrate_k_samples
    if plan.exact:
        embeddings, fit_sample = matrix.load(run.embeddings), 0
    else:
        embeddings, fit_sample = run.embeddings, plan.sample
        samples = min(samples or run.n, plan.sample)
    used = run.n if samples == 0 else min(samples, run.n)
    with run.timer.stage(f"Calibrating k (silhouette on {'all' if samples == 0 else used} rows)"):
        rows, recommended = clustering.calibrate_k(embeddings, samples, config.seed, progress=config.progress,
                                                   device=run.device, fit_sample=fit_sample)
    del embeddings
    advice = _recommendation(recommended, rows, run.n)
    log.info("%s", advice)  # the table goes to standard output (the command prints it)
    # recommended_k is the rule's k (the reference's key); the advice says when that k is no peak, so a reader of the
    # file alone does not take the smallest k tried for an answer.
    save_json(run.paths["calibration"], {"input": _recorded_path(config.inputs.name), "samples": used, "seed": config.seed,
                                         "pca": run.pca_info.as_dict() if run.pca_info else None,
                                         "k_means_fit_rows": fit_sample or run.n,
                                         "rows": [r.as_dict() for r in rows], "recommended_k": recommended,
                                         "advice": advice})
    log.info("Calibration table written to %s", run.paths["calibration"])
    return rows, recommended


def _kmeans_fit_rows(config: CurateConfig, plan: clustering.Plan) -> int:
    """Rows the k-means fit sees (0: all): --cluster-fit-sample, at most the plan's sample out of core."""
    if plan.exact:
        return config.cluster_fit_sample
    return min(config.cluster_fit_sample, plan.sample) if config.cluster_fit_sample else plan.sample


def _rows_read_first(run: Run) -> np.ndarray | None:
    """The seeded sample of embedding rows the first fit after embedding will read (out of core: PCA's,
    else k-means'), worked out before embedding, so those rows can be kept as they are embedded
    instead of read back from a file larger than memory; None when the fit reads every row."""
    config = run.config
    if config.load_embeddings is not None:
        return None
    plan = clustering.plan_for_shape(run.n, run.model.table().dim, matrix.memory_budget(config.memory_budget))
    if config.pca_components > 0:
        fit = 0 if plan.exact else plan.sample  # what reduce_matrix samples
    else:
        fit = _kmeans_fit_rows(config, plan)  # what kmeans_labels samples
    return clustering.sample_rows(run.n, fit, config.seed) if 0 < fit < run.n else None


def cluster(run: Run) -> None:
    """k-means labels: today's faithful fit on every row while the embeddings fit the memory budget;
    beyond it, fitted on the plan's seeded sample and every row assigned block by block."""
    config = run.config
    run.cluster_plan = plan = _plan(run, "k-means")
    fit_sample = _kmeans_fit_rows(config, plan)
    run.kmeans_fit_rows = fit_sample if 0 < fit_sample < run.n else run.n
    backend_name = {"sklearn": "MiniBatchKMeans", "faiss": "faiss k-means", "torch": "torch k-means"}[config.cluster_backend]
    fitted_on = f", fitted on {fit_sample:,} rows" if 0 < fit_sample < run.n else ""
    with run.timer.stage(f"Clustering ({backend_name}, k={config.n_clusters}{fitted_on})"):
        # An unchanged rerun keeps the labels: at 1M documents the fit took 9-36 s, the key's digest and the lookup
        # 0.7-1.7 s (BENCHMARKS).
        key = clustering.labels_key(run.embeddings, run.index.fingerprints, config.n_clusters, config.seed,
                                    config.cluster_backend, fit_sample, run.device)
        found = caches.lookup(run.paths["kmeans"], key, run.index.fingerprints, dtype=np.int64, row_shape=())
        run.labels = clustering.kept_labels(found, config.n_clusters)
        if run.labels is not None:
            log.info("k-means labels kept, for the same embeddings, k, --seed and fit: %s", found.reason)
            return
        if found.data is None and found.reason != caches.NO_CACHE:  # (a damaged file was refitted without a word)
            log.info("k-means labels fitted again: %s", found.reason)
        run.labels = clustering.kmeans_labels(run.embeddings, config.n_clusters, config.seed, config.cluster_backend,
                                              fit_sample, run.device)
    caches.store(run.paths["kmeans"], key, run.index.fingerprints, run.labels)


def order(run: Run) -> None:
    """The chosen ordering (and, with --compare-strategies, all of them)."""
    config = run.config
    if config.compare_strategies:
        _compare_strategies(run)
    settings = _ordering_settings(config)
    log.info("Ordering %s%s", config.ordering, f" with {settings}" if settings else " (it has no settings)")
    # (a first run compiles the ordering's numba kernels here: a minute or more with nothing else to say)
    with run.timer.stage(f"Ordering ({config.ordering})"), heartbeat(f"Ordering ({config.ordering})"):
        run.order = ORDERINGS[config.ordering](run.labels, run.counts, config.n_clusters, run.options)


def _ordering_settings(config: CurateConfig) -> str:
    """The flags the chosen ordering reads, as given or as its defaults (e.g. saw's --sections 3), for the log: the
    per-ordering defaults were otherwise only in the metadata."""
    flags = {f.name: f.metadata["flag"] for f in flag_fields()} | {"seq_len": "--seq-len"}

    def shown(value) -> str:
        if isinstance(value, (list, tuple)):
            return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or "none"
        return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    settings = registry.options_meta(config.ordering, config.ordering_options)
    return ", ".join(f"{flags.get(name, name)} {shown(value)}" for name, value in settings.items())


def measure(run: Run) -> None:
    """Every measure of the curated order, of the input order and of a random shuffle (the mean of seeded ones:
    ``diversity.random_baseline``)."""
    config = run.config
    labels, counts, k, seq_len, packing = run.labels, run.counts, config.n_clusters, config.seq_len, run.options.packing

    def measured(order: np.ndarray | None, windows=None) -> dict:
        return {"quality": diversity.ordering_quality(labels, counts, seq_len, order, k, windows, packing),
                "fields": _balance_field_quality(run, order)}

    with run.timer.stage("Diversity statistics"):
        run.windows = {name: diversity.window_counts(labels, counts, seq_len, order, packing)
                       for name, order in (("original", None), ("curated", run.order))}
        by_order = {name: measured(order, run.windows[name])
                    for name, order in (("original", None), ("curated", run.order))}
        random_shuffle = diversity.random_baseline(labels.size, run.options.seed, measured)
        shuffles = random_shuffle["shuffles"]
        by_order["random_shuffle"] = {"quality": {**random_shuffle["quality"], "shuffles": shuffles},
                                      "fields": {field: {**q, "shuffles": shuffles}
                                                 for field, q in random_shuffle["fields"].items()}}
        run.quality = {name: m["quality"] for name, m in by_order.items()}
        run.field_quality = {field: {name: m["fields"][field] for name, m in by_order.items()}
                             for field in by_order["original"]["fields"]}


def similarity(run: Run) -> None:
    """Pairwise cosine similarity of a seeded sample of the (reduced) embeddings: where the embeddings are kept
    unreduced (torchrun, k-means fitted on a sample), the sample's rows are reduced as the labels' were."""
    with run.timer.stage("Similarity statistics"):
        run.similarity = diversity.similarity_stats(run.embeddings, run.config.seed, reduce=run.reduced)


def report_measures(run: Run) -> None:
    """The measures in the log: diversity before and after, uniformity, boundary shift, warnings."""
    _log_improvement(run.quality["original"]["diversity"], run.quality["curated"]["diversity"], run.config,
                     *(float(run.windows[name][0].mean()) for name in ("original", "curated")))
    _log_by_tenth(run.quality, *run.windows["curated"], diversity.clusters_present(run.labels))
    _log_quality(run.quality)
    _warn_if_degenerate(run)
    _log_field_quality(run.field_quality, run.quality)


def _compare_strategies(run: Run) -> None:
    config, options = run.config, run.options
    seq_lens = list(dict.fromkeys([config.seq_len, *config.extra_seq_lens]))
    names = registry.applicable_orderings(options.scores is not None)
    if options.scores is None:
        log.info("Score orderings (%s) are left out of the comparison: give --score-field NAME to include them",
                 ", ".join(SCORE_ORDERINGS))
    comparing = f"Comparing {len(names)} orderings at seq-len {' '.join(map(str, seq_lens))}"  # (as --seq-len takes them)
    with run.timer.stage(comparing), heartbeat(comparing):
        rows, curves = ordering_report.compare_strategies(run.labels, run.counts, config.n_clusters, seq_lens,
                                                          options, names)
        report, table = ordering_report.write_report(_comparison_stem(config), rows, curves, config.n_clusters,
                                                     config.inputs.name.name, registry.comparison_options(options, names),
                                                     plot=not config.no_plot)
    # (Markdown in the file; in a terminal its bold marks are noise)
    chosen = f"--ordering {config.ordering}" + (" (the default)" if config.ordering == CurateConfig.ordering else "")
    print(table.replace("**", ""), f"--stats-only: no curated data written; {chosen} is the order the statistics "
                                   "describe."
          if config.stats_only else f"{_written_names(config)} written in {chosen}'s order.", sep="\n", flush=True)
    log.info("Strategy comparison: %s", ", ".join(str(path) for path in report.values()))
    run.comparison = {"seq_lens": seq_lens, "orderings": names, "files": {k: _recorded_path(v) for k, v in report.items()}}


def _written_names(config: CurateConfig) -> str:
    """The curated file, or its shards, as a sentence's subject ("B.jsonl is", "B-00000-of-00003 ... are")."""
    shards = writers.shard_paths(config.output, config.output_shards)
    return f"{_files_named(shards)} {'is' if len(shards) == 1 else 'are'}"


def _files_named(paths: list[Path]) -> str:
    """One file's path, or the first's and the last's name ("B-00000-of-00003.jsonl ... B-00002-of-00003.jsonl")."""
    return str(paths[0]) if len(paths) == 1 else f"{paths[0]} ... {Path(paths[-1]).name}"


def _with_special_tokens(run: Run, counts: np.ndarray | None) -> np.ndarray | None:
    """Token counts as the trainer sees them: plus the tokens it adds to each document (--count-special-tokens).

    The caches keep the documents' own counts; the added tokens are not embedded."""
    mode = run.config.count_special_tokens
    if counts is None:
        return counts
    added = []
    if mode != "none":
        before, after = run.model.tokenizer(f"for --count-special-tokens {mode}").special_tokens_per_document(mode)
        added = before + after
        log.info("--count-special-tokens %s: %d token(s) added to each document's count (%s)", mode, len(added),
                 run.model.tokenizer("").token_texts(added) if added else "this tokenizer adds none")
    run.special_tokens_per_document = len(added)
    kinds = getattr(run.index, "kinds", None)
    plain_texts = kinds is None or kinds.first_text_row >= 0
    if mode == "eos" and plain_texts:
        _warn_of_an_uncounted_bos(run)
    if added and kinds is not None and kinds.conversations:
        log.warning("--count-special-tokens %s adds %d token(s) to each of the %d conversations too, which TRL's SFT "
                    "trainer does not (the chat template ends each turn; it appends EOS to plain texts only): leave "
                    "the flag off for conversations unless your trainer adds them", mode, len(added),
                    kinds.conversations)
    if run.config.export_packed is not None and not added and not (kinds is not None and kinds.conversations):
        # (a chat template ends each turn itself)
        log.warning("--export-packed with --count-special-tokens %s: the documents' tokens are concatenated with no "
                    "token between them; give --count-special-tokens eos (or bos-eos) to put the token your trainer "
                    "separates documents with after each one", mode)
    return counts + len(added)


def _warn_of_an_uncounted_bos(run: Run) -> None:
    """A tokenizer that puts a BOS before every text itself (Llama's, Mistral's) does so where a trainer tokenizes
    plain texts with its special tokens, as TRL's SFT trainer does before appending EOS: --count-special-tokens eos
    counts each such document a token short (a reviewer's 240 documents, every one, and an export without them)."""
    tokenizer = run.model.tokenizer("for --count-special-tokens eos")
    before, _ = tokenizer.special_tokens_per_document("tokenizer")
    if before:
        log.warning("--count-special-tokens eos: the tokenizer of --model-dir puts %s before every text itself, which "
                    "a trainer keeps where it tokenizes with the tokenizer's special tokens (TRL's SFT trainer on plain "
                    "texts, before appending EOS): give --count-special-tokens bos-eos for such a trainer, so each "
                    "count and the packed export hold it", " ".join(tokenizer.token_texts(before)))


def _is_trial(config: CurateConfig) -> bool:
    """A --stats-only run beside an existing curated file: its files must not replace those describing it."""
    return config.stats_only and bool(_existing_curated_files(config))


def _existing_curated_files(config: CurateConfig) -> list[Path]:
    """The curated files beside this output: its own names, or another shard count's or suffix's
    (``c-0000*-of-00003.jsonl``, ``c.jsonl.gz``) that the earlier run's metadata lists. (A trial that replaced that
    metadata left them unnamed, and the next run kept them beside its own: every record twice in the folder.)"""
    own = [path for path in writers.shard_paths(config.output, config.output_shards) if path.exists()]
    if own:
        return own
    listed = _earlier_meta(outputs.meta_path(config.output)).get("output_files")
    folder = config.output.parent  # (by name: the folder may have moved since)
    return [folder / Path(name).name for name in (listed if isinstance(listed, list) else [])
            if isinstance(name, str) and (folder / Path(name).name).is_file()]


def _comparison_stem(config: CurateConfig) -> Path:
    """Where --compare-strategies' files go: ``B_strategies.*``, or a trial's own ``B_stats-only_strategies.*``."""
    stem = outputs.output_stem(config.output)
    return Path(f"{stem}{outputs.STATS_ONLY_TAG}") if _is_trial(config) else stem


def settle_output_paths(run: Run) -> None:
    """Where this run's files go, before anything is written: a --stats-only trial beside an
    existing curated file never replaces the files that describe that file's order (an earlier
    run's metadata, labels, order, plots): its own go to ``B_stats-only_*``."""
    config = run.config
    if not config.stats_only:
        return
    if not _is_trial(config):
        log.info("--stats-only: the curated data was not written")
        return
    same = _same_as_saved(run)
    run.paths = outputs.stats_only_paths(run.paths, config.output)
    shards = _existing_curated_files(config)
    log.info("--stats-only: %s %s left as %s (%s %s); this run's metadata, labels, order and plots are %s%s_*",
             _files_named(shards), "is" if len(shards) == 1 else "are", "it is" if len(shards) == 1 else "they are",
             "it follows" if len(shards) == 1 else "they follow",
             "this same order" if same else "another order, an earlier run's",
             outputs.output_stem(config.output).name, outputs.STATS_ONLY_TAG)


def write_outputs(run: Run) -> None:
    """The curated data (unless --stats-only), the labels and order it was written with (where
    ``settle_output_paths`` says), and the packed sequences (--export-packed)."""
    config = run.config
    earlier_meta = _earlier_meta(run.paths["meta"])
    earlier = _recorded_output_files(earlier_meta)
    run.earlier_packed_export = _warn_of_an_earlier_export(earlier_meta, run)

    across_ranks = not config.stats_only and _shards_across_ranks(run)
    # The export is made first and put in place with the curated files (one process): a run stopped while it is
    # made leaves the earlier files, export and metadata as they were. (Under torchrun the other ranks wait for the
    # shards, so it follows them there, as before.)
    staged_export = None if across_ranks else _export_packed(run)

    written_files = [Path(_recorded_path(path)) for path in writers.shard_paths(config.output, config.output_shards)]

    def save_stub(files) -> None:
        # Until the run's own metadata: a stub naming the curated files that may be in place, so a run stopped
        # from here on (while the shards are renamed, by any rank; the clean-up; the cluster descriptions; the
        # plots) leaves them known to the next run (its shard-set clean-up, the export warning, the refusal to
        # read them with their inputs), and refused by tools that read the metadata.
        export = staged_export.summary if staged_export is not None else None
        save_json(run.paths["meta"], {
            "complete": False,
            "note": "a curate run stopped while putting these files in place, before its metadata (those not there "
                    "were never written): run it again",
            "output": _recorded_path(config.output),
            "output_files": [str(path) for path in files],
            "input_files": [_recorded_path(path) for path in config.inputs.files],
            "packed_export": export,
            "earlier_packed_export": None if export is not None else run.earlier_packed_export})

    def commit() -> None:
        # The metadata describes the set of files; an earlier run's would describe files this run replaces, so it
        # goes just before they do. Its stub names the earlier files and this run's both: until the renames and
        # the clean-up are done, either may be there.
        if config.stats_only:
            with contextlib.suppress(FileNotFoundError):
                run.paths["meta"].unlink()
        else:
            save_stub(sorted(set(written_files) | earlier))
        if staged_export is not None:
            staged_export.place()

    try:
        if config.stats_only:
            commit()
        _remove_earlier_plots_and_comparison(run, earlier_meta)
        if not config.stats_only:
            try:
                _write_curated(run, earlier, commit, across_ranks)
            except BaseException:
                # A stub naming no file that is there (a first run whose disk filled before any was in place) is
                # no set of files: a reviewer's named two shards never written.
                stub = _earlier_meta(run.paths["meta"]) if run.ctx.is_main else {}
                if stub.get("complete") is False and not any(Path(path).exists() for path in _recorded_output_files(
                        stub)):
                    with contextlib.suppress(OSError):
                        run.paths["meta"].unlink()
                raise
            save_stub(written_files)  # the earlier run's other files are gone now
    finally:
        if staged_export is not None:
            staged_export.discard()  # (nothing left to remove once placed)
    save_npy(run.paths["labels"], run.labels)
    save_npy(run.paths["order"], run.order)
    if across_ranks:
        staged_export = _export_packed(run)
        if staged_export is not None:
            staged_export.place()
    run.packed = staged_export.summary if staged_export is not None else None


def _export_packed(run: Run):
    """--export-packed's sequences, written beside their folder (``packed_export.StagedExport``); None without it."""
    config = run.config
    if config.export_packed is None or _trial_would_replace_export(run):
        return None
    from . import packed_export

    with run.timer.stage(f"Exporting packed sequences to {config.export_packed}"):
        staged = packed_export.export(run.index, run.order, run.counts, run.model.tokenizer("--export-packed"),
                                      config.seq_len, config.count_special_tokens, config.export_packed, run.labels,
                                      config.progress)
    said = staged.summary
    dropped = (f"; the last {said['tokens_dropped']:,} tokens ({said['documents_dropped']:,} document(s) beginning "
               "there) fill no sequence and are left out") if said["tokens_dropped"] else ""
    if said["sequences"]:
        log.info("Packed export: %d sequences of %d tokens in %d shard(s)%s", said["sequences"], config.seq_len,
                 said["shards"], dropped)
    else:
        log.warning("--export-packed %s: no sequence of %d tokens could be filled (the data hold %d tokens): the "
                    "folder holds no packed files; give a smaller --seq-len", config.export_packed, config.seq_len,
                    said["tokens_dropped"])
    return staged


def _write_curated(run: Run, earlier: set[Path], commit, across_ranks: bool) -> None:
    """The curated file(s), ``commit()`` run just before they replace the earlier ones; then the earlier run's
    files this set makes stale are removed, and what was written is said."""
    config = run.config
    if config.output_shards > run.n:
        log.warning("--output-shards %i for %d records: %d of the shards will be empty", config.output_shards,
                    run.n, config.output_shards - run.n)
    shards = f" ({config.output_shards:,} shards)" if config.output_shards > 1 else ""
    with run.timer.stage(f"Writing {config.output}{shards}", key="Writing the curated data"):
        if across_ranks:
            written = _write_shards_across_ranks(run, commit)
        else:
            written = writers.write_curated(run.index, run.order, config.output, config.written_kind,
                                            config.output_shards, run.parquet_schema, commit)
    run.curated_files = [_recorded_path(path) for path, _ in written]
    if config.written_kind != "arrow":
        _remove_other_shard_sets(config.output, config.output_shards, earlier, config.inputs.files)
    _remove_earlier_files_of_another_name(config.output, [path for path, _ in written], earlier, config.inputs.files)
    on_disk, payload = sum(_bytes_on_disk(Path(path)) for path, _ in written), sum(size for _, size in written)
    compressed = f", {payload / 1e6:.1f} MB uncompressed" if on_disk != payload and config.written_kind == "jsonl" else ""
    log.info("Wrote %d records (%.1f MB on disk%s, %s) to %s", run.n, on_disk / 1e6, compressed,
             config.written_kind, config.output if len(written) == 1 else _files_named([path for path, _ in written]))


def _bytes_on_disk(path: Path) -> int:
    """A file's size, or the sizes of the files in a folder (a datasets folder's output)."""
    if path.is_dir():
        return sum(child.stat().st_size for child in path.rglob("*") if child.is_file())
    return path.stat().st_size


def _recorded_path(path) -> str:
    """A path as the metadata records it: absolute, so a reader in another folder (animate_ordering.py,
    the next run's shard-set cleanup) finds the same file."""
    return os.path.abspath(path)  # also without "..": /data/x.jsonl, not /work/../data/x.jsonl


def _earlier_meta(meta_path: Path) -> dict:
    """An earlier run's metadata at ``meta_path`` ({} where there is none, or it cannot be read as an object)."""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _recorded_output_files(earlier_meta: dict) -> set[Path]:
    """The curated files an earlier run's metadata lists (``output_files``), resolved."""
    recorded = earlier_meta.get("output_files")
    return {Path(name).resolve() for name in recorded if isinstance(name, str)} if isinstance(recorded, list) else set()


def _export_holds_this_order(folder: Path, run: Run) -> bool:
    """Whether the export in ``folder`` holds the packed sequences of this run's order, length and special tokens."""
    from .packed_export import MARKER, order_digest

    config = run.config
    try:
        held = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(held, dict) and held.get("order_blake2b") == order_digest(run.order)
            and held.get("seq_len") == config.seq_len and held.get("count_special_tokens") == config.count_special_tokens)


def _trial_would_replace_export(run: Run) -> bool:
    """A --stats-only trial exporting into the folder that holds the curated file's export (its metadata records
    it), of another order: it replaced that export without a word, which the curated file's metadata still
    described. The trial leaves it, said."""
    config = run.config
    if config.export_packed is None or not _is_trial(config):
        return False
    real = _earlier_meta(outputs.meta_path(config.output)).get("packed_export")
    folder = real.get("folder") if isinstance(real, dict) else None
    if not isinstance(folder, str) or Path(folder).resolve() != config.export_packed.resolve() \
            or _export_holds_this_order(config.export_packed, run):
        return False
    log.warning("--export-packed %s: holds the packed sequences of the curated file's order (its metadata records "
                "them); this --stats-only trial leaves them and exports nothing: give it another folder to export "
                "its order", config.export_packed)
    return True


def _warn_of_an_earlier_export(earlier_meta: dict, run: Run) -> str | None:
    """An earlier run's --export-packed folder holds the sequences of its order: a run that does not export there
    again and orders otherwise (or packs at another length) leaves it describing another order, which a trainer
    reading it would train on. Said, not removed (a trainer may be reading it). Returns the folder while it holds
    an export this run does not replace, for this run's metadata, so every later run compares with it too."""
    from .packed_export import MARKER

    config = run.config
    export = earlier_meta.get("packed_export")
    folder = export.get("folder") if isinstance(export, dict) else earlier_meta.get("earlier_packed_export")
    if not isinstance(folder, str) or not (Path(folder) / MARKER).is_file():
        return None
    if config.export_packed is not None and Path(folder).resolve() == config.export_packed.resolve():
        return None
    if not _export_holds_this_order(Path(folder), run):
        log.warning("%s holds the packed sequences of an earlier run's order, not this one's: rerun with "
                    "--export-packed %s to replace them, or remove the folder", folder, folder)
    return folder


def _remove_earlier_plots_and_comparison(run: Run, earlier_meta: dict) -> None:
    """An earlier run's plots and strategy comparison for this output describe its records and order: a run that
    writes none of its own (--no-plot, no --compare-strategies) removes them, saying so, rather than leave them
    beside files they no longer match; one that draws plots removes the earlier ones now, as it replaces the
    files they describe, since it draws its own last. Only files the earlier run's metadata lists
    (``earlier_meta``) are removed: a file of the user's that is only so named is kept (said, where this run
    writes none in its place). (The 2-D projection cache stays: it is trusted only for its embeddings.)"""
    config = run.config
    recorded = _recorded_plots_and_comparison(earlier_meta)
    report = ordering_report.report_paths(_comparison_stem(config))  # a trial's are its own, B_stats-only_*
    plot_files = [run.paths[name] for name in PLOT_PATHS]
    if not config.no_plot:  # redrawn after the metadata: a run stopped before then must not leave the earlier ones
        for path in plot_files:
            if path.name in recorded:
                path.unlink(missing_ok=True)
    stale = plot_files if config.no_plot else []
    if not config.compare_strategies:
        stale += [report["markdown"], report["json"], report["plot"]]
    elif config.no_plot:
        stale.append(report["plot"])
    removed, kept = [], []
    for path in stale:
        if path.name not in recorded:
            if path.is_file():
                kept.append(path.name)
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    if removed:
        log.warning("Removed %s: an earlier run wrote %s for its records and order; this run writes none",
                    ", ".join(removed), "them" if len(removed) > 1 else "it")
    if kept:
        log.warning("Kept %s: named as this output's plots or strategy comparison, but no earlier run's metadata "
                    "lists %s, so %s not this run's to remove; this run writes none", ", ".join(kept),
                    "them" if len(kept) > 1 else "it", "they are" if len(kept) > 1 else "it is")


def _recorded_plots_and_comparison(earlier_meta: dict) -> set[str]:
    """The names of the plots and strategy-comparison files an earlier run's metadata lists. Names, not paths:
    they are always beside the output, and a folder moved with its files (or reached by another path) still
    holds the earlier run's."""
    names = earlier_meta.get("plot_files")
    names = list(names) if isinstance(names, list) else []
    comparison = earlier_meta.get("strategy_comparison")
    files = comparison.get("files") if isinstance(comparison, dict) else None
    if isinstance(files, dict):
        names += list(files.values())
    return {Path(name).name for name in names if isinstance(name, str)}


def _remove_other_shard_sets(output: Path, shards: int, earlier: set[Path], inputs: list[Path]) -> None:
    """An earlier run's curated files for this output with another shard count hold the same records again (a
    trainer reading the folder's files would see each twice): removed once this run's are written, but only
    those the earlier run's metadata lists (``earlier``) and none that this run read; others so named are
    said and kept."""
    found = writers.other_shard_sets(output, shards)
    read = {path.resolve() for path in inputs}
    stale = [path for path in found if path.resolve() in earlier and path.resolve() not in read]
    kept = [path for path in found if path not in stale]
    _remove_earlier_curated(stale, output, "with another shard count")
    if kept:
        log.warning("%d file(s) beside %s are named as its shards of another count (%s%s) but were kept: %s; a "
                    "trainer reading every file of the folder may read records twice", len(kept), output,
                    kept[0].name, f" ... {kept[-1].name}" if len(kept) > 1 else "",
                    "this run read them" if all(path.resolve() in read for path in kept)
                    else "no earlier run's metadata lists them as its output")


def _remove_earlier_files_of_another_name(output: Path, written: list, earlier: set[Path], inputs: list[Path]) -> None:
    """An earlier run for this output (the same metadata, labels and order files) that wrote its curated files
    under another name (c.jsonl.gz, then c.jsonl.zst) left them beside the files this run's order describes: the
    same records again, in an order nothing describes any more. Removed with a warning: only files beside the
    output that the earlier run's metadata lists, none this run wrote or read."""
    now = {Path(path).resolve() for path in written}
    read = {path.resolve() for path in inputs}
    folder = output.parent.resolve()
    stale = sorted(path for path in earlier
                   if path not in now and path not in read and path.parent == folder and path.is_file())
    _remove_earlier_curated(stale, output, "under another name")


def _remove_earlier_curated(stale: list[Path], output: Path, how: str) -> None:
    for path in stale:
        path.unlink()
    if stale:
        log.warning("Removed %d curated file(s) the earlier run for %s wrote %s (%s%s): they held its records, which "
                    "this run's files hold now", len(stale), output, how, stale[0].name,
                    f" ... {stale[-1].name}" if len(stale) > 1 else "")


def _shards_across_ranks(run: Run) -> bool:
    """Under torchrun, --output-shards are written by all ranks in parallel, each its own slices."""
    return run.ctx.active and run.config.output_shards > 1 and not run.config.stats_only


def _write_shards_across_ranks(run: Run, before_commit=None) -> list[tuple[Path, int]]:
    """Every rank writes its consecutive parts of the curated order (8 bytes per record travel from
    rank 0); a failure on any rank stops all of them with one line. (path, bytes) of every shard."""
    config, ctx = run.config, run.ctx
    order = distributed.broadcast_array(ctx, run.order if ctx.is_main else None)
    paths = writers.shard_paths(config.output, config.output_shards)
    failure = None
    mine = distributed.slice_of_order(ctx, writers.shard_slices(order.size, config.output_shards))
    # Staged, and renamed only once every rank has written its own: a failure or Ctrl-C on any rank leaves the
    # earlier shards as they were.
    with replaced_together([paths[part] for part, _, _ in mine], writers.data_suffix(config.output)) as staged:
        try:
            for (part, lo, hi), target in zip(mine, staged):
                writers.write_shard(run.index, order[lo:hi], target, config.written_kind, run.parquet_schema,
                                    shown=paths[part])
        except (UserError, OSError) as exc:  # (a full disk too: raised below as one line, once all ranks know)
            failure = exc
        if failure is None and before_commit is not None:
            before_commit()  # rank 0's: done before any rank renames its shards (they wait for all to agree)
        if not distributed.all_agree(ctx, failure is None):
            raise failure or UserError(f"{config.output}: another rank could not write its shards (see its log)")
    if mine:
        names = paths[mine[0][0]].name + ("" if len(mine) == 1 else f" to {paths[mine[-1][0]].name}")
        log.info("Rank %i wrote %s; the other ranks wrote the rest", ctx.rank, names)
    distributed.barrier(ctx)  # every rank's shards renamed into place before rank 0 measures them
    return [(path, path.stat().st_size) for path in paths]


def _same_as_saved(run: Run) -> bool:
    """Whether the labels and order saved beside the output are this run's."""
    try:
        return (np.array_equal(np.load(run.paths["order"]), run.order)
                and np.array_equal(np.load(run.paths["labels"]), run.labels))
    except (OSError, ValueError):
        return False


def describe(run: Run) -> None:
    """``B_clusters.md`` / ``.json``: what each cluster is (see cluster_report)."""
    from . import cluster_report

    config = run.config
    with run.timer.stage("Describing the clusters"):
        tokenizer = run.model.tokenizer("") if config.model_dir is not None else None
        clusters = cluster_report.describe_clusters(run.index, run.labels, run.counts, run.embeddings,
                                                    config.n_clusters, tokenizer, config.seed)
        text = cluster_report.markdown(clusters, config.inputs.name.name, config.n_clusters, tokenizer is not None)
        with atomic_open(run.paths["clusters_md"], "w") as handle:
            handle.write(text)
        save_json(run.paths["clusters_json"], {"input": _recorded_path(config.inputs.name), "n_clusters": config.n_clusters,
                                               "clusters": clusters})
    log.info("What the clusters are: %s", run.paths["clusters_md"])


# The run's plots, by their names in run.paths (the strategy comparison's plot is ordering_report's).
PLOT_PATHS = ("ordering_plot", "cloud_plot")


def plot(run: Run) -> None:
    config, paths = run.config, run.paths
    if config.no_plot:
        return
    with run.timer.stage("Plots"):
        plots.plot_ordering_comparison(paths["ordering_plot"], run.labels, run.counts, run.order, config.n_clusters,
                                       run.windows["original"][0], run.windows["curated"][0],
                                       run.quality["original"]["diversity"], run.quality["curated"]["diversity"],
                                       config.seq_len, run.quality, config.ordering)
        projection = projection_or_none(paths["umap"], run.embeddings, run.index.fingerprints, config.seed,
                                        config.progress)
        plots.plot_cluster_cloud(paths["cloud_plot"], run.labels, config.n_clusters, projection)
    log.info("Plots: %s, %s", paths["ordering_plot"], paths["cloud_plot"])


def write_metadata(run: Run, plots_drawn: bool = True) -> dict:
    """``B_meta.json``: the original toolkit's keys, then ours. ``plots_drawn`` False: written before the plots,
    which it records as not drawn (``plot_files`` null), and rewritten once they are."""
    config, paths = run.config, run.paths
    sizes = np.bincount(run.labels, minlength=config.n_clusters)
    by_size = sorted(np.flatnonzero(sizes).tolist(), key=lambda k: (-sizes[k], k))
    before, after = run.quality["original"]["diversity"], run.quality["curated"]["diversity"]
    meta = {
        "input": _recorded_path(config.inputs.name),
        "output": _recorded_path(config.output),
        "input_count": run.n,
        "final_count": run.n,
        "n_clusters": config.n_clusters,
        "ordering": SPECS[config.ordering].recorded_name,
        "ordering_options": registry.options_meta(config.ordering, config.ordering_options),
        "within_cluster_sort": config.ordering_options.within_cluster_sort,
        "seed": config.seed,
        "sequence_length": config.seq_len,
        "total_tokens": int(run.counts.sum()),
        "n_training_sequences": after["n_sequences"],
        "embedding_method": run.method,
        "load_embeddings_path": _recorded_path(config.load_embeddings) if config.load_embeddings else None,
        "model_dir": _recorded_path(config.model_dir) if config.model_dir else None,
        "text_field": config.text_field,
        "token_counts_file": _recorded_path(features.token_counts_file(paths, run.index.fingerprints)),
        "chat_template": run.chat_template,
        "input_format": config.inputs.kind,
        "input_files": [_recorded_path(path) for path in config.inputs.files],
        "output_format": config.written_kind,
        "output_files": run.curated_files,
        "count_special_tokens": config.count_special_tokens,
        "special_tokens_per_document": run.special_tokens_per_document,
        "packing": config.ordering_options.packing,
        "packed_export": run.packed,
        "earlier_packed_export": run.earlier_packed_export,
        "pca": run.pca_info.as_dict() if run.pca_info else None,
        # fit_sample: --cluster-fit-sample as given (0: all); fit_rows: the rows the centres were fitted on; the
        # plan's: the rows its memory budget allows a fit out of core
        "clustering": {"backend": config.cluster_backend, "fit_sample": config.cluster_fit_sample,
                       "fit_rows": run.kmeans_fit_rows,
                       **({"plan": run.cluster_plan.as_dict()} if run.cluster_plan else {})},
        "torchrun": run.torchrun,
        "token_window_diversity": {"original": before, "curated": after},
        "ordering_quality": run.quality,
        "balance_field_quality": run.field_quality or None,
        "strategy_comparison": run.comparison,
        "similarity_stats": run.similarity,
        "cluster_sizes": {str(k): int(sizes[k]) for k in by_size},
        "empty_documents": int((run.counts == run.special_tokens_per_document).sum()),  # no tokens of their own
        "stats_only": config.stats_only,
        "plot_files": ([] if config.no_plot else [_recorded_path(paths[name]) for name in PLOT_PATHS])
        if plots_drawn else None,
        "labels_file": _recorded_path(paths["labels"]),
        "order_file": _recorded_path(paths["order"]),
        # What animate_ordering.py checks the files it reads against: the token counts file is shared by every run
        # over the input, and a later run over reordered records rewrites it with as many tokens.
        "digests": {"records": caches.records_digest(run.index.fingerprints),
                    "labels": caches.ids_digest(run.labels), "order": caches.ids_digest(run.order)},
        "timings_seconds": run.timer.seconds,
        "cpu_seconds": run.timer.cpu_seconds,
        "peak_rss_mb": run.timer.peak_rss_mb,
        "stages_side_by_side": sorted(run.timer.beside),  # their wall times overlap; their CPU is their thread's
    }
    save_json(paths["meta"], meta)
    if plots_drawn:
        log.info("Metadata: %s", paths["meta"])
    return meta


def calibration_report(rows, recommended, n_documents: int | None = None) -> str:
    """The --calibrate-k table and its recommendation, as the command prints them (standard output)."""
    lines = [f"{'k':>5}  {'silhouette':>10}  {'cluster size min/median/max':>27}"]
    for row in rows:
        score = "n/a" if row.silhouette is None else f"{row.silhouette:.4f}"
        lines.append(f"{row.k:>5}  {score:>10}  {f'{row.size_min} / {row.size_median:g} / {row.size_max}':>27}")
    empty = [row.k for row in rows if row.size_min == 0]
    if empty:
        # A reviewer saw a cluster of size 0 at k = 100 and nothing said of it.
        lines.append(f"At k = {', '.join(map(str, empty))} some clusters are empty: k-means found fewer groups than "
                     "that in these embeddings, so such a k only names clusters that no document is in")
    lines.append(_recommendation(recommended, rows, n_documents))  # last: what to do
    return "\n".join(lines)


def _recommendation(recommended, rows, n_documents: int | None = None) -> str:
    if recommended is None:
        return "No k could be scored (too few documents or clusters)"
    scored = [row.k for row in rows if row.silhouette is not None]
    if all(row.size_min == 0 for row in rows if row.silhouette is not None):
        # A reviewer's 30 records of 3 texts: every k left clusters empty, and the default (larger) was advised.
        return (f"No k tried fills all its clusters: these embeddings hold fewer distinct groups than {min(scored)} "
                "(few distinct documents?); set --n-clusters below that")
    if recommended == min(scored) and len(scored) > 1:
        # A silhouette falling from the first k on has no peak to find (a new user took k = 5 as the answer; a later
        # one read "Recommended k = 5 ... But ... does not choose k" as the tool contradicting itself).
        keep = (f"keep --n-clusters {DEFAULT_N_CLUSTERS} (the default) or set it" if n_documents is None or
                n_documents >= DEFAULT_N_CLUSTERS else
                f"set --n-clusters below the {n_documents} documents (the default, {DEFAULT_N_CLUSTERS}, needs more)")
        return (f"No k stands out: {recommended}, the smallest k tried, scores highest and every larger k more than 5% "
                f"below it, so no k separates these embeddings clearly (shallow embeddings often score so); {keep} "
                "by how finely topics should spread across windows (more clusters spread them finer)")
    line = (f"Recommended k = {recommended} (the highest k whose silhouette is within 5% of the peak); "
            f"use --n-clusters {recommended}")
    if recommended == max(scored) and len(scored) > 1:
        line += f". {recommended} is the largest k tried: a larger k may score as well"
    return line


def _log_improvement(before: dict, after: dict, config: CurateConfig, mean_before: float, mean_after: float) -> None:
    # From the unrounded means: 1.6448 -> 3.1059 is +89%, where the summaries' 1.64 -> 3.11 gave +90%.
    gain = (mean_after / mean_before - 1) * 100 if mean_before else float("nan")
    log.info("Unique clusters per %d-token window (of K=%i): input order mean %.2f (min %d, std %.2f, %d windows) "
             "-> curated mean %.2f (min %d, std %.2f, %d windows): %+.0f%%",
             config.seq_len, config.n_clusters, before["mean"], before["min"], before["std"],
             before["n_sequences"], after["mean"], after["min"], after["std"], after["n_sequences"], gain)


# A tenth of the epoch whose windows hold fewer than this share of a random shuffle's clusters there is warned of
# (with fewer than EPOCH_PARTS_WARNED windows a "tenth" is a window or two: nothing is said).
BELOW_SHUFFLE = 0.9
EPOCH_PARTS_WARNED = diversity.EPOCH_PARTS


# A tenth whose windows hold at least this share of the clusters their documents could hold, against the epoch's
# share, and at least MIXED_WELL of them, is mixed as well as the rest and well: it is below a shuffle for holding
# fewer documents per window (long ones). (An order mixed badly everywhere passed the first test alone.)
MIXED_AS_WELL = 0.9
MIXED_WELL = 0.8


def _log_by_tenth(quality: dict, unique: np.ndarray, documents: np.ndarray, n_present: int) -> None:
    """Clusters per window in each tenth of the epoch, and a warning where the curated order falls below a random
    shuffle's in some tenth: a mean can hide a stretch of the epoch less diverse than the rest. ``unique``,
    ``documents``: the curated order's clusters and documents per window, to say why; ``n_present``: the clusters
    the data holds."""
    parts = {key: q["diversity_by_tenth"] for key, q in quality.items()}
    # (fewer than ten windows: a part is a window, and the line says so)
    tenths = len(parts["curated"]) >= diversity.EPOCH_PARTS
    log.info("Unique clusters per window by %s: %s", "tenth of the epoch" if tenths else "window of the epoch (fewer "
             "than ten)", "; ".join(
        f"{diversity.measured_order_name(key, quality[key])} {' '.join(f'{v:.1f}' for v in values)}"
        for key, values in parts.items()))
    curated, shuffled = parts["curated"], parts["random_shuffle"]
    if len(curated) != len(shuffled) or len(curated) < EPOCH_PARTS_WARNED:
        return  # too few windows to speak of parts of the epoch (or the orders cut them apart)
    worst = min(range(len(curated)), key=lambda i: curated[i] / shuffled[i] if shuffled[i] else float("inf"))
    if curated[worst] < BELOW_SHUFFLE * shuffled[worst]:
        # Why: windows of few documents there (long ones: a window of one document holds one cluster), which
        # hold as many of the clusters they could as the rest of the epoch; or windows mixed worse than elsewhere.
        windows = np.array_split(np.arange(unique.size), diversity.EPOCH_PARTS)[worst]
        mixed_there = diversity.efficiency(unique[windows], documents[windows], n_present)
        mixed = diversity.efficiency(unique, documents, n_present)
        held = (f"its windows hold {float(documents[windows].mean()):.1f} documents on average "
                f"({float(documents.mean()):.1f} over the epoch), {np.mean(documents[windows] == 1):.0%} of them one "
                f"document ({np.mean(documents == 1):.0%} over the epoch), and {mixed_there:.2f} of the clusters their "
                f"documents could hold ({mixed:.2f} over the epoch)")
        why = ("long documents fall there, each window of them holding few clusters whatever their mix"
               if mixed_there >= max(MIXED_AS_WELL * mixed, MIXED_WELL)
               else "this order puts documents of few clusters together there")
        log.warning("In tenth %i of the epoch the curated order's windows hold %.1f clusters on average, fewer than a "
                    "random shuffle's %.1f there (the curated mean over the whole epoch: %.2f): %s: %s; "
                    "--compare-strategies gives each ordering's lowest tenth", worst + 1, curated[worst],
                    shuffled[worst], quality["curated"]["diversity"]["mean"], held, why)


def _warn_if_degenerate(run: Run) -> None:
    """Say so when the data or the flags leave no room to improve diversity (else "+0%" reads like a failure)."""
    config = run.config
    present = diversity.clusters_present(run.labels)
    unique, documents = run.windows["curated"]
    if present < config.n_clusters:
        log.warning("k-means filled only %d of the %d clusters (identical or too few distinct documents?)",
                    present, config.n_clusters)
    if present == 1:
        log.warning("Every document is in one cluster: no order can change the clusters per window "
                    "(--n-clusters %i)", config.n_clusters)
    elif unique.size == 1:
        total = int(run.counts.sum())
        shorter = [length for length in (2 ** int(np.log2(max(total, 2) / 8)), 2 ** int(np.log2(max(total, 2) / 2)))
                   if length >= 16]
        log.warning("All %d tokens fit in one %d-token window: no order can change its diversity; compare orders at "
                    "a shorter --seq-len%s", total, config.seq_len,
                    f" (e.g. --compare-strategies --seq-len {' '.join(map(str, shorter))})" if shorter else "")
    elif np.median(documents) <= 1:
        median = np.median(run.counts)
        why = ("most documents are as long as --seq-len or longer" if median >= config.seq_len else
               "the documents are about as long as --seq-len" if median * 4 >= config.seq_len else
               "most documents are short, but the few longer than --seq-len fill most windows")
        log.warning("Most %d-token windows hold a single document (%s): each such window holds one cluster whatever "
                    "the order", config.seq_len, why)
    elif unique.size < diversity.FEW_WINDOWS:
        log.warning("Only %d windows of %d tokens: the figures per window (and the boundary shift) rest on so few "
                    "that one document moved changes them; a shorter --seq-len shows more of the order",
                    unique.size, config.seq_len)
    _say_records_longer_than_a_window(run.counts, config.seq_len, config.ordering_options.packing)
    log.info("Curated order: %.1f%% of the most clusters these windows could hold (a window holds at most as many "
             "clusters as documents); input order %.1f%%", 100 * run.quality["curated"]["efficiency"],
             100 * run.quality["original"]["efficiency"])


def _say_records_longer_than_a_window(counts: np.ndarray, seq_len: int, packing: str) -> None:
    """Records longer than --seq-len set windows that no order changes: how many, and their share of the tokens."""
    longer = counts > seq_len
    if not longer.any():
        return
    share = float(counts[longer].sum()) / float(counts.sum())
    what = ("packed whole, each fills windows alone but for its last part" if packing == "whole"
            else "packed split, each fills windows alone but for its ends")
    log.log(logging.WARNING if share >= LONG_RECORDS_WARN_SHARE else logging.INFO,
            "%d record(s) longer than --seq-len %i (the longest %d tokens; %.1f%% of all tokens): %s, whatever the "
            "order; a trainer that truncates to the window keeps only their first %d tokens",
            int(longer.sum()), seq_len, int(counts.max()), 100 * share, what, seq_len)


def _warn_unused_flags(config: CurateConfig) -> None:
    """A flag set away from its default that the chosen ordering never reads is almost always a mistake; with
    --compare-strategies the orderings that read it are compared with it, but the curated file still follows
    --ordering (a user seeing the field balanced in the comparison took it for the file's). A --stats-only
    comparison writes no curated file: a flag the compared orderings read is what it was given for, said at info
    level (the README's own demo comparison warned twice)."""
    compared_names = set(registry.applicable_orderings(config.ordering_options.score_field is not None))
    for flag, users in registry.unused_flags(config.ordering, config.ordering_options):
        measured = "; its token shares are still measured" if flag == BALANCE_FIELD_FLAG else ""
        # (only where the comparison runs them: score orderings need --score-field)
        run_by = [name for name in users if name in compared_names]
        if config.compare_strategies and config.stats_only and run_by:
            log.info("%s is for the comparison (read by %s): --stats-only writes no curated file", flag,
                     ", ".join(run_by))
            continue
        compared = (f"; the comparison runs {'them' if len(run_by) > 1 else 'it'} with it, but the curated file "
                    f"follows --ordering {config.ordering}") if config.compare_strategies and run_by else ""
        log.warning("%s is not used by --ordering %s (it is read by %s)%s%s", flag, config.ordering, ", ".join(users),
                    compared, measured)


BALANCE_FIELD_FLAG = flag_of("balance_fields")
# Categories a --balance-field may have before a field with about one per record is warned of.
FEW_CATEGORIES = 100


def _ordering_options(config: CurateConfig, index: records.RecordIndex) -> OrderingOptions:
    """The ordering options with the scores and balance-field categories read from the records."""
    _warn_unused_flags(config)
    options = config.ordering_options
    scores = None
    wants_scores = config.compare_strategies or config.ordering in SCORE_ORDERINGS
    if options.score_field is not None and wants_scores:
        scores, lacking = records.read_scores(index, options.score_field, options.score_default)
        if lacking:
            log.warning("--score-field %s: %d of the %d records hold no finite number; they score %g (--score-default)",
                        options.score_field, lacking, scores.size, options.score_default)
        log.info("Scores from '%s': min %g, median %g, max %g", options.score_field, scores.min(), np.median(scores),
                 scores.max())
    groups = None
    # Read whatever the ordering: a field no record has is an error, and every run measures the field's shares.
    if options.balance_fields:
        columns = []
        for name in options.balance_fields:
            ids, categories = records.read_categories(index, name)
            shown = ", ".join(c if len(c) <= 30 else c[:27] + "..." for c in categories[:8])
            log.info("Balancing field '%s': %d %s (%s%s)", name, len(categories),
                     "category" if len(categories) == 1 else "categories", shown, ", ..." if len(categories) > 8 else "")
            if len(categories) > max(FEW_CATEGORIES, ids.size // 2):
                log.warning("--balance-field %s: %d categories among %d records, most records a category of their "
                            "own (an id, a score, a text?): balancing them balances nothing; give a field of few "
                            "values, such as a source or a language", name, len(categories), ids.size)
            columns.append(ids)
        groups = np.stack(columns, axis=1)
    return replace(options, scores=scores, balance_groups=groups)


def _balance_field_quality(run: Run, order: np.ndarray | None) -> dict:
    """Uniformity and boundary shift of each --balance-field's categories (instead of clusters) under ``order``."""
    options = run.options
    if options.balance_groups is None:
        return {}
    out = {}
    for column, name in enumerate(options.balance_fields):
        ids = options.balance_groups[:, column]
        quality = diversity.ordering_quality(ids, run.counts, run.config.seq_len, order, int(ids.max()) + 1,
                                             packing=options.packing)
        out[name] = {m: quality[m] for m in ("uniformity_mean", "uniformity_max", "boundary_shift")}
    return out


def _log_field_quality(field_quality: dict, quality: dict) -> None:
    for name, q in field_quality.items():
        log.info("Field '%s' token shares: uniformity mean %s, boundary shift %s (%s)", name,
                 " / ".join(f"{q[k]['uniformity_mean']:.4f}" for k in q),
                 " / ".join(f"{q[k]['boundary_shift']:.4f}" for k in q),
                 " / ".join(diversity.measured_order_name(k, quality[k]) for k in q))


def _log_quality(quality: dict) -> None:
    names = {key: diversity.measured_order_name(key, q) for key, q in quality.items()}
    log.info("Token-share uniformity (per window, max |cluster share - global share|; mean / max over windows, "
             "lower is better): %s", ", ".join(f"{names[k]} {q['uniformity_mean']:.4f} / {q['uniformity_max']:.4f}"
                                               for k, q in quality.items()))
    log.info("Epoch-boundary shift (cluster mix of the first vs last 5%% of tokens, total variation; lower is "
             "better): %s", ", ".join(f"{names[k]} {q['boundary_shift']:.4f}" for k, q in quality.items()))
    # A fraction, as in the comparison table and the metadata.
    log.info("Coverage (fraction of tokens before every cluster has appeared; lower is better): %s",
             ", ".join(f"{names[k]} {q['coverage']:.4f}" for k, q in quality.items()))
