"""End-to-end tests of the accuracy harness on synthetic parquet fixtures with the real schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rewardkit.judges.policy import JUDGE_FAILURE_PREFIX
import torch

from rewardkit import media
from rewardkit.bench import evaluate
from rewardkit.bench.data import BenchDataError, load_comparisons
from rewardkit.bench.spec import get_spec, list_benchmarks
from rewardkit.bench.synthetic import SYNTHETIC_LAYOUT, write_synthetic_benchmarks
from rewardkit.reward import PairwiseOutput, Reward, RewardBatch, RewardOutput

from tests.helpers.bench_rewards import MeanPixel, brightness as _brightness

ALL = ",".join(SYNTHETIC_LAYOUT)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bench-data")
    write_synthetic_benchmarks(root)
    return root


# ------------------------------------------------------------------ test rewards (deterministic functions)
class PromptFreeMeanPixel(MeanPixel):
    name = "test-meanpixel-noprompt"
    uses_prompt = False


class Constant(Reward):
    name = "test-constant"
    tasks = frozenset({"t2i", "edit"})

    def _score(self, batch: RewardBatch) -> RewardOutput:
        return RewardOutput(scores=torch.zeros(len(batch)))


class FirstPositionJudge(MeanPixel):
    """A pairwise judge that always prefers whatever is shown first."""

    name = "test-first-position"

    def compare(self, images_a, images_b, prompt=None, *, sources=None, metadata=None, batch_size=None,
                on_error="raise"):
        n = len(media.split_batch(images_a))
        return PairwiseOutput(prob_a=torch.full((n,), 0.8))


class PairwiseMeanPixel(MeanPixel):
    """A pairwise judge consistent with MeanPixel: P(a) = sigmoid(20 (b_a - b_b))."""

    name = "test-pairwise-meanpixel"

    def compare(self, images_a, images_b, prompt=None, *, sources=None, metadata=None, batch_size=None,
                on_error="raise"):
        a = torch.tensor([_brightness(media.to_pil(x)) for x in images_a])
        b = torch.tensor([_brightness(media.to_pil(x)) for x in images_b])
        return PairwiseOutput(prob_a=torch.sigmoid(20 * (a - b)))


class TieJudge(MeanPixel):
    """Answers GenAI-Bench's 4-way question with "A=B" (both tie kinds) except every 5th pair (unparsed)."""

    name = "test-tie-judge"

    def judge_4way(self, images_a, images_b, prompts, *, sources=None):
        self.seen = getattr(self, "seen", 0)
        out = []
        for _ in images_a:
            out.append(None if self.seen % 5 == 4 else "[[A=B]]")
            self.seen += 1
        return out


def _run(reward, benches, data_root, tmp_path=None, **kw):
    kw.setdefault("n_boot", 0)
    kw.setdefault("progress", False)
    return evaluate(reward, benches, data_dir=data_root, cache_dir=kw.pop("cache_dir", None), **kw)


# ------------------------------------------------------------------ specs and data
def test_every_spec_parses_and_is_versioned():
    names = list_benchmarks()
    assert set(SYNTHETIC_LAYOUT) <= set(names)
    for n in names:
        s = get_spec(n)
        assert s.version and s.dataset and s.split and s.primary[0] in s.metrics
    assert get_spec("genaibench/image_edition").name == "genaibench/edit"
    assert get_spec("editreward").name == "editreward/2pair"
    with pytest.raises(Exception, match="Did you mean"):
        get_spec("mmrb/t2i")


def test_user_spec_file_and_data_dir_arguments(tmp_path, data_root):
    from rewardkit.bench.spec import SPEC_DIR
    from rewardkit.commands.bench import _data_dir
    from rewardkit.errors import ConfigError

    text = (SPEC_DIR / "mmrb2_t2i.yaml").read_text().replace("name: mmrb2/t2i", "name: my/t2i")
    (tmp_path / "my.yaml").write_text(text.replace('version: "1.0"', 'version: "7"'))
    res = evaluate(MeanPixel(), [str(tmp_path / "my.yaml")], data_dir={"my/t2i": data_root / "mmrb2"},
                   cache_dir=None, n_boot=0, progress=False)
    assert res["my/t2i"].spec["version"] == "7" and res["my/t2i"].counts["n_comparisons"] == 24
    (tmp_path / "bad.yaml").write_text(text.replace("label: chosen_ab", "label: chosen"))
    with pytest.raises(ConfigError, match="label must be one of"):
        get_spec(str(tmp_path / "bad.yaml"))
    assert _data_dir(["/d"]) == "/d" and _data_dir(None) is None
    assert _data_dir(["mmrb2=/a", "genaibench/t2i=/b.parquet"]) == {"mmrb2": "/a", "genaibench/t2i": "/b.parquet"}


