"""Compare the clusters of two embedding sets of the same documents (e.g. shallow vs deep).

Clusters each set as curate_dataset.py does (optional PCA, MiniBatchKMeans), then reports the
Adjusted Rand Index and Normalized Mutual Information with a verdict (ARI > 0.7: deep adds
little; 0.3-0.7: moderate; < 0.3: very different, deep worth pursuing), cluster counts,
per-document cosine when the dimensions match, and which shallow clusters split or merge.
Rows with NaN/inf in either file are left out of both (and counted).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..defaults import DEFAULT_N_CLUSTERS, DEFAULT_SEED
from . import ArgumentParser, add_output_flags, run_command, setup_logging

log = logging.getLogger("diversity_order")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, prog="compare_clusterings.py")
    p.add_argument("--shallow", required=True, type=Path, help="N x D .npy, e.g. B_embeddings.npy from curate_dataset.py")
    p.add_argument("--deep", required=True, type=Path, help="N x D' .npy of the same documents in the same order")
    p.add_argument("--n-clusters", type=int, default=DEFAULT_N_CLUSTERS,
                   help=f"k for both clusterings (default: {DEFAULT_N_CLUSTERS})")
    p.add_argument("--pca-components", type=int, default=0, help="PCA before clustering, both sets (0 = off; default: 0)")
    p.add_argument("--pca-deep-only", type=int, default=None,
                   help="PCA components for the deep set only (overrides --pca-components for it; 0 = off)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed for PCA, k-means and UMAP (default: {DEFAULT_SEED})")
    p.add_argument("--plot", type=Path, default=None,
                   help="write side-by-side UMAP scatters here (PNG), and the contingency heat map "
                        "beside it as NAME_contingency.png")
    p.add_argument("--json", type=Path, default=None, help="write every number (metrics, sizes, contingency) as JSON")
    add_output_flags(p, progress=False)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.verbose)
    from .. import cluster_compare as cmp
    from .. import plots
    from ..arrays import load_matrix
    from ..atomic import save_json
    from ..defaults import MAX_SEED
    from ..errors import UserError, check_range
    from ..outputs import check_not_folders, check_plain_output, check_writable_folder, same_file

    check_range(args.seed, "--seed", 0, MAX_SEED)
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        raise UserError(f"--plot {args.plot}: the plots are PNG images; give a name ending in .png")
    if args.json is not None and args.json.suffix.lower() != ".json":
        raise UserError(f"--json {args.json}: the report is JSON; give a name ending in .json")
    for flag, path in (("--plot", args.plot), ("--json", args.json)):
        if path is None:
            continue
        for read_flag, source in (("--shallow", args.shallow), ("--deep", args.deep)):
            if same_file(path, source):
                raise UserError(f"{flag} {path} is the {read_flag} file; choose another path")
        check_writable_folder(path.parent, flag)  # before the work, not after it
        written = {"plot": path, "contingency plot": cmp.contingency_plot_path(path)} if flag == "--plot" \
            else {"report": path}
        check_not_folders(written, flag, path)
        for name in written.values():
            check_plain_output(name, flag)
    if args.json is not None:
        cmp.check_replaceable_report(args.json)
    shallow = load_matrix(args.shallow, "--shallow")
    deep = load_matrix(args.deep, "--deep")
    cmp.check_same_order(args.shallow, args.deep, shallow.shape[0], deep.shape[0])
    limits = cmp.token_limits(args.shallow, args.deep)
    result = cmp.compare(shallow, deep, args.n_clusters, args.pca_components, args.pca_deep_only, args.seed)
    result.report["shallow"]["path"] = str(args.shallow)
    result.report["deep"]["path"] = str(args.deep)
    for name, limit in limits.items():
        result.report[name]["token_limit"] = limit
    print(cmp.format_report(result.report))
    if args.plot is not None:
        kept = result.kept_rows
        plots.plot_contingency(cmp.contingency_plot_path(args.plot), result)
        log.info("Contingency heat map written to %s", cmp.contingency_plot_path(args.plot))
        plots.plot_umap_side_by_side(args.plot, shallow[kept], deep[kept], result, args.seed)
        log.info("UMAP comparison written to %s", args.plot)
        result.report["plots"] = [str(args.plot), str(cmp.contingency_plot_path(args.plot))]
    if args.json is not None:
        save_json(args.json, result.report)
        log.info("Report written to %s", args.json)
    return 0


def console() -> int:
    """The ``compare-clusterings`` command."""
    return run_command(main)
