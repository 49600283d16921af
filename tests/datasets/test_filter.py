"""``rewardkit filter``: the rows it keeps are exactly those a pandas query on the scores keeps, written in the
input's own format; the expression language is parsed, never evaluated as Python."""

from __future__ import annotations

import io
import json
import math
import tarfile

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

from tests.helpers.data_files import png_bytes, wds_set  # noqa: E402


def _cli(*argv: str) -> int:
    from rewardkit.cli import main

    return main(list(argv))


@pytest.fixture(scope="module")
def scored(tiny_clip_dir, tmp_path_factory):
    """3 Parquet shards x 8 rows (4 prompts, 6 images each, one corrupt image), scored by two rewards."""
    root = tmp_path_factory.mktemp("filter")
    data = root / "data"
    data.mkdir()
    uid = 0
    for s in range(3):
        recs = []
        for i in range(8):
            recs.append({"uid": uid, "image": png_bytes(700 + uid), "prompt": f"prompt {(s * 8 + i) % 4}",
                         "width": 24 + (uid % 3)})
            uid += 1
        if s == 1:
            recs[3]["image"] = b"broken"
        pq.write_table(pa.Table.from_pylist(recs), data / f"part-{s}.parquet")
    for name, extra in (("a", []), ("b", ["--set", "scale=2.0"])):
        assert _cli("score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", str(data), "--output",
                    str(root / name), "--id-column", "uid", "--no-progress", "--batch-size", "5", *extra) == 3
    return root


def _frame(root, name="a"):
    man = json.loads((root / name / "_rewardkit_scores.json").read_text())
    scores = pd.concat([pq.read_table(root / name / f"{n}.parquet").to_pandas() for n in man["shards"]],
                       ignore_index=True)
    data = pd.concat([pq.read_table(root / "data" / f"{n}.parquet").to_pandas() for n in man["shards"]],
                     ignore_index=True)
    assert (scores["id"] == data["uid"]).all()
    return pd.concat([data.drop(columns=["image"]), scores.drop(columns=["id"])], axis=1)


def _kept_uids(out):
    files = sorted(out.glob("*.parquet"))
    return [u for f in files for u in pq.read_table(f).column("uid").to_pylist()]


@pytest.mark.parametrize("expr", ["score >= {m}", "score < {m} or width == 25", "not (score > {m}) and width != 24",
                                  "1 - score * 2 > -2 * {m} + 1"])
def test_where_keeps_what_pandas_query_keeps(scored, tmp_path, expr):
    df = _frame(scored)
    m = float(np.nanmedian(df["score"]))
    text = expr.format(m=repr(m))
    out = tmp_path / "kept"
    assert _cli("filter", "--dataset", str(scored / "data"), "--scores", str(scored / "a"), "--where", text,
                "--output", str(out), "--no-progress") == 0
    want = df[df["valid"]].query(text)["uid"].tolist()  # the reference: pandas over the same columns
    assert 0 < len(want) < 23
    assert _kept_uids(out) == want
    kept = pq.read_table(sorted(out.glob("*.parquet"))[0])
    assert kept.schema == pq.read_schema(scored / "data" / "part-0.parquet")  # original rows, images included
    rep = json.loads((out / "_rewardkit_filter.json").read_text())
    assert (rep["total"], rep["kept"], rep["invalid"]) == (24, len(want), 1)
    assert rep["failed_where"] == 23 - len(want)


@pytest.mark.parametrize("mode", ["top_k", "top_p"])
def test_top_k_and_top_p_per_prompt_match_pandas(scored, tmp_path, mode):
    df = _frame(scored)
    flag = ["--top-k", "2"] if mode == "top_k" else ["--top-p", "0.4"]
    out = tmp_path / "kept"
    assert _cli("filter", "--dataset", str(scored / "data"), "--scores", str(scored / "a"), *flag,
                "--group-by", "prompt", "--output", str(out), "--no-progress") == 0
    ok = df[df["valid"]].sort_values("score", ascending=False, kind="stable")
    rank = ok.groupby("prompt").cumcount()
    if mode == "top_k":
        sel = ok[rank < 2]
    else:
        sizes = ok.groupby("prompt")["uid"].transform("size")
        sel = ok[rank < np.ceil(0.4 * sizes)]
    want = sorted(sel["uid"].tolist())
    assert _kept_uids(out) == want
    assert len(want) == (8 if mode == "top_k" else 3 * math.ceil(0.4 * 6) + math.ceil(0.4 * 5))


