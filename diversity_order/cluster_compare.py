"""Compare two clusterings of the same documents (e.g. shallow vs deep embeddings).

Each embedding set is clustered exactly as ``curate_dataset.py`` clusters (optional PCA, then
``kmeans_labels``); the two label sets are compared with the Adjusted Rand Index and the
Normalized Mutual Information (scikit-learn), with the original toolkit's verdict bands. Beyond the
original: every number can be saved as JSON, the normalised contingency table is drawn as a
heat map (which shallow clusters split or merge in the deep space), and NaN rows, mismatched
row counts and k > N are clear one-line errors or warnings instead of crashes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import caches
from .clustering import kmeans_labels, pca_components_kept, reduce_with_pca
from .defaults import DEFAULT_N_CLUSTERS, DEFAULT_SEED
from .errors import UserError
from .fields import cache_key

log = logging.getLogger(__name__)

# ARI above HIGH: the deep clusters mostly repeat the shallow ones; below LOW: very different.
ARI_HIGH = 0.7
ARI_LOW = 0.3
# A shallow cluster "splits" when at least this share of it lands in each of 2+ deep clusters;
# a deep cluster "merges" when 2+ shallow clusters each give it at least this share of itself.
SPLIT_SHARE = 0.2
# Keys every report has: an existing --json file without them is some other file, not replaced.
REPORT_KEYS = frozenset({"ari", "nmi", "verdict", "shallow", "deep"})


def verdict(ari: float, shallow_clusters: int = 2, deep_clusters: int = 2) -> str:
    """The original toolkit's bands: > 0.7 high overlap, 0.3-0.7 moderate, < 0.3 very different. Where one side's
    rows fall into a single cluster (identical rows), no band applies: its ARI of 0 says nothing of the other."""
    lone = [name for name, count in (("shallow", shallow_clusters), ("deep", deep_clusters)) if count < 2]
    if lone:
        return (f"not comparable: the {' and '.join(lone)} embeddings fall into one cluster (rows all alike?), so "
                "their agreement says nothing")
    if ari > ARI_HIGH:
        return "high overlap: deep embeddings add little beyond the shallow clusters"
    if ari >= ARI_LOW:
        return "moderate overlap: deep embeddings regroup part of the data"
    return "very different: deep embeddings are worth pursuing"


def require_same_row_counts(n_shallow: int, n_deep: int) -> None:
    if n_shallow != n_deep:
        raise UserError(f"row counts differ: the shallow file has {n_shallow:,} rows, the deep file {n_deep:,}; both "
                        "must hold the same documents in the same order")


def check_same_order(shallow_path: Path, deep_path: Path, n_shallow: int, n_deep: int) -> None:
    """The two files' rows against each other (``caches.require_row_order``): the same documents in other orders
    would compare every document with another one; files of other documents (most texts differing, the rows made
    from one field) are refused too. Neither may be part-filled (an interrupted run's: said first). Files of
    other row counts are said to be so next (each one's fingerprints would otherwise be blamed for the other's
    length)."""
    caches.require_filled(shallow_path, f"--shallow {shallow_path}")
    caches.require_filled(deep_path, f"--deep {deep_path}")
    require_same_row_counts(n_shallow, n_deep)
    for flag, path in (("--shallow", shallow_path), ("--deep", deep_path)):
        beside = caches.files_for(path).fingerprints
        if beside.exists() and caches.written_fingerprints(path) is None:
            raise UserError(f"{flag} {path}: {beside.name} beside it is not one uint64 per row (unreadable), so the "
                            "rows' order cannot be checked; write it again with the rows, or delete it to compare them "
                            "unchecked")
        if not beside.exists():
            log.warning("%s %s: no %s beside it (copied without it?), so the two files' rows are compared by position, "
                        "unchecked: files of the same documents in other orders would compare each document with "
                        "another one", flag, path, caches.files_for(path).fingerprints.name)
    fields = [_text_field(caches.written_key(path)) for path in (shallow_path, deep_path)]
    caches.require_row_order(deep_path, caches.written_fingerprints(shallow_path),
                             f"--shallow {shallow_path} and --deep {deep_path}", "--deep's row", "row",
                             "--shallow's rows", same_texts=fields[0] is not None and fields[0] == fields[1])


def _text_field(key: dict | None) -> str | None:
    """The field a file's rows were made from, by its manifest's key (None: not written)."""
    field = key.get("text_field") if isinstance(key, dict) else None
    if isinstance(field, list) and all(isinstance(name, str) for name in field):
        return cache_key(tuple(field))
    return field if isinstance(field, str) else None


def check_replaceable_report(path: Path) -> None:
    """Refuse to write the report over an existing file that is not an earlier report: a curate run's
    ``_meta.json`` or a model's ``config.json`` end in .json too."""
    if not path.exists():
        return
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        earlier = None
    if not (isinstance(earlier, dict) and REPORT_KEYS <= earlier.keys()):
        raise UserError(f"--json {path} exists and is not an earlier comparison report; choose another path "
                        "(or remove it)")


def token_limits(shallow_path: Path, deep_path: Path) -> dict[str, int | None]:
    """How many of each document's tokens each file's rows were made from, by the manifests written beside them
    (``max_len``: extract_deep_embeddings.py's --max-tokens or the model's length; curate's shallow embeddings
    read whole documents: None), said where they differ and some document is longer than the lower limit (by the
    full lengths a deep extraction keeps beside its rows, where they are its rows'; without them, said as a
    possibility): those are compared on different text, which lowers the agreement by itself."""
    limits = {}
    for name, path in (("shallow", shallow_path), ("deep", deep_path)):
        key = caches.written_key(path)
        limits[name] = key.get("max_len") if isinstance(key, dict) and isinstance(key.get("max_len"), int) else None
    if limits["shallow"] != limits["deep"]:
        limit = min(value for value in limits.values() if value)
        lengths = [full for full in (_full_lengths(path) for path in (shallow_path, deep_path)) if full is not None]
        longer = int(np.count_nonzero(lengths[0] > limit)) if lengths else None
        said = {name: f"the first {value:,} tokens of each document" if value else "whole documents"
                for name, value in limits.items()}
        if longer is None:
            log.warning("--shallow's rows were made from %s, --deep's from %s: documents longer than that are "
                        "compared on different text, which lowers ARI and NMI by itself", said["shallow"], said["deep"])
        elif longer:
            log.warning("--shallow's rows were made from %s, --deep's from %s: the %d document(s) longer than that "
                        "(of %d) are compared on different text, which lowers ARI and NMI by itself", said["shallow"],
                        said["deep"], longer, lengths[0].size)
        else:
            log.info("--shallow's rows were made from %s, --deep's from %s: no document is longer than that",
                     said["shallow"], said["deep"])
    return limits


def _full_lengths(path: Path) -> np.ndarray | None:
    """Each document's untruncated token count, from the token cache a deep extraction keeps beside its output
    (``OUTPUT.tokens.lengths.npy``: kept and full count per row), where its texts are the rows' own; else None."""
    from .deep.tokens import token_cache_files

    files = token_cache_files(path)
    rows = caches.written_fingerprints(path)
    try:
        lengths = np.load(files.data, mmap_mode="r") if files.data.is_file() else None
        texts = np.load(files.fingerprints, mmap_mode="r") if files.fingerprints.is_file() else None
    except (OSError, ValueError):
        return None
    if lengths is None or texts is None or rows is None or lengths.ndim != 2 or lengths.shape != (rows.size, 2) \
            or not np.array_equal(texts, rows):
        return None
    return np.asarray(lengths[:, 1])


def drop_non_finite(shallow: np.ndarray, deep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Rows with NaN/inf in either matrix are left out of both (a NaN row has no cluster);
    returns (shallow, deep, kept row indices, counts)."""
    bad_shallow = ~np.isfinite(shallow).all(axis=1)
    bad_deep = ~np.isfinite(deep).all(axis=1)
    bad = bad_shallow | bad_deep
    info = {"shallow": int(bad_shallow.sum()), "deep": int(bad_deep.sum()), "dropped": int(bad.sum())}
    kept = np.flatnonzero(~bad)
    if bad.any():
        log.warning("%d row(s) hold NaN/inf (%d in the shallow file, %d in the deep file, e.g. documents "
                    "skipped by deep extraction): they are left out of both clusterings and all metrics; "
                    "%d rows remain", info["dropped"], info["shallow"], info["deep"], kept.size)
        shallow, deep = shallow[kept], deep[kept]
    return shallow, deep, kept, info


def cluster(embeddings: np.ndarray, n_clusters: int, pca_components: int, seed: int) -> tuple[np.ndarray, dict | None]:
    """Labels as curate computes them: optional PCA (re-normalised rows), then k-means."""
    pca_info = None
    if pca_components > 0:
        embeddings, info = reduce_with_pca(embeddings, pca_components, seed)
        pca_info = info.as_dict() if info is not None else None
    return kmeans_labels(embeddings, n_clusters, seed), pca_info


def per_document_cosine(a: np.ndarray, b: np.ndarray) -> dict:
    """Cosine between row i of ``a`` and row i of ``b`` (same dimension): summary statistics."""
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    cos = (a.astype(np.float64) * b).sum(1) / np.maximum(na * nb, 1e-12)
    return {"mean": round(float(cos.mean()), 4), "std": round(float(cos.std()), 4),
            "median": round(float(np.median(cos)), 4), "min": round(float(cos.min()), 4),
            "max": round(float(cos.max()), 4)}


def contingency(shallow: np.ndarray, deep: np.ndarray, k_shallow: int, k_deep: int) -> np.ndarray:
    """counts[i, j] = documents in shallow cluster i and deep cluster j."""
    table = np.zeros((k_shallow, k_deep), dtype=np.int64)
    np.add.at(table, (shallow, deep), 1)
    return table


def block_order(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row and column orders that put the table's mass near the diagonal.

    Rows (shallow clusters) largest first; each column (deep cluster) goes under the row that
    gives it most of its documents, columns under the same row by decreasing share. A shallow
    cluster that splits then shows as one row spread over several adjacent columns; a merge
    as one column fed by several rows. Empty rows and columns go last.
    """
    sizes = table.sum(1)
    rows = np.argsort(-sizes, kind="stable")
    row_pos = np.empty_like(rows)
    row_pos[rows] = np.arange(rows.size)
    col_sizes = table.sum(0)
    col_share = table / np.maximum(col_sizes, 1)[None, :]
    home = row_pos[col_share.argmax(0)]
    share = col_share.max(0)
    cols = np.lexsort((-share, home, col_sizes == 0))
    return rows, cols


def splits_and_merges(table: np.ndarray, share: float = SPLIT_SHARE) -> tuple[list, list]:
    """Shallow clusters spread over 2+ deep clusters (each holding >= share of it), and deep
    clusters fed by 2+ shallow clusters (each giving >= share of it)."""
    row_share = table / np.maximum(table.sum(1, keepdims=True), 1)
    col_share = table / np.maximum(table.sum(0, keepdims=True), 1)
    splits, merges = [], []
    for i in range(table.shape[0]):
        parts = np.flatnonzero(row_share[i] >= share)
        if parts.size >= 2:
            parts = parts[np.argsort(-row_share[i, parts], kind="stable")]
            splits.append({"shallow": int(i), "size": int(table[i].sum()),
                           "into": {int(j): round(float(row_share[i, j]), 3) for j in parts}})
    for j in range(table.shape[1]):
        parts = np.flatnonzero(col_share[:, j] >= share)
        if parts.size >= 2:
            parts = parts[np.argsort(-col_share[parts, j], kind="stable")]
            merges.append({"deep": int(j), "size": int(table[:, j].sum()),
                           "from": {int(i): round(float(col_share[i, j]), 3) for i in parts}})
    return splits, merges


@dataclass
class CompareResult:
    shallow_labels: np.ndarray
    deep_labels: np.ndarray
    kept_rows: np.ndarray
    table: np.ndarray
    report: dict = field(default_factory=dict)

    def display_order(self) -> tuple[np.ndarray, np.ndarray]:
        """Row and column orders of the contingency table that show splits and merges as blocks."""
        return block_order(self.table)


def compare(shallow: np.ndarray, deep: np.ndarray, n_clusters: int = DEFAULT_N_CLUSTERS, pca_components: int = 0,
            pca_deep_only: int | None = None, seed: int = DEFAULT_SEED) -> CompareResult:
    """Cluster both sets and compare; ``report`` holds every number (JSON-ready)."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    require_same_row_counts(shallow.shape[0], deep.shape[0])
    if n_clusters < 2:  # (one cluster each: the two groupings agree by definition, ARI 1)
        raise UserError(f"--n-clusters {n_clusters}: must be at least 2 (with one cluster each, the two groupings "
                        "agree whatever the embeddings)")
    if pca_components < 0 or (pca_deep_only is not None and pca_deep_only < 0):
        raise UserError("--pca-components / --pca-deep-only must be 0 (off) or positive")
    n_total = shallow.shape[0]
    shallow, deep, kept, nan_info = drop_non_finite(shallow, deep)
    n = kept.size
    if n == 0:
        raise UserError("no rows left: every row holds NaN/inf in one of the two files")
    if n_clusters > n:
        raise UserError(f"--n-clusters {n_clusters} is larger than the number of usable rows ({n}"
                        + (f", after leaving out {nan_info['dropped']} NaN rows" if nan_info["dropped"] else "") + ")")
    deep_pca = pca_components if pca_deep_only is None else pca_deep_only

    def pca_said(asked: int, dim: int) -> str:
        kept = pca_components_kept(asked, n, dim)
        return "" if not asked else f", PCA to {kept} dims" + (f" (of {asked} asked: {n} rows and {dim} dims allow "
                                                                f"no more)" if kept < asked else "")

    log.info("Clustering the shallow embeddings (%d x %d), k=%i%s", n, shallow.shape[1], n_clusters,
             pca_said(pca_components, shallow.shape[1]))
    shallow_labels, shallow_pca = cluster(shallow, n_clusters, pca_components, seed)
    log.info("Clustering the deep embeddings (%d x %d), k=%i%s", n, deep.shape[1], n_clusters,
             pca_said(deep_pca, deep.shape[1]))
    deep_labels, deep_pca_info = cluster(deep, n_clusters, deep_pca, seed)

    ari = float(adjusted_rand_score(shallow_labels, deep_labels))
    nmi = float(normalized_mutual_info_score(shallow_labels, deep_labels))
    table = contingency(shallow_labels, deep_labels, n_clusters, n_clusters)
    splits, merges = splits_and_merges(table)
    sizes_s = np.bincount(shallow_labels, minlength=n_clusters)
    sizes_d = np.bincount(deep_labels, minlength=n_clusters)
    report = {
        "n_rows": int(n_total),
        "n_rows_used": int(n),
        "non_finite_rows": nan_info,
        "n_clusters": int(n_clusters),
        "seed": int(seed),
        "ari": round(ari, 6),
        "nmi": round(nmi, 6),
        "verdict": verdict(ari, int((sizes_s > 0).sum()), int((sizes_d > 0).sum())),
        "shallow": {"dim": int(shallow.shape[1]), "pca": shallow_pca, "n_nonempty_clusters": int((sizes_s > 0).sum()),
                    "cluster_sizes": sizes_s.tolist()},
        "deep": {"dim": int(deep.shape[1]), "pca": deep_pca_info, "n_nonempty_clusters": int((sizes_d > 0).sum()),
                 "cluster_sizes": sizes_d.tolist()},
        "per_document_cosine": per_document_cosine(shallow, deep) if shallow.shape[1] == deep.shape[1] else None,
        "split_share_threshold": SPLIT_SHARE,
        "splits": splits,
        "merges": merges,
        "contingency": table.tolist(),
    }
    return CompareResult(shallow_labels, deep_labels, kept, table, report)


def format_report(report: dict) -> str:
    lines = [
        f"Documents: {report['n_rows_used']:,}" + (f" of {report['n_rows']:,} ({report['non_finite_rows']['dropped']} "
                                                   "NaN/inf rows left out)" if report["non_finite_rows"]["dropped"] else ""),
        f"Clusters requested: {report['n_clusters']}; non-empty: shallow {report['shallow']['n_nonempty_clusters']}, "
        f"deep {report['deep']['n_nonempty_clusters']}",
    ]
    for name in ("shallow", "deep"):
        pca = report[name]["pca"]
        if pca:
            lines.append(f"PCA ({name}): {pca['original_dim']} -> {pca['n_components']} dims, "
                         f"explained variance {pca['explained_variance']:.4f}")
    lines += [
        f"Adjusted Rand Index:          {report['ari']:.4f}",
        f"Normalized Mutual Information: {report['nmi']:.4f}",
        f"Verdict: {report['verdict']}",
    ]
    cos = report["per_document_cosine"]
    if cos is None:
        lines.append(f"Per-document cosine: n/a (dimensions differ: {report['shallow']['dim']} vs {report['deep']['dim']})")
    else:
        lines.append(f"Per-document cosine (shallow vs deep): mean {cos['mean']:.4f}, median {cos['median']:.4f}, "
                     f"std {cos['std']:.4f}, min {cos['min']:.4f}, max {cos['max']:.4f} (row against row: "
                     "meaningful only where both sets share their axes, e.g. one derived from the other; a "
                     "model's token-table and last-layer embeddings share a width, not axes)")
    lines.append(f"Shallow clusters split in the deep space: {len(report['splits'])}; "
                 f"deep clusters merging shallow ones: {len(report['merges'])} "
                 f"(>= {report['split_share_threshold']:.0%} shares)")
    for s in report["splits"][:10]:
        parts = ", ".join(f"d{j} {v:.0%}" for j, v in s["into"].items())
        lines.append(f"  shallow s{s['shallow']} ({s['size']}) -> {parts}")
    for m in report["merges"][:10]:
        parts = ", ".join(f"s{i} {v:.0%}" for i, v in m["from"].items())
        lines.append(f"  deep d{m['deep']} ({m['size']}) <- {parts}")
    return "\n".join(lines)


def contingency_plot_path(plot: Path) -> Path:
    suffix = plot.suffix or ".png"
    return plot.with_name(f"{plot.stem}_contingency{suffix}")
