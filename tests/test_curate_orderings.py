"""--ordering, --compare-strategies, --score-field and --balance-field through curate_dataset.py."""

import json
import logging

import numpy as np
import pytest
from PIL import Image

import curate_dataset
from conftest import topical_records, write_jsonl
from diversity_order import diversity
from diversity_order import ordering_report as strategies
from diversity_order.cli import run_main
from diversity_order.orderings import ORDERINGS, SCORE_ORDERINGS, OrderingOptions, applicable_orderings
from diversity_order.orderings.options import flag_of
from reference_impl import assert_mean_of_shuffles


def curate(*args):
    return run_main(curate_dataset.main, [str(a) for a in args] + ["--no-progress"])


def run_error(capsys, *args):
    assert curate(*args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture()
def scored_jsonl(tmp_path):
    records = topical_records(per_topic=30, long_every=7)
    for i, record in enumerate(records):
        record["quality"] = (i * 37) % 101 / 10
        record["source"] = ["web", "code", "books"][i % 3] if i % 5 else "web"
    return write_jsonl(tmp_path / "scored.jsonl", records)


def _outputs(folder, stem="cur"):
    return (np.load(folder / f"{stem}_labels.npy"), np.load(folder / f"{stem}_order.npy"),
            json.loads((folder / f"{stem}_meta.json").read_text()))


@pytest.mark.parametrize("name", sorted(ORDERINGS))
def test_every_ordering_writes_its_order(tmp_path, tiny_model_dir, scored_jsonl, name, caplog):
    out = tmp_path / "cur.jsonl"
    caplog.set_level(logging.INFO)
    assert curate("--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                  "--seq-len", 2000, "--no-plot", "--ordering", name, "--score-field", "quality",
                  "--jitter-window", 4, "--balance-field", "source") == 0
    labels, order, meta = _outputs(tmp_path)
    counts = np.load(tmp_path / "scored_token_counts.npy")
    lines = scored_jsonl.read_bytes().splitlines()
    assert out.read_bytes().splitlines() == [lines[i] for i in order]  # each record once, in the saved order
    scores = np.array([json.loads(line)["quality"] for line in lines])
    sources = np.array([["web", "code", "books"].index(json.loads(line)["source"]) for line in lines])
    options = OrderingOptions(seq_len=2000, scores=scores, jitter_window=4, balance_groups=sources[:, None])
    assert order.tolist() == ORDERINGS[name](labels, counts, 5, options).tolist()
    assert meta["ordering"] == ("stratified_greedy" if name == "stratified" else name)
    curated = meta["ordering_quality"]["curated"]
    assert curated == diversity.ordering_quality(labels, counts, 2000, order, 5)
    assert meta["ordering_quality"]["original"] == diversity.ordering_quality(labels, counts, 2000, None, 5)
    if name in SCORE_ORDERINGS:
        assert meta["ordering_options"]["score_field"] == "quality"
    # Options left unset are recorded as the values this ordering ran with, not as null.
    from diversity_order.orderings.options import PER_ORDERING_DEFAULTS

    for option, by_ordering in PER_ORDERING_DEFAULTS.items():
        if name in by_ordering:
            assert meta["ordering_options"][option] == by_ordering[name], option
    # (--score-default alone is null when not given: records without a score are then an error)
    assert None not in [value for option, value in meta["ordering_options"].items() if option != "score_default"]
    # The log says them too, by their flags (a new user found saw's sections and folds only in the metadata).
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"Ordering {name} ")]
    assert len(said) == 1 and (" with " in said[0]) == bool(meta["ordering_options"])
    for option, value in meta["ordering_options"].items():
        flag = "--seq-len" if option == "seq_len" else flag_of(option)
        shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) if isinstance(value, list) else (
            f"{value:g}" if isinstance(value, float) else "none" if value is None else str(value))
        assert f"{flag} {shown or 'none'}" in said[0], option