def test_several_rewards_in_one_expression(scored, tmp_path):
    a, b = _frame(scored, "a"), _frame(scored, "b")
    np.testing.assert_allclose(b["score"], 2 * a["score"], rtol=1e-6)  # b is pickscore with scale=2
    out = tmp_path / "kept"
    text = f"a > {float(np.nanmedian(a['score']))!r} and b.valid and b < {float(np.nanpercentile(b['score'], 80))!r}"
    assert _cli("filter", "--dataset", str(scored / "data"), "--scores", f"a={scored / 'a'}", "--scores",
                f"b={scored / 'b'}", "--where", text, "--output", str(out), "--no-progress") == 0
    both = pd.DataFrame({"uid": a["uid"], "a": a["score"], "b": b["score"], "valid": a["valid"] & b["valid"]})
    want = both[both["valid"]].query(text.replace("b.valid", "valid"))["uid"].tolist()
    assert 0 < len(want) and _kept_uids(out) == want


def test_webdataset_filter_writes_tar_shards_with_every_member(tiny_clip_dir, tmp_path):
    samples = wds_set(tmp_path / "wds", shards=2, rows=5)
    assert _cli("score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", str(tmp_path / "wds"),
                "--output", str(tmp_path / "s"), "--no-progress") == 0
    assert _cli("filter", "--dataset", str(tmp_path / "wds"), "--scores", str(tmp_path / "s"), "--top-k", "3",
                "--output", str(tmp_path / "k"), "--no-progress") == 0
    scores = pd.concat([pq.read_table(tmp_path / "s" / f"shard-00{i}.parquet").to_pandas() for i in range(2)])
    want = scores.sort_values("score", ascending=False, kind="stable").head(3).sort_index(kind="stable")
    kept = []
    for i in range(2):
        with tarfile.open(tmp_path / "k" / f"shard-00{i}.tar") as tf:
            names = tf.getnames()
            for n in names:
                if n.endswith(".png"):
                    key = n[:-4]
                    kept.append(key)
                    src = next(s for s in samples if s["__key__"] == key)
                    assert tf.extractfile(n).read() == src["png"] and f"{key}.txt" in names
    assert sorted(kept) == sorted(want["id"].tolist())


def test_hf_dataset_filter_saves_to_disk(tiny_clip_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    imgs = [Image.open(io.BytesIO(png_bytes(900 + i))).convert("RGB") for i in range(6)]
    ds = datasets.Dataset.from_dict({"image": imgs, "prompt": ["p", "q"] * 3, "key": list("abcdef")},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "prompt": datasets.Value("string"),
                                                                "key": datasets.Value("string")}))
    ds.save_to_disk(str(tmp_path / "hf"))
    assert _cli("score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", str(tmp_path / "hf"),
                "--output", str(tmp_path / "s"), "--id-column", "key", "--no-progress") == 0
    assert _cli("filter", "--dataset", str(tmp_path / "hf"), "--scores", str(tmp_path / "s"), "--top-k", "1",
                "--group-by", "prompt", "--output", str(tmp_path / "k"), "--no-progress") == 0
    scores = pq.read_table(tmp_path / "s" / "shard-00000-of-00001.parquet").to_pandas()
    scores["prompt"] = ["p", "q"] * 3
    want = scores.sort_values("score", ascending=False, kind="stable").groupby("prompt").head(1)
    kept = datasets.load_from_disk(str(tmp_path / "k" / "data"))
    assert sorted(kept["key"]) == sorted(want["id"]) and len(kept) == 2
    assert kept.features["image"] == datasets.Image()


