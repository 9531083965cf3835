"""compare_clusterings: metrics against scikit-learn, verdict bands, errors, JSON and plots."""

import json
import logging

import numpy as np
import pytest
from PIL import Image
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

import compare_clusterings
from diversity_order import cluster_compare as cmp
from diversity_order import plots
from diversity_order.errors import UserError


def blobs(n_per=40, k=4, dim=16, seed=0, spread=0.05):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim))
    labels = np.repeat(np.arange(k), n_per)
    x = centres[labels] + spread * rng.normal(size=(labels.size, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), labels


def test_identical_embeddings_give_ari_one():
    x, _ = blobs()
    result = cmp.compare(x, x.copy(), n_clusters=4)
    assert result.report["ari"] == pytest.approx(1.0)
    assert result.report["nmi"] == pytest.approx(1.0)
    assert result.report["verdict"].startswith("high overlap")
    assert result.report["per_document_cosine"]["mean"] == pytest.approx(1.0, abs=1e-4)
    assert result.report["splits"] == [] and result.report["merges"] == []


def test_metrics_match_sklearn_on_independent_clusterings():
    x, _ = blobs(n_per=100, k=5, seed=1)
    y = np.random.default_rng(7).normal(size=(500, 8)).astype(np.float32)  # unrelated structure
    result = cmp.compare(x, y, n_clusters=5)
    assert result.report["ari"] == pytest.approx(adjusted_rand_score(result.shallow_labels, result.deep_labels), abs=1e-6)
    assert result.report["nmi"] == pytest.approx(normalized_mutual_info_score(result.shallow_labels, result.deep_labels),
                                                 abs=1e-6)
    assert abs(result.report["ari"]) < 0.1
    assert result.report["verdict"].startswith("very different")
    assert result.report["per_document_cosine"] is None  # 16 vs 8 dims
    table = np.array(result.report["contingency"])
    assert table.sum() == 500 and table.shape == (5, 5)


def test_verdict_bands():
    assert cmp.verdict(0.71).startswith("high")
    assert cmp.verdict(0.7).startswith("moderate") and cmp.verdict(0.3).startswith("moderate")
    assert cmp.verdict(0.29).startswith("very different")


def test_one_cluster_on_a_side_is_not_comparable_and_one_cluster_asked_for_is_refused():
    """Deep rows all alike fall into one cluster: ARI 0 and "very different: deep embeddings are worth pursuing".
    --n-clusters 1 gave ARI 1, "high overlap", whatever the embeddings."""
    import warnings

    x, _ = blobs(n_per=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (k-means on identical rows warns of too few distinct points)
        result = cmp.compare(x, np.ones((x.shape[0], 8), np.float32), n_clusters=4, pca_components=0)
    assert result.report["deep"]["n_nonempty_clusters"] == 1
    assert result.report["verdict"].startswith("not comparable: the deep embeddings fall into one cluster")
    with pytest.raises(UserError, match="--n-clusters 1: must be at least 2"):
        cmp.compare(x, x, n_clusters=1, pca_components=0)


def test_split_is_found_and_block_order_is_diagonal():
    # Shallow cluster 0 splits in half into deep clusters 1 and 2; shallow 1 maps to deep 0.
    shallow = np.array([0] * 40 + [1] * 30)
    deep = np.array([1] * 20 + [2] * 20 + [0] * 30)
    table = cmp.contingency(shallow, deep, 2, 3)
    splits, merges = cmp.splits_and_merges(table)
    assert splits == [{"shallow": 0, "size": 40, "into": {1: 0.5, 2: 0.5}}] and merges == []
    # Named as the heat map's axes and the scatters' labels name them: s0 (shallow), d1 (deep).
    side = {"n_nonempty_clusters": 2, "dim": 2, "pca": None}
    lines = cmp.format_report({"n_rows_used": 70, "non_finite_rows": {"dropped": 0}, "n_clusters": 3,
                               "shallow": side, "deep": side, "ari": 0.5, "nmi": 0.5, "verdict": "moderate",
                               "per_document_cosine": None, "splits": splits, "split_share_threshold": 0.2,
                               "merges": [{"deep": 1, "size": 30, "from": {0: 0.5, 1: 0.5}}]}).splitlines()
    assert "  shallow s0 (40) -> d1 50%, d2 50%" in lines and "  deep d1 (30) <- s0 50%, s1 50%" in lines
    rows, cols = cmp.block_order(table)
    assert rows.tolist() == [0, 1] and cols.tolist()[-1] == 0  # deep 0 sits under shallow 1, last


def test_nan_rows_are_dropped_and_counted(caplog):
    x, _ = blobs()
    deep = x.copy()
    deep[[3, 50]] = np.nan
    x2 = x.copy()
    x2[7, 0] = np.inf
    result = cmp.compare(x2, deep, n_clusters=4)
    assert result.report["non_finite_rows"] == {"shallow": 1, "deep": 2, "dropped": 3}
    assert result.report["n_rows_used"] == 157 and 3 not in result.kept_rows
    assert "left out of both" in caplog.text


def test_errors():
    x, _ = blobs()
    with pytest.raises(UserError, match="row counts differ"):
        cmp.compare(x, x[:-1])
    with pytest.raises(UserError, match="larger than the number of usable rows"):
        cmp.compare(x[:10], x[:10], n_clusters=30)
    all_nan = np.full_like(x, np.nan)
    with pytest.raises(UserError, match="no rows left"):
        cmp.compare(x, all_nan, n_clusters=4)


def test_script_json_and_plots(tmp_path, monkeypatch, capsys):
    x, _ = blobs(n_per=30)
    rng = np.random.default_rng(3)
    deep = np.concatenate([x, rng.normal(size=(x.shape[0], 4)).astype(np.float32)], axis=1)
    np.save(tmp_path / "s.npy", x)
    np.save(tmp_path / "d.npy", deep)
    # UMAP is slow to start; the projection itself is covered by the plots' own tests.
    original = plots.plot_umap_side_by_side
    monkeypatch.setattr(plots, "plot_umap_side_by_side",
                        lambda path, s, d, result, seed=42: original(path, s, d, result, seed, projector=lambda a: a[:, :2]))
    rc = compare_clusterings.main(["--shallow", str(tmp_path / "s.npy"), "--deep", str(tmp_path / "d.npy"),
                                   "--n-clusters", "4", "--pca-deep-only", "8", "--plot", str(tmp_path / "cmp.png"),
                                   "--json", str(tmp_path / "cmp.json")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Adjusted Rand Index" in out and "Verdict" in out
    report = json.loads((tmp_path / "cmp.json").read_text())
    assert report["deep"]["pca"]["n_components"] == 8 and report["shallow"]["pca"] is None
    assert {"ari", "nmi", "verdict", "contingency", "per_document_cosine", "splits", "merges"} <= set(report)
    for name in ("cmp.png", "cmp_contingency.png"):
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.width > 400


def test_rows_made_from_different_token_limits_are_said(tmp_path, caplog):
    """Deep embeddings of the first 48 tokens against shallow ones of whole documents (a new user's run): the
    comparison says so, by the manifests beside the files, and records each limit."""
    from diversity_order import caches

    x, _ = blobs(n_per=30)
    fingerprints = np.arange(x.shape[0], dtype=np.uint64)
    caches.store(tmp_path / "s.npy", {"kind": "shallow"}, fingerprints, x)
    caches.store(tmp_path / "d.npy", {"kind": "deep", "max_len": 48}, fingerprints, x)
    with caplog.at_level("WARNING"):
        assert compare_clusterings.main(["--shallow", str(tmp_path / "s.npy"), "--deep", str(tmp_path / "d.npy"),
                                         "--n-clusters", "4", "--json", str(tmp_path / "r.json")]) == 0
    assert "--shallow's rows were made from whole documents, --deep's from the first 48 tokens of each document" \
        in caplog.text
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["shallow"]["token_limit"] is None and report["deep"]["token_limit"] == 48
    caplog.clear()
    caches.store(tmp_path / "s.npy", {"kind": "shallow", "max_len": 48}, fingerprints, x)
    with caplog.at_level("WARNING"):
        assert compare_clusterings.main(["--shallow", str(tmp_path / "s.npy"), "--deep", str(tmp_path / "d.npy"),
                                         "--n-clusters", "4"]) == 0
    assert "were made from" not in caplog.text


def test_side_by_side_titles_say_where_pca_was_used(tmp_path, monkeypatch):
    """Each panel gives its embeddings' width and, where k-means ran on a PCA of them, the PCA's."""
    x, _ = blobs(n_per=30)
    deep = np.concatenate([x, np.random.default_rng(3).normal(size=(x.shape[0], 4)).astype(np.float32)], axis=1)
    result = cmp.compare(x, deep, n_clusters=4, pca_deep_only=3)
    titles = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: titles.extend(ax.get_title() for ax in fig.axes))
    plots.plot_umap_side_by_side(tmp_path / "cmp.png", x, deep, result, projector=lambda a: a[:, :2])
    assert titles[0].startswith(f"Shallow embeddings ({x.shape[1]} dims), coloured")
    assert titles[1].startswith(f"Deep embeddings ({deep.shape[1]} dims, clustered on PCA 3), coloured")


def test_the_log_says_how_many_pca_dims_are_used_where_the_rows_allow_fewer(caplog):
    """A reviewer's --pca-deep-only 1000 on 300 rows logged "PCA 1000" where 299 dimensions were used."""
    x, _ = blobs(n_per=10)
    deep = np.random.default_rng(3).normal(size=(x.shape[0], 64)).astype(np.float32)
    with caplog.at_level(logging.INFO):
        result = cmp.compare(x, deep, n_clusters=3, pca_components=2, pca_deep_only=1000)
    rows = x.shape[0]
    assert result.report["deep"]["pca"]["n_components"] == rows - 1
    assert f"PCA to {rows - 1} dims (of 1000 asked: {rows} rows and 64 dims allow no more)" in caplog.text
    assert "k=3, PCA to 2 dims" in caplog.text and "of 2 asked" not in caplog.text


def test_script_errors_are_one_line(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.ones((5, 3), np.float32))
    np.save(tmp_path / "b.npy", np.ones((6, 3), np.float32))
    rc = compare_clusterings.run_main(compare_clusterings.main,
                                      ["--shallow", str(tmp_path / "a.npy"), "--deep", str(tmp_path / "b.npy")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: row counts differ") and err.count("\n") == 1
    # With each file's fingerprints beside it, the counts are still what is said (a reviewer was told the deep
    # file's fingerprints were not its rows').
    np.save(tmp_path / "a.fingerprints.npy", np.arange(5, dtype=np.uint64))
    np.save(tmp_path / "b.fingerprints.npy", np.arange(6, dtype=np.uint64))
    rc = compare_clusterings.run_main(compare_clusterings.main,
                                      ["--shallow", str(tmp_path / "a.npy"), "--deep", str(tmp_path / "b.npy")])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("error: row counts differ: the shallow file has 5 rows, the deep file 6; both must hold "
                               "the same documents in the same order\n")
    rc = compare_clusterings.run_main(compare_clusterings.main, ["--shallow", str(tmp_path / "a.npy"), "--deep",
                                                                 str(tmp_path / "a.npy"), "--plot", str(tmp_path / "x.txt")])
    assert rc == 2 and "--plot" in capsys.readouterr().err and not list(tmp_path.glob("x*"))
    # A plot path that is a folder: a traceback at the end, after the work; now one line before it.
    (tmp_path / "d.png").mkdir()
    rc = compare_clusterings.run_main(compare_clusterings.main, ["--shallow", str(tmp_path / "a.npy"), "--deep",
                                                                 str(tmp_path / "a.npy"), "--plot", str(tmp_path / "d.png")])
    assert rc == 2 and capsys.readouterr().err == (f"error: --plot {tmp_path / 'd.png'}: is a folder, where this run "
                                                   "writes its plot; move it or choose another --plot\n")


def test_a_report_or_plot_never_replaces_an_input(tmp_path, capsys, monkeypatch):
    x, _ = blobs(n_per=10)
    for name in ("s.npy", "d.npy", "d.json"):
        np.save(tmp_path / name, x) if name.endswith(".npy") else (tmp_path / name).write_text("{}")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(cmp, "compare", lambda *a, **k: pytest.fail("compared before the outputs were checked"))
    base = ["--shallow", str(tmp_path / "s.npy"), "--deep", str(tmp_path / "d.npy")]
    for extra, said in ((["--json", str(tmp_path / "d.npy")], "error: --json {d}.npy: the report is JSON; give a "
                                                               "name ending in .json"),
                        (["--json", str(tmp_path / "s.npy")], "error: --json {s}.npy: the report is JSON"),
                        (["--plot", str(tmp_path / "p.png"), "--json", str(tmp_path / "p.png")], "error: --json"),
                        (["--json", str(tmp_path / "r")], "error: --json {r}: the report is JSON")):
        rc = compare_clusterings.run_main(compare_clusterings.main, base + extra)
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(said.format(d=tmp_path / "d", s=tmp_path / "s", r=tmp_path / "r")), err
        assert err.count("\n") == 1
    # An input that is itself named .json (a misnamed array) is never written over.
    rc = compare_clusterings.run_main(compare_clusterings.main, ["--shallow", str(tmp_path / "s.npy"), "--deep",
                                                                 str(tmp_path / "d.json"), "--json",
                                                                 str(tmp_path / "." / "d.json")])
    assert rc == 2 and "is the --deep file" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_report_replaces_an_earlier_report_but_no_other_json(tmp_path, capsys):
    """A curate run's ``_meta.json`` (or a model's ``config.json``) is a .json name too: it is kept."""
    x, _ = blobs(n_per=10)
    np.save(tmp_path / "s.npy", x)
    base = ["--shallow", str(tmp_path / "s.npy"), "--deep", str(tmp_path / "s.npy"), "--n-clusters", "3", "--json"]
    for name, text in (("run_meta.json", '{"n_documents": 30, "ordering": "stratified"}'), ("bad.json", "{not json"),
                       ("list.json", "[1, 2]")):
        (tmp_path / name).write_text(text)
        rc = compare_clusterings.run_main(compare_clusterings.main, base + [str(tmp_path / name)])
        err = capsys.readouterr().err
        assert rc == 2 and err == f"error: --json {tmp_path / name} exists and is not an earlier comparison " \
                                  "report; choose another path (or remove it)\n"
        assert (tmp_path / name).read_text() == text
    report = tmp_path / "r.json"
    assert compare_clusterings.main(base + [str(report)]) == 0
    first = json.loads(report.read_text())
    assert compare_clusterings.main(base[:-3] + ["--n-clusters", "4", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["n_clusters"] == 4 != first["n_clusters"]


def test_files_whose_rows_are_in_different_orders_are_refused(tmp_path, capsys, caplog):
    """By the fingerprints files curate_dataset.py and extract_deep_embeddings.py write beside their embeddings."""
    x, _ = blobs(n_per=30)
    fingerprints = np.random.default_rng(5).integers(0, 2**63, x.shape[0]).astype(np.uint64)
    np.save(tmp_path / "s.npy", x)
    np.save(tmp_path / "s.fingerprints.npy", fingerprints)
    np.save(tmp_path / "d.npy", x[::-1].copy())
    np.save(tmp_path / "d.fingerprints.npy", fingerprints[::-1].copy())
    args = ["--shallow", str(tmp_path / "s.npy"), "--deep", str(tmp_path / "d.npy"), "--n-clusters", "4"]
    rc = compare_clusterings.run_main(compare_clusterings.main, args)
    err = capsys.readouterr().err
    assert rc == 2 and f"the rows are not in the order of --shallow's rows (row 0 is --deep's row {x.shape[0] - 1}," in err
    assert err.count("\n") == 1
    np.save(tmp_path / "d.npy", x)
    np.save(tmp_path / "d.fingerprints.npy", fingerprints)
    assert compare_clusterings.run_main(compare_clusterings.main, args) == 0
    # Other texts altogether (another text field, say): compared by position, with a warning.
    np.save(tmp_path / "d.fingerprints.npy", fingerprints + np.uint64(1))
    with caplog.at_level("WARNING"):
        assert compare_clusterings.run_main(compare_clusterings.main, args) == 0
    assert "are mostly not those of --shallow's rows" in caplog.text
    # Two overlapping samples (as a new user made: the first and the last part of a file, 48% shared): the
    # shared documents sit at other rows, so every document would be compared with another one's vector.
    shift = x.shape[0] * 3 // 5
    np.save(tmp_path / "d.fingerprints.npy", np.concatenate([fingerprints[shift:], fingerprints[:shift] + np.uint64(1)]))
    assert compare_clusterings.run_main(compare_clusterings.main, args) == 2
    err = capsys.readouterr().err
    assert f"the rows are not in the order of --shallow's rows (row {shift} is --deep's row 0," in err
    # How many are shared is said: a reviewer's files of mostly other documents read as one set reordered.
    assert (f"each; {x.shape[0] - shift} of the {x.shape[0]} are of documents both hold, the others of documents only "
            "one holds); give embeddings") in err


def test_an_output_folder_that_cannot_be_made_is_said_before_the_work(tmp_path, capsys, monkeypatch):
    x, _ = blobs(n_per=10)
    np.save(tmp_path / "s.npy", x)
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr(cmp, "compare", lambda *a, **k: pytest.fail("compared before the output was checked"))
    rc = compare_clusterings.run_main(compare_clusterings.main, ["--shallow", str(tmp_path / "s.npy"), "--deep",
                                      str(tmp_path / "s.npy"), "--json", str(tmp_path / "a_file" / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: --json: cannot write in") and err.count("\n") == 1


def test_files_without_fingerprints_are_compared_unchecked_and_said(tmp_path, caplog):
    """A reviewer copied the two files without their fingerprints and reordered one: ARI -0.03 and "deep embeddings
    are worth pursuing", without a word that nothing was checked. Now each file without them is said."""
    import logging

    from diversity_order import cluster_compare

    rows = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    np.save(tmp_path / "s.npy", rows)
    np.save(tmp_path / "d.npy", rows[::-1].copy())
    np.save(tmp_path / "d.fingerprints.npy", np.arange(20, dtype=np.uint64))
    with caplog.at_level(logging.WARNING):
        cluster_compare.check_same_order(tmp_path / "s.npy", tmp_path / "d.npy", 20, 20)
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"--shallow {tmp_path / 's.npy'}: no s.fingerprints.npy beside it (copied without it?), so the two "
                    "files' rows are compared by position, unchecked: files of the same documents in other orders "
                    "would compare each document with another one"]


def test_an_unfinished_deep_extractions_checkpoint_is_refused(tmp_path, capsys):
    """A reviewer gave --deep the checkpoint an interrupted extraction left (its only .npy): 284 of 300 rows zeros,
    compared with a warning only, and "very different: deep embeddings are worth pursuing"."""
    from diversity_order import distributed
    from diversity_order.deep.checkpoint import partial_paths

    x, _ = blobs(n_per=10)
    np.save(tmp_path / "s.npy", x)
    data, done, key = partial_paths(tmp_path / "k.npy", distributed.DistContext())
    partial = np.zeros_like(x)
    partial[:16] = x[:16]
    np.save(data, partial)
    np.save(done, np.arange(x.shape[0]) < 16)
    key.write_text("{}")
    rc = compare_clusterings.run_main(compare_clusterings.main, ["--shallow", str(tmp_path / "s.npy"), "--deep",
                                                                 str(data), "--n-clusters", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert f"a checkpoint of an unfinished extract_deep_embeddings.py run (16 of its {x.shape[0]} rows were computed" in err
    done.unlink()  # the mask unreadable or gone: still the checkpoint (its key is there)
    assert compare_clusterings.run_main(compare_clusterings.main, ["--shallow", str(tmp_path / "s.npy"), "--deep",
                                                                   str(data), "--n-clusters", "4"]) == 2
    assert "its rows are not all computed" in capsys.readouterr().err


def test_files_of_other_documents_made_from_one_field_are_refused(tmp_path, capsys, caplog):
    """A reviewer's files of the next 300 documents (all texts differ) and of 40 shared and 260 others: each was
    compared with a warning ("edited since?") and a verdict. Rows made from one field whose texts mostly differ
    are other documents: refused; a few edits are still a warning, and other fields are compared unchecked."""
    from diversity_order import caches

    x, _ = blobs(n_per=25)
    n = x.shape[0]
    texts = np.random.default_rng(3).integers(0, 2**63, n).astype(np.uint64)
    args = ["--shallow", str(tmp_path / "s.npy"), "--deep", str(tmp_path / "d.npy"), "--n-clusters", "4"]
    caches.store(tmp_path / "s.npy", {"kind": "shallow", "text_field": "text"}, texts, x)
    for differing, refused in ((n, True), (n * 13 // 15, True), (n // 2 + 1, True), (n // 2, False), (5, False)):
        other = texts.copy()
        other[n - differing:] += np.uint64(1)
        caches.store(tmp_path / "d.npy", {"kind": "deep", "text_field": "text"}, other, x)
        caplog.clear()
        with caplog.at_level("WARNING"):
            rc = compare_clusterings.run_main(compare_clusterings.main, args)
        err = capsys.readouterr().err
        assert rc == (2 if refused else 0), (differing, err)
        if refused:
            assert f"{differing} of the {n} texts of --shallow's rows are not among those --deep's rows were made from" \
                in err and "files of other documents" in err
        else:
            assert f"{differing} of --shallow's rows differ from the texts the rows were made from (edited since, or " \
                   "other documents?)" in caplog.text
    # another field on one side: texts differ by design, compared by position with the warning
    caches.store(tmp_path / "d.npy", {"kind": "deep", "text_field": "content"}, texts + np.uint64(1), x)
    with caplog.at_level("WARNING"):
        assert compare_clusterings.run_main(compare_clusterings.main, args) == 0
    assert "are mostly not those of --shallow's rows" in caplog.text


def test_a_token_limit_no_document_reaches_is_not_warned(tmp_path, caplog):
    """Every extraction without --max-tokens records the model's length (8,192): the README's own comparison
    warned that documents longer than that were compared on different text, where none was. The full lengths
    the extraction keeps beside its rows say how many are."""
    from diversity_order import caches
    from diversity_order.deep.tokens import token_cache_files

    x, _ = blobs(n_per=10)
    texts = np.arange(x.shape[0], dtype=np.uint64)
    caches.store(tmp_path / "s.npy", {"kind": "shallow"}, texts, x)
    caches.store(tmp_path / "d.npy", {"kind": "deep", "max_len": 48}, texts, x)
    files = token_cache_files(tmp_path / "d.npy")
    full = np.full(x.shape[0], 30)
    np.save(files.data, np.stack([np.minimum(full, 48), full], axis=1))
    np.save(files.fingerprints, texts)
    args = ["--shallow", str(tmp_path / "s.npy"), "--deep", str(tmp_path / "d.npy"), "--n-clusters", "4"]
    with caplog.at_level("INFO"):
        assert compare_clusterings.main(args) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "made from" in r.getMessage()]
    assert "no document is longer than that" in caplog.text
    caplog.clear()
    full[[3, 7]] = 100
    np.save(files.data, np.stack([np.minimum(full, 48), full], axis=1))
    with caplog.at_level("WARNING"):
        assert compare_clusterings.main(args) == 0
    assert f"the 2 document(s) longer than that (of {x.shape[0]}) are compared on different text" in caplog.text
    caplog.clear()
    np.save(files.fingerprints, texts + np.uint64(1))  # lengths of other texts: not taken, the warning as before
    with caplog.at_level("WARNING"):
        assert compare_clusterings.main(args) == 0
    assert "documents longer than that are compared on different text" in caplog.text