def test_synthetic_files_have_the_hub_schema(data_root):
    import pyarrow.parquet as pq

    mm = pq.read_schema(data_root / SYNTHETIC_LAYOUT["mmrb2/edit"])
    assert mm.field("prompt_images").type.value_type.names == ["bytes", "path"]
    assert str(mm.field("human_annotations").type) == "string"  # JSON strings, as on the hub
    assert b"huggingface" in mm.metadata  # datasets' feature metadata travels with the file
    er = pq.read_schema(data_root / SYNTHETIC_LAYOUT["editreward/3pair"])
    assert er.field("candidate_1").type.names == ["bytes", "path"]
    assert str(er.field("num_candidates").type) == "int64"


def test_load_local_layouts(data_root):
    spec = get_spec("mmrb2/edit")
    rows, info = load_comparisons(spec, data_root / "mmrb2")
    assert len(rows) == 24 and info["source"] == "local" and info["files"] == ["edit/test-00000-of-00001.parquet"]
    assert "<image_" not in rows[0].prompt and rows[0].prompt == "edit number 0"
    assert [len(r.sources) for r in rows[:4]] == [1, 1, 1, 2]
    single, _ = load_comparisons(spec, data_root / SYNTHETIC_LAYOUT["mmrb2/edit"], limit=5)
    assert [r.item_id for r in single] == [r.item_id for r in rows[:5]]
    g, _ = load_comparisons(get_spec("editreward/4pair"), data_root / "editreward")
    assert len(g) == 36 and len({r.group_id for r in g}) == 6
    g2, _ = load_comparisons(get_spec("editreward/4pair"), data_root / "editreward", limit=2)
    assert len(g2) == 12 and len({r.group_id for r in g2}) == 2  # whole groups


def test_load_filters_by_dataset_column(tmp_path, data_root):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t2 = pq.read_table(data_root / SYNTHETIC_LAYOUT["editreward/2pair"])
    t3 = pq.read_table(data_root / SYNTHETIC_LAYOUT["editreward/3pair"])
    pq.write_table(pa.concat_tables([t2, t3]), tmp_path / "all.parquet")  # the hub's default config mixes K
    rows, _ = load_comparisons(get_spec("editreward/3pair"), tmp_path / "all.parquet")
    assert len(rows) == 18 and {r.extra["num_candidates"] for r in rows} == {3}


def test_hub_path_through_datasets(data_root, tmp_path, monkeypatch):
    """The hub branch (datasets.load_dataset + raw image structs) on a local folder standing in for a repo."""
    import dataclasses

    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    spec = dataclasses.replace(get_spec("editreward/3pair"), dataset=str(data_root / "editreward"))
    rows, info = load_comparisons(spec)
    local, _ = load_comparisons(get_spec("editreward/3pair"), data_root / "editreward")
    assert info["source"] == "hub" and len(rows) == 18
    assert [(r.hash_a, r.hash_b, r.label, r.group_id) for r in rows] == \
        [(r.hash_a, r.hash_b, r.label, r.group_id) for r in local]