def test_expressions_parse_without_eval():
    from rewardkit.commands import UsageError
    from rewardkit.datasets import parse_expression

    cols = {"score": np.array([1.0, 5.0, np.nan, 7.0]), "valid": np.array([True, True, False, True]),
            "p": np.array(["a", "b", "a", "b"], dtype=object)}
    ev = lambda t: parse_expression(t).evaluate(cols).tolist()  # noqa: E731
    assert ev("score >= 5") == [False, True, False, True]           # NaN compares false
    assert ev("2 < score <= 7 and p == 'b'") == [False, True, False, True]
    assert ev("not valid or score < 2") == [True, False, True, False]
    assert ev("score > 1 or score < 2 and p == 'b'") == [False, True, False, True]  # and binds tighter
    assert ev("-score * 2 + 1 <= -9") == [False, True, False, True]
    assert parse_expression("`dim_a b` > 1 and x.y < 2").columns == ["dim_a b", "x.y"]
    for bad in ("__import__('os').system('x')", "score >", "score >= 5 and", "(score > 1", "score; 1", "score + 1"):
        with pytest.raises(UsageError):
            parse_expression(bad).evaluate(cols)


def test_expression_constants_keywords_and_messages():
    """What the first mutation run of datasets/expr left (issue 39 item 5), expected values by hand: a constant
    condition covers every row (or the rows in play; none without columns), before: ``len(None)`` without
    ``rows``; ``true`` consumes one token (``true and ...`` parses); only ``or`` continues an ``or`` chain and only
    ``(`` opens a group (``score > 1 not score > 2`` and ``score > * 3`` are refused where they stop making sense);
    each refusal names what was expected, and where."""
    import re

    from rewardkit.commands import UsageError
    from rewardkit.datasets import parse_expression

    assert parse_expression("true").evaluate({"score": np.zeros(3)}).tolist() == [True, True, True]
    assert parse_expression("1 > 2").evaluate({"score": np.zeros(2)}, rows=np.array([0])).tolist() == [False]
    assert parse_expression("true").evaluate({}).tolist() == []
    cols = {"score": np.array([1.0, 3.0]), "valid": np.array([True, True])}
    assert parse_expression("valid == true and score > 2").evaluate(cols).tolist() == [False, True]
    refusals = {
        "score > * 3": "expected a number, a column or '(' at '*' (character 8)",
        "(score > 1": "expected ')' at the end",
        "score > 1 not score > 2": "expected an operator, 'and' or 'or' at 'not' (character 10)",
        "score > 1 2": "expected an operator, 'and' or 'or' at 2.0 (character 10)",
    }
    for text, why in refusals.items():
        with pytest.raises(UsageError, match=re.escape(f"expression {text!r}: {why}") + "$"):
            parse_expression(text)
    with pytest.raises(UsageError, match=re.escape("expression 'p > 3': cannot compare str 'a' > float 3.0 "
                                                   "(text is ordered only against text)") + "$"):
        parse_expression("p > 3").evaluate({"p": np.array(["a"], dtype=object)})


# ----------------------------------------------------------------------------- issue 36 item 6, issue 39 item 4
def test_chained_comparisons_keep_both_bounds():
    """Bug it catches: a chain ``a < x <= b`` reduced to its last comparison (``x <= b``) or its first. The
    expected rows are written by hand, then checked against pandas' query, the documented meaning."""
    from rewardkit.datasets import parse_expression

    x = np.arange(7, dtype=np.float64)
    df = pd.DataFrame({"x": x})
    cases = {"1 < x <= 4": [2, 3, 4], "4 >= x > 1": [2, 3, 4], "0 < x < 5 < 6": [1, 2, 3, 4],
             "0 < x < 5 < 4": [], "2 <= x != 3 < 6": [2, 4, 5, 6]}
    for text, rows in cases.items():
        got = np.flatnonzero(parse_expression(text).evaluate({"x": x})).tolist()
        assert got == rows, text
        assert df.query(text).index.tolist() == rows, text