def test_compare_strategies_writes_table_json_and_plot(tmp_path, tiny_model_dir, scored_jsonl, capsys, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "cur.jsonl"
    assert curate("--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                  "--seq-len", 2000, 500, "--compare-strategies", "--ordering", "balanced", "--no-plot") == 0
    printed = capsys.readouterr().out
    table = (tmp_path / "cur_strategies.md").read_text()
    assert table.strip().replace("**", "") in printed and "**" not in printed  # a terminal shows no bold marks
    assert printed.rstrip().endswith(f"{out} is written in --ordering balanced's order.")
    assert "## seq-len 500" in table and "## seq-len 2,000" in table
    report = json.loads((tmp_path / "cur_strategies.json").read_text())
    names = {r["ordering"] for r in report["rows"]}
    assert names == set(ORDERINGS) - set(SCORE_ORDERINGS)  # no --score-field: no score orderings
    assert len(report["rows"]) == 2 * len(names)
    labels, order, meta = _outputs(tmp_path)
    counts = np.load(tmp_path / "scored_token_counts.npy")
    for row in report["rows"]:  # the table's numbers are the metrics of that ordering at that length
        expected = ORDERINGS[row["ordering"]](labels, counts, 5, OrderingOptions(seq_len=row["seq_len"]))
        quality = diversity.ordering_quality(labels, counts, row["seq_len"], expected, 5)
        if row["ordering"] == "random":  # the baseline: the mean of several shuffles
            assert_mean_of_shuffles(row, labels, counts, 5, row["seq_len"], OrderingOptions().seed)
        else:
            assert {k: row[k] for k in quality} == quality
        assert f"| {row['ordering']} | {row['diversity']['mean']:.2f} |" in table
    assert not (tmp_path / "cur_strategies.png").exists()  # --no-plot skips the comparison's plot too
    assert out.exists() and meta["sequence_length"] == 2000  # the curated file follows the first --seq-len
    assert meta["strategy_comparison"]["seq_lens"] == [2000, 500]
    assert report["options"]["within_cluster_sort"] == "original" and "within_cluster_sort=original" in table
    assert report["options"]["packing"] == "whole" and "Options: packing=whole, " in table  # it changes every number
    assert "Score orderings (sorted, folding" in caplog.text  # says why they are missing


def test_strategy_report_plot(tmp_path):
    rng = np.random.default_rng(0)
    labels, counts = rng.integers(0, 6, 3000), rng.integers(20, 900, 3000)
    names = applicable_orderings(have_scores=True)
    rows, curves = strategies.compare_strategies(labels, counts, 6, [4096, 16384],
                                                 OrderingOptions(scores=rng.random(3000)), names)
    paths, table = strategies.write_report(tmp_path / "x", rows, curves, 6, "random data")
    report = json.loads(paths["json"].read_text())
    randoms = {r["seq_len"]: r for r in rows if r["ordering"] == "random"}
    assert report["u_out_of_reach"] == {str(n): r["uniformity_bound"] > 0.8 * r["uniformity_mean"]
                                        for n, r in randoms.items()}
    png = paths["plot"].read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert paths["markdown"].read_text() == table
    with Image.open(paths["plot"]) as image:  # one panel per seq-len: taller with two
        assert image.size[1] > image.size[0] * 0.5


def test_score_orderings_included_with_score_field(tmp_path, tiny_model_dir, scored_jsonl, capsys):
    out = tmp_path / "cur.jsonl"
    assert curate("--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                  "--seq-len", 2000, "--compare-strategies", "--score-field", "quality", "--stats-only",
                  "--no-plot", "--folds", 4) == 0
    report = json.loads((tmp_path / "cur_strategies.json").read_text())
    assert {r["ordering"] for r in report["rows"]} == set(ORDERINGS)
    # The options each score ordering ran with, its own defaults where a flag is unset (a reviewer found
    # sections and transition_ratio null there, and the table said nothing of them).
    assert report["options"]["per_ordering"] == {
        "folding": {"folds": 4}, "zigzag": {"folds": 4},
        "stair": {"folds": 4, "sections": 2, "transition_ratio": 0.225},
        "saw": {"folds": 4, "sections": 3, "transition_ratio": 0.075}}
    table = (tmp_path / "cur_strategies.md").read_text()
    assert ("Per ordering (its own default where the flag is unset): folding folds=4; zigzag folds=4; stair folds=4, "
            "sections=2, transition_ratio=0.225; saw folds=4, sections=3, transition_ratio=0.075.") in table
    assert not out.exists()  # and stdout does not say it was written (a new user's report)
    assert capsys.readouterr().out.rstrip().endswith(
        "--stats-only: no curated data written; --ordering stratified (the default) is the order the statistics "
        "describe.")


def test_ordering_flag_errors_are_one_line(tmp_path, tiny_model_dir, scored_jsonl, capsys):
    out = tmp_path / "cur.jsonl"
    base = ["--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5, "--no-plot"]
    assert "--score-field" in run_error(capsys, *base, "--ordering", "saw")
    assert "--compare-strategies" in run_error(capsys, *base, "--seq-len", 100, 200)
    assert "--transition-ratio" in run_error(capsys, *base, "--transition-ratio", 1.5)  # a fraction of all documents: 0..1
    # A missing or non-numeric score names the file and line.
    records = [json.loads(line) for line in scored_jsonl.read_text().splitlines()]
    del records[3]["quality"]
    write_jsonl(scored_jsonl, records)
    err = run_error(capsys, *base, "--ordering", "sorted", "--score-field", "quality")
    assert f"{scored_jsonl}:4:" in err and "no such field (this record has keys: id, source, text, topic)" in err
    records[3]["quality"] = 10**400  # a JSON integer past float range
    write_jsonl(scored_jsonl, records)
    assert f"{scored_jsonl}:4:" in run_error(capsys, *base, "--ordering", "sorted", "--score-field", "quality")
    records[3]["quality"] = "high"
    write_jsonl(scored_jsonl, records)
    assert f'error: {scored_jsonl}:4: --score-field quality needs a finite number in every record; found the value ' \
        '"high"; --score-default X gives such records the score X' \
        == run_error(capsys, *base, "--ordering", "sorted", "--score-field", "quality")
    # Several: how many and the last are said too, so one run finds the extent (a new user fixed them one by one).
    for i in (6, 9):
        del records[i]["quality"]
    write_jsonl(scored_jsonl, records)
    err = run_error(capsys, *base, "--ordering", "sorted", "--score-field", "quality")
    assert err.startswith(f'error: {scored_jsonl}:4: ') and len(err.splitlines()) == 1
    assert f"(3 of the {len(records):,} records lack one; the last: {scored_jsonl}:10)" in err
    assert "--score-default" in run_error(capsys, *base, "--ordering", "sorted", "--score-field", "quality",
                                          "--score-default", "nan")
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage errors are one line too
        curate(*base, "--segment-percentages", "30,x")
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: ") and "expected numbers separated by commas" in err
    assert "--segment-percentages" in run_error(capsys, *base, "--segment-percentages", "inf,30")
    # A negative value in exponent form, or -inf, is a value (a reviewer's "-1e9" was "expected one argument").
    assert run_error(capsys, *base, "--ordering", "sorted", "--score-field", "quality", "--score-default",
                     "-inf") == "error: --score-default -inf: give a finite number"
    assert run_error(capsys, *base, "--segment-percentages", "-5,10") == (
        "error: --segment-percentages -5,10: each value must be a percentage within 0..100")
    assert "--length-weight" in run_error(capsys, *base, "--length-weight", "inf")
    assert "no record has this field" in run_error(capsys, *base, "--ordering", "token-balanced",
                                                   "--balance-field", "sourc")
    # Whatever the ordering: a misspelt field passed with the default ordering and with paced (a new user's run).
    for ordering in ("stratified", "paced"):
        assert "no record has this field" in run_error(capsys, *base, "--ordering", ordering, "--balance-field", "sourc")


def test_records_without_a_score_take_the_score_default(tmp_path, tiny_model_dir, scored_jsonl, caplog):
    """A new user's quality field was null in 5% of the records: they had to rewrite their files. With
    --score-default they score that value, said with their count, and the order is the one those scores give."""
    records = [json.loads(line) for line in scored_jsonl.read_text().splitlines()]
    for i in (2, 5):
        del records[i]["quality"]
    records[7]["quality"] = None
    write_jsonl(scored_jsonl, records)
    caplog.set_level(logging.INFO)
    assert curate("--input", scored_jsonl, "--output", tmp_path / "cur.jsonl", "--model-dir", tiny_model_dir,
                  "--n-clusters", 5, "--no-plot", "--ordering", "sorted", "--score-field", "quality",
                  "--score-default", "-1.5e0") == 0  # (exponent form: a reviewer's -1e9 was taken for a flag)
    assert f"--score-field quality: 3 of the {len(records)} records hold no finite number; they score -1.5" in caplog.text
    scores = [-1.5 if r.get("quality") is None else r["quality"] for r in records]
    labels, order, meta = _outputs(tmp_path)
    counts = np.load(tmp_path / "scored_token_counts.npy")
    expected = ORDERINGS["sorted"](labels, counts, 5, OrderingOptions(scores=np.array(scores, dtype=np.float64)))
    assert order.tolist() == expected.tolist() and order[:3].tolist() == [2, 5, 7]
    assert meta["ordering_options"]["score_default"] == -1.5


def test_a_balance_field_the_ordering_ignores_is_measured_and_said(tmp_path, tiny_model_dir, scored_jsonl, caplog):
    """paced does not read --balance-field: it is said, also with --compare-strategies (whose tables, balancing
    the field under other orderings, read as if the file were), and the field's shares are measured all the same."""
    base = ["--input", scored_jsonl, "--model-dir", tiny_model_dir, "--n-clusters", 5, "--seq-len", 2000, "--no-plot",
            "--ordering", "paced", "--balance-field", "source"]
    for extra in ([], ["--compare-strategies"]):
        caplog.clear()
        assert curate(*base, *extra, "--output", tmp_path / "cur.jsonl") == 0
        said = [r.getMessage() for r in caplog.records if "--balance-field is not used by --ordering paced" in r.getMessage()]
        assert len(said) == 1 and said[0].endswith("its token shares are still measured")
        assert ("the curated file follows --ordering paced" in said[0]) == bool(extra)
        labels, order, meta = _outputs(tmp_path)
        counts = np.load(tmp_path / "scored_token_counts.npy")
        lines = scored_jsonl.read_bytes().splitlines()
        sources = np.array([["web", "code", "books"].index(json.loads(line)["source"]) for line in lines])
        q = diversity.ordering_quality(sources, counts, 2000, order, 3)
        got = meta["balance_field_quality"]["source"]["curated"]
        assert got["uniformity_mean"] == pytest.approx(q["uniformity_mean"])
        assert got["boundary_shift"] == pytest.approx(q["boundary_shift"])


def test_compare_strategies_measures_the_balance_field_under_every_ordering(tmp_path, tiny_model_dir, scored_jsonl,
                                                                           capsys):
    """A user balancing sources could not see, per ordering, how balanced the sources were (a new user found
    that orderings which ignore the field balanced it as well): each length's table now has the field's."""
    out = tmp_path / "cur.jsonl"
    assert curate("--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                  "--seq-len", 2000, "--compare-strategies", "--balance-field", "source", "--no-plot") == 0
    printed = capsys.readouterr().out
    assert "Field 'source' (its categories' token shares" in printed
    report = json.loads((tmp_path / "cur_strategies.json").read_text())
    labels, _, _ = _outputs(tmp_path)
    counts = np.load(tmp_path / "scored_token_counts.npy")
    lines = scored_jsonl.read_bytes().splitlines()
    sources = np.array([["web", "code", "books"].index(json.loads(line)["source"]) for line in lines])
    options = OrderingOptions(seq_len=2000, balance_groups=sources[:, None])
    by_name = {row["ordering"]: row for row in report["rows"]}
    for name, row in by_name.items():
        order = ORDERINGS[name](labels, counts, 5, options)
        q = diversity.ordering_quality(sources, counts, 2000, order, 3)
        if name == "random":
            assert_mean_of_shuffles(row["fields"]["source"], labels, counts, 5, 2000, options.seed, ids=sources)
            continue
        assert row["fields"]["source"] == {"uniformity_mean": q["uniformity_mean"],
                                           "boundary_shift": q["boundary_shift"]}, name
    shuffle = by_name["random"]["fields"]["source"]["uniformity_mean"]
    meta = json.loads((tmp_path / "cur_meta.json").read_text())  # the run's own baseline says its shuffles too
    assert meta["balance_field_quality"]["source"]["random_shuffle"]["shuffles"] == \
        meta["ordering_quality"]["random_shuffle"]["shuffles"] == 100
    paced = by_name["paced"]["fields"]["source"]["uniformity_mean"]
    assert f"| paced | {paced:.4f} | {paced / shuffle:.2f} |" in printed


def test_balanced_beats_stratified_and_random_on_the_topical_corpus(tmp_path, tiny_model_dir):
    # Source-grouped input with long documents: what the balanced ordering is for.
    path = write_jsonl(tmp_path / "grouped.jsonl", topical_records(per_topic=60, long_every=9))
    out = tmp_path / "cur.jsonl"
    assert curate("--input", path, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 6,
                  "--seq-len", 1500, "--ordering", "balanced", "--no-plot") == 0
    quality = json.loads((tmp_path / "cur_meta.json").read_text())["ordering_quality"]
    labels, _, _ = _outputs(tmp_path)
    counts = np.load(tmp_path / "grouped_token_counts.npy")
    stratified = diversity.ordering_quality(labels, counts, 1500, ORDERINGS["stratified"](labels, counts, 6), 6)
    assert quality["curated"]["diversity"]["mean"] >= stratified["diversity"]["mean"]
    assert quality["curated"]["uniformity_mean"] < quality["random_shuffle"]["uniformity_mean"]
    assert quality["curated"]["boundary_shift"] < quality["random_shuffle"]["boundary_shift"]
    assert quality["curated"]["boundary_shift"] < quality["original"]["boundary_shift"]


def test_flags_the_ordering_does_not_read_are_warned(tmp_path, tiny_model_dir, scored_jsonl, caplog):
    out = tmp_path / "cur.jsonl"
    assert curate("--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                  "--no-plot", "--ordering", "balanced", "--within-cluster-sort", "length-asc", "--folds", 5,
                  "--score-field", "nonexistent") == 0  # the score is not read: no error for the missing field
    assert "--within-cluster-sort is not used by --ordering balanced" in caplog.text
    assert "--folds is not used by --ordering balanced" in caplog.text
    assert "--score-field is not used by --ordering balanced" in caplog.text
    # A --stats-only comparison writes no curated file: a flag only the compared orderings read is what it was
    # given for (the README's demo comparison warned of --score-field and --jitter-window).
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert curate("--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                      "--no-plot", "--compare-strategies", "--stats-only", "--score-field", "quality",
                      "--jitter-window", 4) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "is not used by" in r.getMessage()]
    assert "--score-field is for the comparison (read by sorted, folding" in caplog.text
    assert "--jitter-window is for the comparison" in caplog.text


def test_balance_field_shares_are_reported(tmp_path, tiny_model_dir, scored_jsonl):
    out = tmp_path / "cur.jsonl"
    assert curate("--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                  "--seq-len", 2000, "--no-plot", "--ordering", "token-balanced", "--balance-field", "source") == 0
    labels, order, meta = _outputs(tmp_path)
    counts = np.load(tmp_path / "scored_token_counts.npy")
    names = ["web", "code", "books"]
    sources = np.array([names.index(json.loads(line)["source"]) for line in scored_jsonl.read_bytes().splitlines()])
    ids = np.unique(sources, return_inverse=True)[1]  # any relabelling gives the same metrics
    expected = diversity.ordering_quality(ids, counts, 2000, order, 3)
    got = meta["balance_field_quality"]["source"]["curated"]
    assert got["boundary_shift"] == expected["boundary_shift"] and got["uniformity_mean"] == expected["uniformity_mean"]
    assert got["boundary_shift"] < meta["balance_field_quality"]["source"]["original"]["boundary_shift"]


def test_balanced_interleaves_balance_field_categories_inside_each_cluster():
    # Within a cluster the balanced order keeps its pool order (due times grow along a pool), so
    # every prefix of a cluster's documents holds each category within one document of its share.
    rng = np.random.default_rng(3)
    n, k = 3000, 7
    labels = np.sort(rng.integers(0, k, n))
    counts = rng.integers(20, 2000, n)
    sources = np.where(np.arange(n) % 97 < 30, 0, rng.integers(1, 4, n))  # uneven categories
    order = ORDERINGS["balanced"](labels, counts, k, OrderingOptions(seq_len=4096, balance_groups=sources[:, None]))
    assert np.array_equal(np.sort(order), np.arange(n))
    for cluster in range(k):
        in_cluster = order[labels[order] == cluster]
        seen = np.zeros(4)
        totals = np.bincount(sources[in_cluster], minlength=4)
        for m, doc in enumerate(in_cluster, start=1):
            seen[sources[doc]] += 1
            assert np.all(np.abs(seen - m * totals / in_cluster.size) <= 1.0 + 1e-9), (cluster, m)
    # Without the field the same pools are only shuffled: the bound does not hold.
    plain = ORDERINGS["balanced"](labels, counts, k, OrderingOptions(seq_len=4096))
    worst = 0.0
    for cluster in range(k):
        in_cluster = plain[labels[plain] == cluster]
        totals = np.bincount(sources[in_cluster], minlength=4)
        prefix = np.cumsum(np.eye(4)[sources[in_cluster]], axis=0)
        expected = np.arange(1, in_cluster.size + 1)[:, None] * totals / in_cluster.size
        worst = max(worst, float(np.abs(prefix - expected).max()))
    assert worst > 2


def test_the_comparison_names_the_shards_it_wrote(tmp_path, tiny_model_dir, scored_jsonl, capsys):
    out = tmp_path / "cur.jsonl"
    assert curate("--input", scored_jsonl, "--output", out, "--model-dir", tiny_model_dir, "--n-clusters", 5,
                  "--seq-len", 2000, "--compare-strategies", "--output-shards", 2, "--no-plot") == 0
    assert capsys.readouterr().out.rstrip().endswith(
        f"{tmp_path / 'cur-00000-of-00002.jsonl'} ... cur-00001-of-00002.jsonl are written in --ordering stratified "
        "(the default)'s order.")
    assert not out.exists() and (tmp_path / "cur-00001-of-00002.jsonl").is_file()


def test_a_balance_field_of_about_one_category_per_record_or_given_twice_is_warned_of(tmp_path, tiny_model_dir,
                                                                                       caplog):
    """--balance-field id (one category per record) balanced nothing without a word, and a field given twice was
    read and logged twice."""
    records = topical_records(per_topic=60)
    for i, record in enumerate(records):
        record["id"] = f"doc-{i}"
    src = write_jsonl(tmp_path / "d.jsonl", records)
    base = ["--input", src, "--model-dir", tiny_model_dir, "--n-clusters", 3, "--no-plot", "--ordering", "balanced"]
    with caplog.at_level(logging.WARNING):
        assert curate(*base, "--output", tmp_path / "a.jsonl", "--balance-field", "id") == 0
        assert curate(*base, "--output", tmp_path / "b.jsonl", "--balance-field", "topic", "--balance-field",
                      "topic") == 0
    assert (f"--balance-field id: {len(records)} categories among {len(records)} records, most records a category of "
            "their own") in caplog.text
    assert "--balance-field given more than once for topic: balanced once" in caplog.text
    assert "--balance-field topic:" not in caplog.text  # (a field of few values: not warned of)