def test_load_save_to_disk_folder(data_root, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    ds = datasets.Dataset.from_parquet(str(data_root / SYNTHETIC_LAYOUT["genaibench/edit"]))
    ds.save_to_disk(str(tmp_path / "saved"))
    rows, info = load_comparisons(get_spec("genaibench/edit"), tmp_path / "saved")
    ref, _ = load_comparisons(get_spec("genaibench/edit"), data_root / "genaibench")
    assert info["source"] == "save_to_disk"
    assert [(r.hash_a, r.source_hashes, r.raw_label) for r in rows] == [(r.hash_a, r.source_hashes, r.raw_label) for r in ref]


def test_load_errors_are_actionable(tmp_path, data_root):
    with pytest.raises(BenchDataError, match="does not exist"):
        load_comparisons(get_spec("mmrb2/t2i"), tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchDataError, match="hf download"):
        load_comparisons(get_spec("mmrb2/t2i"), tmp_path / "empty")
    with pytest.raises(BenchDataError, match="columns"):
        load_comparisons(get_spec("mmrb2/t2i"), data_root / SYNTHETIC_LAYOUT["genaibench/t2i"])


def test_hub_errors_name_the_fix(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def gated(*a, **k):
        raise FileNotFoundError("Dataset 'TIGER-Lab/EditReward-Bench' is a gated dataset on the Hub. "
                                "You must be authenticated to access it.")

    monkeypatch.setattr(datasets, "load_dataset", gated)
    with pytest.raises(BenchDataError, match="(?i)accept its terms") as exc:
        load_comparisons(get_spec("editreward/2pair"))
    assert "hf auth login" in str(exc.value) and "--data-dir" in str(exc.value)

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'rl-research/multimodal-rewardbench-2' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(BenchDataError, match="cannot reach the hub"):
        load_comparisons(get_spec("mmrb2/t2i"))


# ------------------------------------------------------------------ scalar rewards
def test_constant_reward_on_known_label_distribution(data_root):
    res = _run(Constant(), ALL, data_root)
    # MMRB2: every answer is a tie -> wrong under the official rule
    assert res["mmrb2/t2i"].metrics["mmrb2_official"].value == 0.0
    # GenAI-Bench synthetic votes cycle left/right/tie/bothbad: half are human ties
    g = res["genaibench/t2i"].metrics
    assert g["accuracy_without_ties"].value == 0.0 and g["accuracy_without_ties"].n == 12
    assert g["accuracy_without_ties"].extra["half_credit"] == 0.5
    assert g["accuracy_with_ties"].value == 0.5 and g["accuracy_with_ties"].extra["threshold"] == 0.0
    # EditReward K=2 cycles A>B, B>A, A=B: one third ties
    assert res["editreward/2pair"].metrics["accuracy_with_ties"].value == pytest.approx(1 / 3)
    assert res["editreward/3pair"].metrics["group_accuracy"].value == 0.0
    assert res["genaibench/t2i"].counts["labels"] == {"a": 6, "b": 6, "tie_bad": 6, "tie_good": 6}
    assert "genaibench_4way" in res["genaibench/t2i"].unavailable
    assert list(_run(Constant(), "mmrb2,mmrb2/t2i", data_root).benchmarks) == ["mmrb2/t2i"]  # alias de-duplicated


def test_scalar_reward_scores_each_sample_once(data_root):
    r = PromptFreeMeanPixel()
    res = _run(r, "editreward/3pair,editreward/4pair", data_root)
    # K=3: 6 groups x 3 candidates, K=4: 6 groups x 4 candidates (rows are C(K,2) per group)
    assert res["editreward/3pair"].counts["n_unique_samples"] == 18
    assert res["editreward/4pair"].counts["n_unique_samples"] == 24
    # the synthetic K=4 groups reuse the K=3 groups' first three candidates and sources: shared across
    # benchmarks too, so only the 6 fourth candidates are new
    assert r.n_scored == 18 + 6
    # MMRB2 t2i: candidate i is A of pair i and B of pair i-1, one prompt per pair -> no sharing with prompts
    r2 = MeanPixel()
    res2 = _run(r2, "mmrb2/t2i", data_root)
    assert res2["mmrb2/t2i"].counts["n_unique_samples"] == 48 and r2.n_scored == 48


def test_sources_policy_and_multi_source_pairs(data_root):
    from rewardkit.rewards.clipscore import CLIPScore

    class T2IOnly(Constant):
        name = "test-t2i-only"
        tasks = frozenset({"t2i"})

    res = _run(T2IOnly(), "mmrb2/edit,genaibench/t2i", data_root)
    assert res["mmrb2/edit"].skipped and "ignore_sources" in res["mmrb2/edit"].skipped
    assert res["genaibench/t2i"].skipped is None
    res = _run(T2IOnly(), "mmrb2/edit", data_root, ignore_sources=True)
    assert res["mmrb2/edit"].skipped is None
    # MeanPixel takes one source image: the 6 two-source pairs are unanswerable (missing, not wrong)
    res = _run(MeanPixel(), "mmrb2/edit", data_root)
    b = res["mmrb2/edit"]
    assert b.metrics["mmrb2_official"].n == 2 * 18 and b.metrics["mmrb2_official"].extra["n_missing"] == 12
    assert b.counts["n_single_source"] == 18
    assert b.subsets["single_source"]["mmrb2_official"].n == 36
    assert b.subsets["single_source"]["mmrb2_official"].value == b.metrics["mmrb2_official"].value
    assert "source images given" in next(iter(b.counts["invalid_reasons"]))
    assert set(b.categories["prompt_source"]) == {"dreambench", "emu-edit", "new_synthetic_edit"}
    assert CLIPScore.tasks == frozenset({"t2i"})


def test_lower_is_better_flips_margins(data_root):
    class Dark(MeanPixel):
        name = "test-dark"
        higher_is_better = False

    up = _run(MeanPixel(), "mmrb2/t2i", data_root, per_sample=True)["mmrb2/t2i"]
    down = _run(Dark(), "mmrb2/t2i", data_root, per_sample=True)["mmrb2/t2i"]
    assert up.metrics["mmrb2_official"].value + down.metrics["mmrb2_official"].value == pytest.approx(1.0)
    assert [s["margin"] for s in up.samples] == pytest.approx([-s["margin"] for s in down.samples])


# ------------------------------------------------------------------ pairwise judges
def test_first_position_judge_is_cancelled_by_the_swap(data_root):
    res = _run(FirstPositionJudge(), "mmrb2/t2i", data_root)
    m = res["mmrb2/t2i"].metrics
    assert res.reward["mode"] == "pairwise"
    assert m["mmrb2_official"].value == 0.5  # "A" forward, "A" on the swapped pair
    assert m["order_agreement"].value == 0.0
    assert m["single_order_accuracy"].value == pytest.approx(16 / 24)  # 2/3 of synthetic pairs chose A
    assert m["accuracy_without_ties"].extra["n_model_ties"] == 24  # the swap-averaged margin is 0


def test_consistent_judge_matches_its_scalar_twin(data_root):
    pair = _run(PairwiseMeanPixel(), "mmrb2/t2i,genaibench/t2i", data_root)
    scal = _run(MeanPixel(), "mmrb2/t2i,genaibench/t2i", data_root)
    for b in ("mmrb2/t2i", "genaibench/t2i"):
        for name in ("mmrb2_official", "accuracy_without_ties"):
            if name in scal[b].metrics:
                assert pair[b].metrics[name].value == pytest.approx(scal[b].metrics[name].value)
        assert pair[b].metrics["order_agreement"].value == 1.0
    assert pair["mmrb2/t2i"].counts["n_unique_pairs"] == 48  # both orders of 24 pairs


def test_symmetric_judge_is_asked_once_per_pair(data_root):
    class Symmetric(PairwiseMeanPixel):
        name = "test-symmetric"
        compare_is_symmetric = True

        def compare(self, images_a, images_b, *a, **k):
            self.n_compared = getattr(self, "n_compared", 0) + len(images_a)
            return super().compare(images_a, images_b, *a, **k)

    r = Symmetric()
    res = _run(r, "mmrb2/t2i", data_root)
    ref = _run(PairwiseMeanPixel(), "mmrb2/t2i", data_root)
    assert res["mmrb2/t2i"].counts["n_unique_pairs"] == 24 and r.n_compared == 1 + 24  # probe + one per pair
    assert res["mmrb2/t2i"].metrics["mmrb2_official"].value == ref["mmrb2/t2i"].metrics["mmrb2_official"].value


def test_auto_mode_keeps_score_derived_compare_scalar(data_root):
    class Tempered(MeanPixel):
        name = "test-tempered"

        def compare(self, *a, **k):  # overridden, but still derived from scores (fills scores_a / scores_b)
            return super().compare(*a, **k)

    r = Tempered()
    res = _run(r, "mmrb2/t2i", data_root)
    assert res.reward["mode"] == "scalar" and "derived from scores" in res.reward["mode_reason"]
    assert r.n_scored == 2 + 48  # the probe pair, then each image once
    assert _run(FirstPositionJudge(), "mmrb2/t2i", data_root).reward["mode_reason"].startswith("compare() is native")
    assert _run(Tempered(), "mmrb2/t2i", data_root, mode="pairwise").reward["mode"] == "pairwise"


def test_four_way_judge(data_root):
    res = _run(TieJudge(), "genaibench/t2i", data_root, mode="scalar")
    m = res["genaibench/t2i"].metrics["genaibench_4way"]
    # "A=B" is right on the 12 tie / both-bad rows; rows 4, 9, 14, 19 are unparsed (wrong, still counted)
    # of which 14 is tievote (14 % 4 == 2) and 19 is bothbad (19 % 4 == 3): 12 - 2 = 10 right
    assert m.n == 24 and m.extra["n_unparsed"] == 4
    assert m.value == pytest.approx(10 / 24)
    assert res["genaibench/t2i"].primary == "genaibench_4way"


class FlakyFourWay(MeanPixel):
    """4-way judge. ``flaky``: the 1st and 3rd pairs it is asked about fail (a failed judge call, reported through
    ``reasons``) and the 2nd gets an unparsed answer; otherwise every pair is answered "[[A=B]]"."""

    name = "test-flaky-four-way"

    def __init__(self, flaky: bool):
        super().__init__()
        self.flaky, self.asked = flaky, 0

    def judge_4way(self, images_a, images_b, prompts, *, sources=None, reasons=None):
        why = []
        for _ in images_a:
            k = self.asked
            self.asked += 1
            bad = self.flaky and k in (0, 1, 2)
            why.append((JUDGE_FAILURE_PREFIX + ": HTTP 503" if k != 1 else "unparsed") if bad else None)
        reasons[:] = why
        return [None if w else "[[A=B]]" for w in why]


def test_four_way_judge_failures_are_not_cached(tmp_path, data_root):
    """A 4-way verdict missing because the judge call failed is reported invalid and asked again next run; an
    unparsed answer is a (wrong) answer and is cached."""
    cache = tmp_path / "cache"
    r = FlakyFourWay(flaky=True)
    first = _run(r, "genaibench/t2i", data_root, mode="scalar", cache_dir=cache)
    assert r.asked == 24 and first["genaibench/t2i"].metrics["genaibench_4way"].extra["n_unparsed"] == 3
    r2 = FlakyFourWay(flaky=False)
    second = _run(r2, "genaibench/t2i", data_root, mode="scalar", cache_dir=cache)
    assert r2.asked == 2                                      # only the two failed pairs were asked again
    assert second["genaibench/t2i"].metrics["genaibench_4way"].extra["n_unparsed"] == 1


# ------------------------------------------------------------------ cache and resume
def test_resume_after_interrupt_gives_the_same_result(tmp_path, data_root):
    benches = "mmrb2/t2i,genaibench/edit,editreward/3pair"
    ref = _run(MeanPixel(), benches, data_root, n_boot=50)
    r = MeanPixel()
    r.fail_after_calls = 3
    with pytest.raises(KeyboardInterrupt):
        _run(r, benches, data_root, cache_dir=tmp_path / "cache", batch_size=8, n_boot=50)
    assert r.n_scored == 24  # three committed chunks of 8
    r2 = MeanPixel()
    res = _run(r2, benches, data_root, cache_dir=tmp_path / "cache", batch_size=8, n_boot=50)
    total = sum(b.counts["n_unique_samples"] for b in ref.benchmarks.values())
    assert r2.n_scored == total - 24
    assert json.dumps({k: v.to_dict()["metrics"] for k, v in res.benchmarks.items()}, sort_keys=True) == \
        json.dumps({k: v.to_dict()["metrics"] for k, v in ref.benchmarks.items()}, sort_keys=True)
    # a re-run (e.g. to add a metric) scores nothing
    r3 = MeanPixel()
    _run(r3, benches, data_root, cache_dir=tmp_path / "cache", batch_size=8)
    assert r3.n_scored == 0


def test_group_rule_mismatch_warns(tmp_path, data_root):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(data_root / SYNTHETIC_LAYOUT["editreward/3pair"])
    ids = pc.replace_substring_regex(t["id"], "_", "-")  # no "_": every row becomes its own group
    pq.write_table(t.set_column(t.column_names.index("id"), "id", ids), tmp_path / "x.parquet")
    with pytest.warns(UserWarning, match="C\\(K,2\\)"):
        res = evaluate(MeanPixel(), "editreward/3pair", data_dir={"editreward": tmp_path / "x.parquet"},
                       cache_dir=None, n_boot=0, progress=False)
    assert res["editreward/3pair"].counts["warnings"]


def test_cache_is_keyed_by_config(tmp_path, data_root):
    from dataclasses import dataclass

    from rewardkit.reward import RewardConfig

    @dataclass
    class Cfg(RewardConfig):
        gain: float = 1.0

    class Scaled(MeanPixel):
        name = "test-scaled"
        Config = Cfg

        def _score(self, batch):
            out = super()._score(batch)
            return RewardOutput(scores=out.scores * self.config.gain)

    a = Scaled(gain=1.0)
    _run(a, "genaibench/t2i", data_root, cache_dir=tmp_path)
    b = Scaled(gain=-1.0)
    res = _run(b, "genaibench/t2i", data_root, cache_dir=tmp_path)
    assert b.n_scored == a.n_scored > 0  # another config is another cache
    # the cached run's value is b's own (same as an uncached run), not a's
    fresh = _run(Scaled(gain=-1.0), "genaibench/t2i", data_root, cache_dir=None)
    first = _run(Scaled(gain=1.0), "genaibench/t2i", data_root, cache_dir=None)
    got = res["genaibench/t2i"].metrics["accuracy_without_ties"].value
    assert got == fresh["genaibench/t2i"].metrics["accuracy_without_ties"].value
    assert got != first["genaibench/t2i"].metrics["accuracy_without_ties"].value
    # and a second call with a's config is served from the cache: nothing re-scored, same value
    again = Scaled(gain=1.0)
    cached = _run(again, "genaibench/t2i", data_root, cache_dir=tmp_path)
    assert again.n_scored == 0
    assert cached["genaibench/t2i"].metrics["accuracy_without_ties"].value == \
        first["genaibench/t2i"].metrics["accuracy_without_ties"].value


# ------------------------------------------------------------------ built-in rewards: stored values
@pytest.mark.parametrize("name,kwargs,thresholds", [
    ("clipscore", {"convention": "cosine"}, {"genaibench/t2i": 0.0806009, "editreward/2pair": 0.0492033}),
    ("pickscore", {}, {"genaibench/t2i": 1.1513719, "editreward/2pair": 0.7028623}),
])
def test_builtin_rewards_stored_values(name, kwargs, thresholds, data_root, tiny_clip_dir):
    from rewardkit.registry import load_reward

    reward = load_reward(name, model=str(tiny_clip_dir), device="cpu", **kwargs)
    res = _run(reward, ALL, data_root, ignore_sources=True)
    got = {b: round(r.value, 6) for b, r in res.benchmarks.items()}
    # REGRESSION PIN (self-generated, not independent): the tiny CLIP is random (seed 0), so these values were
    # produced by rewardkit itself; they detect a change in the pipeline, not correctness (the metric
    # functions have hand-computed tests in bench/test_metrics.py)
    assert got == {"mmrb2/t2i": 0.583333, "mmrb2/edit": 0.416667, "genaibench/t2i": 0.416667,
                   "genaibench/edit": 0.416667, "editreward/2pair": 0.583333, "editreward/3pair": 0.0,
                   "editreward/4pair": 0.0}
    for b, eps in thresholds.items():
        assert res[b].metrics["accuracy_with_ties"].extra["threshold"] == pytest.approx(eps, rel=1e-4)


# ------------------------------------------------------------------ records, CLI, imports
def test_record_contents(tmp_path, data_root):
    res = _run(MeanPixel(), "mmrb2/t2i,editreward/4pair", data_root, n_boot=100, per_sample=True,
               by=["model_a", "prompt_metadata.category", "dataset"])
    rec = json.loads(res.save(tmp_path / "r.json").read_text())
    assert rec["schema"] == "rewardkit.bench.result/1"
    assert rec["rewardkit_version"] and "git_hash" in rec
    assert rec["reward"]["name"] == "test-meanpixel" and rec["reward"]["mode"] == "scalar"
    b = rec["benchmarks"]["editreward/4pair"]
    assert b["spec"]["version"] == "1.0" and b["spec"]["dataset"] == "TIGER-Lab/EditReward-Bench"
    assert b["counts"]["n_comparisons"] == 36 and b["counts"]["n_groups"] == 6
    assert b["counts"]["warnings"] == []
    g = b["metrics"]["group_accuracy"]
    assert g["ci95"][0] <= g["value"] <= g["ci95"][1]
    assert len(b["samples"]) == 36 and {"score_a", "margin", "forward"} <= set(b["samples"][0])
    cats = rec["benchmarks"]["mmrb2/t2i"]["categories"]
    assert set(cats) == {"prompt_source", "model_a", "prompt_metadata.category", "dataset"}
    assert list(cats["prompt_metadata.category"]) == ["synthetic"]  # a key inside a JSON-string column
    assert list(cats["dataset"]) == ["<none>"]  # no such column in MMRB2
    assert list(b["categories"]["dataset"]) == ["4pair"]  # any scalar column of the data
    md = res.markdown()
    assert "| mmrb2/t2i |" in md and "group_accuracy" in md


def test_cli_bench_and_report(tmp_path, data_root, tiny_clip_dir, capsys):
    from rewardkit.cli import main

    out = tmp_path / "out"
    rc = main(["bench", "--reward", "clipscore", "--model", str(tiny_clip_dir), "--set", "convention=cosine",
               "--benchmark", "mmrb2/t2i,genaibench/edit", "--data-dir", str(data_root), "--ignore-sources",
               "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out), "--bootstrap", "50",
               "--no-progress", "--device", "cpu"])
    assert rc == 0
    (rec_path,) = out.glob("*.json")
    stem = rec_path.stem  # <reward>-<model dir>-<config fingerprint>
    rec = json.loads(rec_path.read_text())
    assert stem == f"clipscore-{tiny_clip_dir.name}-{rec['reward']['fingerprint'][:8]}"
    assert rec["benchmarks"]["mmrb2/t2i"]["metrics"]["mmrb2_official"]["value"] == pytest.approx(0.583333, abs=1e-6)
    assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| clipscore" in (out / f"{stem}.md").read_text()
    capsys.readouterr()
    rc = main(["bench", "--report", str(out / f"{stem}.json"), str(out / f"{stem}.json"),
               "--plot", str(tmp_path / "cmp.png")])
    assert rc == 0 and (tmp_path / "cmp.png").is_file()
    assert "mmrb2_official" in capsys.readouterr().out
    assert main(["bench", "--list"]) == 0
    assert "editreward/4pair" in capsys.readouterr().out
    assert main(["bench", "--reward", "clipscore", "--benchmark", "mmrb2/t2i", "--data-dir",
                 str(tmp_path / "missing"), "--model", str(tiny_clip_dir), "--no-cache", "--device", "cpu",
                 "--output-dir", str(out)]) == 2


# the bench modules' import weight is checked in test_imports.py (one subprocess for every stage)


def test_failed_judge_calls_are_reported_but_never_cached(tmp_path, data_root):
    """A judge call that failed (server down) is not an answer: the run reports it invalid, a re-run asks
    again; an invalid answer the judge did give is cached like any score."""
    from rewardkit.judges.policy import JUDGE_FAILURE_PREFIX

    class FlakyJudge(MeanPixel):
        name = "test-flaky-judge"
        down = True

        def _score(self, batch):
            self.n_scored += len(batch)
            if self.down:
                return RewardOutput(scores=torch.full((len(batch),), float("nan")),
                                    errors=[f"{JUDGE_FAILURE_PREFIX}: connection refused"] * len(batch))
            return RewardOutput(scores=torch.tensor([_brightness(im) for im in batch.images]))

    first = FlakyJudge()
    _run(first, "genaibench/t2i", data_root, cache_dir=tmp_path)
    assert first.n_scored > 0
    again = FlakyJudge()
    again.down = False
    res = _run(again, "genaibench/t2i", data_root, cache_dir=tmp_path)
    assert again.n_scored == first.n_scored  # nothing of the failed run was reused
    assert res["genaibench/t2i"].metrics["accuracy_without_ties"].value is not None
    third = FlakyJudge()
    third.down = False
    _run(third, "genaibench/t2i", data_root, cache_dir=tmp_path)
    assert third.n_scored == 0  # real answers are cached


def test_record_keeps_the_most_confident_wrong_pairs_with_thumbnails(data_root, tmp_path):
    import base64
    import io
    import json

    from PIL import Image

    from rewardkit.view.images import thumbnail_data_uri

    res = _run(MeanPixel(), "genaibench/t2i,mmrb2/t2i", data_root, per_sample=True, wrong_examples=3)
    for name in ("genaibench/t2i", "mmrb2/t2i"):
        b = res[name]
        m = b.metrics["accuracy_without_ties"] if "accuracy_without_ties" in b.metrics else None
        # independently of the harness's rule: human preference, scores disagree with it (a tie is wrong)
        wrong = [s for s in b.samples if s["label"] != 0 and s["score_a"] is not None
                 and (s["score_a"] > s["score_b"]) - (s["score_a"] < s["score_b"]) != s["label"]]
        assert b.wrong_pairs["n_wrong"] == len(wrong) > 0
        if m is not None:
            assert len(wrong) == m.n - round(m.value * m.n)
        margins = [abs(s["score_a"] - s["score_b"]) for s in wrong]
        shown = b.wrong_pairs["pairs"]
        assert len(shown) == 3
        assert [abs(p["margin"]) for p in shown] == pytest.approx(sorted(margins, reverse=True)[:3])
        rows, _ = load_comparisons(get_spec(name), data_root / SYNTHETIC_LAYOUT[name])
        by_id = {c.item_id: c for c in rows}
        for p in shown:
            c = by_id[p["id"]]
            assert p["prompt"] == c.prompt and p["label"] == c.label
            assert p["image_a"] == thumbnail_data_uri(c.image_a, 192)
            im = Image.open(io.BytesIO(base64.b64decode(p["image_b"].split(",", 1)[1])))
            assert max(im.size) <= 192
    saved = json.loads(res.save(tmp_path / "r.json").read_text())
    assert len(saved["benchmarks"]["mmrb2/t2i"]["wrong_pairs"]["pairs"]) == 3
    off = _run(MeanPixel(), "mmrb2/t2i", data_root, wrong_examples=0).to_dict()
    assert "wrong_pairs" not in off["benchmarks"]["mmrb2/t2i"]  # 0: the record is as before
    with pytest.raises(ValueError, match="wrong_examples"):
        _run(MeanPixel(), "mmrb2/t2i", data_root, wrong_examples=-1)


def test_content_identity_follows_symlinked_subfolders(tmp_path):
    """Bug: a model folder assembled from links (``text_encoder -> /elsewhere/te``) was hashed without the linked
    folder's files (``Path.rglob`` does not descend into symlinked folders): replacing the weights there kept
    the cache key, so the old scores came back. A link cycle is walked once."""
    import os

    from rewardkit.bench.cache import content_identity

    te = tmp_path / "te"
    te.mkdir()
    (te / "model.safetensors").write_bytes(b"A" * 10)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    os.symlink(te, model / "text_encoder")
    os.symlink(model, te / "loop")                       # a cycle back to the top
    before = content_identity({"model": str(model)})
    (te / "model.safetensors").write_bytes(b"B" * 10)    # same size, same path, other weights
    after = content_identity({"model": str(model)})
    assert list(before) == list(after) == [str(model.resolve())] and before != after


def test_cache_is_keyed_by_the_weights_content_judge_and_template(tmp_path, data_root, monkeypatch):
    """Bug: the score cache was keyed by the configuration only, so weights replaced at the same path gave the
    old scores back. The key now holds the content of every local file / directory the configuration names
    (memoised by path, size and mtime), the judge's identity and the template ids."""
    import os
    from dataclasses import dataclass

    from rewardkit.reward import RewardConfig

    @dataclass
    class Cfg(RewardConfig):
        model: str = ""

    class FileGain(MeanPixel):
        """Its "weights": a gain read from the file ``model`` at load time."""
        name = "test-file-gain"
        Config = Cfg

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.gain = float(Path(self.config.model, "weights.txt").read_text())

        def _score(self, batch):
            return RewardOutput(scores=super()._score(batch).scores * self.gain)

    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.txt").write_text("+1.0")
    cache = tmp_path / "cache"
    value = lambda res: res["genaibench/t2i"].metrics["accuracy_without_ties"].value  # noqa: E731
    first = FileGain(model=str(model))
    v1 = value(_run(first, "genaibench/t2i", data_root, cache_dir=cache))
    assert first.n_scored > 0
    (model / "weights.txt").write_text("-1.0")              # new weights, same path, same size
    st = (model / "weights.txt").stat()
    os.utime(model / "weights.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = FileGain(model=str(model))
    v2 = value(_run(second, "genaibench/t2i", data_root, cache_dir=cache))
    assert second.n_scored == first.n_scored                 # re-scored (before: 0, the old scores returned)
    assert v2 == value(_run(FileGain(model=str(model)), "genaibench/t2i", data_root, cache_dir=None)) != v1
    again = FileGain(model=str(model))                       # unchanged weights: served from the cache
    assert value(_run(again, "genaibench/t2i", data_root, cache_dir=cache)) == v2 and again.n_scored == 0
    assert (cache / "file-digests.json").is_file()           # digests kept between runs (path, size, mtime)
    from rewardkit.bench.cache import content_identity, reward_fingerprint

    assert list(content_identity({"model": str(model)})) == [str(model.resolve())]
    assert content_identity({"model": "org/not-a-local-path", "device": "cpu"}) == {}
    assert content_identity({"applicability_cache": str(model / "weights.txt")}) == {}  # the reward's own memo
    # a hub id cached locally: keyed by the commit of its cached snapshot (an update under the same id re-keys)
    import huggingface_hub.constants as hub_constants

    hub = tmp_path / "hub"
    repo = hub / "models--org--tiny"
    for commit in ("a" * 40, "b" * 40):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(hub))
    (repo / "refs" / "main").write_text("a" * 40)
    assert content_identity({"model": "org/tiny"}) == {"hub:org/tiny": "a" * 40}
    (repo / "refs" / "main").write_text("b" * 40)
    assert content_identity({"model": "org/tiny"}) == {"hub:org/tiny": "b" * 40}

    # the judge's identity and the template id (a template re-versioned under the same name)
    from rewardkit.judges.base import JudgeBackend

    class J(JudgeBackend):
        kind = "scripted"

        def __init__(self, model):
            self.model = model

        def generate(self, *a, **k):
            raise NotImplementedError

        def choice_probs(self, *a, **k):
            raise NotImplementedError

        def describe(self):
            return {"kind": self.kind, "model": self.model}

    from rewardkit import load_reward

    def fp(r):
        return reward_fingerprint(r.name, type(r).__qualname__, {"template": "default"}, reward=r)

    a, b = load_reward("vqascore", judge=J("judge-a")), load_reward("vqascore", judge=J("judge-b"))
    assert fp(a) != fp(b) and fp(a) == fp(load_reward("vqascore", judge=J("judge-a")))
    c = load_reward("vqascore", judge=J("judge-a"))
    import dataclasses

    c.template = dataclasses.replace(c.template, version="999")  # same name, another version
    assert fp(c) != fp(a)