def test_nulls_and_text_compare_as_pandas_query_does():
    """Bug: ``prompt > 'a'`` over a null raised TypeError ("internal error", exit 1). Null semantics now equal
    pandas' query (pandas 3: ``==`` and orderings false on a null, ``!=`` true; text never equals a number)."""
    from rewardkit.commands import UsageError
    from rewardkit.datasets import parse_expression

    p = np.array(["a", None, "c", None, "b"], dtype=object)
    s = np.array([1.0, np.nan, 3.0, 4.0, 2.0])
    df = pd.DataFrame({"p": pd.Series(list(p), dtype=object), "s": s})
    for text in ("p == 'a'", "p != 'a'", "p > 'a'", "p <= 'b'", "not (p > 'a')", "s > 1 and p != 'c'",
                 "p == 5", "p != 5", "'b' < p or s >= 4", "p == p", "p != p"):
        got = np.flatnonzero(parse_expression(text).evaluate({"p": p, "s": s})).tolist()
        assert got == df.query(text).index.tolist(), text
    for text, why in (("s > 'a'", "cannot compare"), ("p + 1 > 2", "not a number")):
        with pytest.raises(TypeError):
            df.query(text)  # pandas refuses these too
        with pytest.raises(UsageError, match=why):
            parse_expression(text).evaluate({"p": p, "s": s})


@pytest.fixture(scope="module")
def nulls_scored(tiny_clip_dir, tmp_path_factory):
    """4 rows, the last one with neither image nor prompt (invalid when scored)."""
    root = tmp_path_factory.mktemp("nulls")
    (root / "data").mkdir()
    recs = [{"uid": i, "image": png_bytes(900 + i), "prompt": p} for i, p in enumerate(["b cat", "a dog", "c cow"])]
    recs.append({"uid": 3, "image": None, "prompt": None})
    pq.write_table(pa.Table.from_pylist(recs), root / "data" / "p.parquet")
    assert _cli("score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", str(root / "data"), "--output",
                str(root / "s"), "--no-progress") == 3
    return root


def test_where_never_sees_dropped_rows_and_bad_expressions_exit_2(nulls_scored, tmp_path, capsys):
    """Bugs: the expression ran on invalid rows too, so a text comparison over their null prompt ended in
    "internal error" exit 1; an empty --where kept every row with exit 0; a type mismatch or deep nesting gave
    exit 1. Now: exit 0 with pandas' rows, or exit 2 with the reason."""
    base = ["filter", "--dataset", str(nulls_scored / "data"), "--scores", str(nulls_scored / "s"), "--no-progress"]
    assert _cli(*base, "--where", "prompt > 'a dog'", "--output", str(tmp_path / "k")) == 0
    assert _kept_uids(tmp_path / "k") == [0, 2]  # "b cat", "c cow" (the null row is invalid: never compared)
    for where, why in (("", "--where is empty"), ("   ", "--where is empty"),
                       ("score > 'a'", "cannot compare float"), ("prompt * 2 > 1", "not a number"),
                       ("(" * 80 + "score > 0" + ")" * 80, "nested more than"),
                       ("not " * 80 + "score > 0", "nested more than"),
                       (" and ".join(["score > 0"] * 3000), "too long a chain")):
        capsys.readouterr()
        assert _cli(*base, "--where", where, "--output", str(tmp_path / "x")) == 2, where[:40]
        assert why in capsys.readouterr().err, where[:40]


def test_group_by_holds_only_the_columns_it_needs(scored):
    """Bug: ``--group-by`` held every score column, every id, row number and shard name per row, the group
    values as Python objects (338 bytes a row by benchmarks/dataset_scoring.py --filter-only, now 40): only
    validity and the named columns are loaded now, and rows per shard come from the files' footers."""
    from rewardkit.datasets.filtering import _load_scores
    from rewardkit.datasets.sources import open_dataset

    ds = open_dataset(str(scored / "data"))
    cols, valids, _, sizes, left_out = _load_scores(str(scored / "a"), ds, {"score"})
    assert sorted(cols) == ["score", "valid"] and valids == ["valid"] and left_out == set()
    assert sizes == {"part-0": 8, "part-1": 8, "part-2": 8}
    assert cols["score"].dtype == np.float64 and len(cols["score"]) == 24
