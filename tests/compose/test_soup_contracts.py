"""Documented contracts of ``rewardkit.compose.soup`` that the model-level soup tests leave open (found by
mutation testing): the refusals of ``read_adapter``, weights, the non-LoRA tensors (trainable-token rows,
``modules_to_save``), the saved adapter's config, merging into a checkpoint, module matching and the soup of
preference-model directories.

Adapters are written by hand (a config dict and a few safetensors tensors), so each case runs in
milliseconds; every expected value is hand-computed from the factors written here.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

st = pytest.importorskip("safetensors.torch")

from rewardkit.compose import soup as S  # noqa: E402

P = "base_model.model."


def _adapter(path, cfg, tensors):
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    st.save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "adapter_model.safetensors"))
    return path


def _lora(module, A, B):
    return {f"{P}{module}.lora_A.weight": torch.tensor(A, dtype=torch.float32),
            f"{P}{module}.lora_B.weight": torch.tensor(B, dtype=torch.float32)}


# a: module "q" with r=1: A = [[1, 2]], B = [[3], [4]]; alpha 2 -> s = 2
# b: module "q" with r=2: A = [[1, 0], [0, 1]], B = [[1, 1], [0, 2]]; alpha 1 -> s = 1/2
A_Q = ([[1.0, 2.0]], [[3.0], [4.0]])
B_Q = ([[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 2.0]])


@pytest.fixture
def two(tmp_path):
    a = _adapter(tmp_path / "a", {"peft_type": "LORA", "r": 1, "lora_alpha": 2, "target_modules": ["q"]},
                 _lora("q", *A_Q))
    b = _adapter(tmp_path / "b", {"peft_type": "LORA", "r": 2, "lora_alpha": 1, "target_modules": ["q", "k"]},
                 {**_lora("q", *B_Q), **_lora("k", [[2.0, 0.0]], [[1.0], [1.0]])})
    return a, b


# ------------------------------------------------------------------ read_adapter
def test_read_adapter_factors_and_scalings(tmp_path, two):
    a, b = (S.read_adapter(p) for p in two)
    assert torch.equal(a.A[f"{P}q"], torch.tensor(A_Q[0])) and torch.equal(a.B[f"{P}q"], torch.tensor(A_Q[1]))
    assert a.scaling == {f"{P}q": 2.0} and b.scaling == {f"{P}q": 0.5, f"{P}k": 1.0}
    assert a.path == two[0] and a.config["r"] == 1 and a.tokens == {} and a.full == {}
    # no lora_alpha in the config: peft's default alpha is r -> scaling 1 (r = 2 here)
    c = S.read_adapter(_adapter(tmp_path / "c", {"r": 8}, _lora("q", *B_Q)))   # no peft_type: LORA by default
    assert c.scaling == {f"{P}q": 1.0}
    # rsLoRA: alpha / sqrt(r)
    d = S.read_adapter(_adapter(tmp_path / "d", {"lora_alpha": 3, "use_rslora": True}, _lora("q", *B_Q)))
    assert d.scaling[f"{P}q"] == pytest.approx(3 / math.sqrt(2))


def test_alpha_pattern_matches_whole_dotted_suffixes(tmp_path):
    t = {**_lora("layers.0.v", *A_Q), **_lora("layers.0.kv", *A_Q), **_lora("v", *A_Q)}
    a = S.read_adapter(_adapter(tmp_path / "a", {"lora_alpha": 2, "alpha_pattern": {"v": 5}}, t))
    # "v" is the last component of "layers.0.v" and the whole of "v", not of "layers.0.kv"
    assert a.scaling == {f"{P}layers.0.v": 5.0, f"{P}v": 5.0, f"{P}layers.0.kv": 2.0}


def test_read_adapter_tokens_and_modules_to_save(tmp_path):
    rows = torch.tensor([[1.0, 2.0, 3.0]])
    cfg = {"lora_alpha": 1, "trainable_token_indices": [7], "modules_to_save": ["score"]}
    t = {**_lora("q", *A_Q), f"{P}embed.token_adapter.trainable_tokens_delta": rows,
         f"{P}score.weight": torch.ones(2, 2),
         f"{P}x.score.bias": torch.zeros(2)}
    a = S.read_adapter(_adapter(tmp_path / "a", cfg, t))
    assert set(a.tokens) == {f"{P}embed"} and torch.equal(a.tokens[f"{P}embed"], rows)
    assert set(a.full) == {f"{P}score.weight", f"{P}x.score.bias"}
    assert set(a.A) == {f"{P}q"}
    # "score" is a whole component: "myscore.w" is not a saved module's tensor
    with pytest.raises(ValueError, match="unexpected tensor 'base_model.model.myscore.w'"):
        S.read_adapter(_adapter(tmp_path / "b", cfg, {**_lora("q", *A_Q), f"{P}myscore.w": torch.ones(1)}))


@pytest.mark.parametrize("cfg, tensors, exc, match", [
    ({"peft_type": "LOHA"}, None, ValueError, "peft_type 'LOHA' is not LORA"),
    ({"use_dora": True}, None, ValueError, "DoRA"),
    ({"lora_bias": True}, None, ValueError, "lora_bias"),
    ({}, {f"{P}q.weight": torch.ones(2, 2)}, ValueError, "unexpected tensor 'base_model.model.q.weight'"),
    ({}, {f"{P}e.token_adapter.trainable_tokens_delta": torch.ones(1, 2)}, ValueError, "no trainable_token_indices"),
    ({}, {f"{P}q.lora_A.weight": torch.ones(1, 2)}, ValueError, r"lora_A but no lora_B.*\['base_model.model.q'\]"),
    ({}, {f"{P}q.lora_A.weight": torch.ones(1, 2, 1, 1), f"{P}q.lora_B.weight": torch.ones(2, 1, 1, 1)}, ValueError,
     r"not a linear LoRA \(A has shape \(1, 2, 1, 1\)\)"),
])
def test_read_adapter_refusals(tmp_path, cfg, tensors, exc, match):
    with pytest.raises(exc, match=match):
        S.read_adapter(_adapter(tmp_path / "a", cfg, tensors if tensors is not None else _lora("q", *A_Q)))


def test_read_adapter_missing_files(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        S.read_adapter(tmp_path / "empty")
    p = tmp_path / "nopick"
    p.mkdir()
    (p / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no adapter_model.safetensors$"):
        S.read_adapter(p)
    (p / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(FileNotFoundError, match=r"no adapter_model.safetensors \(found adapter_model.bin: convert it "
                                                r"to safetensors; rewardkit never unpickles weights\)$"):
        S.read_adapter(p)


# ------------------------------------------------------------------ weights and dense deltas
def test_weights_defaults_and_refusals(two):
    ads = [S.read_adapter(p) for p in two]
    assert S._check_weights(4, None) == [0.25] * 4
    assert S._check_weights(2, [1, 3]) == [1.0, 3.0]   # used as given, not renormalised
    with pytest.raises(ValueError, match="at least one adapter"):
        S.soup_deltas([])
    with pytest.raises(ValueError, match="^1 weights for 2 adapters$"):
        S.soup_deltas(ads, [1.0])
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            S.soup_deltas(ads, [0.5, bad])


def test_soup_deltas_by_hand(two):
    ads = [S.read_adapter(p) for p in two]
    d = S.soup_deltas(ads, [0.25, 2.0])
    # q: 0.25 * 2 * [[3, 6], [4, 8]] + 2.0 * 0.5 * [[1, 1], [0, 2]]
    assert torch.allclose(d[f"{P}q"], torch.tensor([[1.5 + 1, 3 + 1], [2 + 0, 4 + 2]]))
    # k only in b: 2.0 * 1 * [[1], [1]] @ [[2, 0]]
    assert torch.allclose(d[f"{P}k"], torch.tensor([[4.0, 0.0], [4.0, 0.0]]))
    assert d[f"{P}q"].dtype == torch.float32
    # default weights 1/2 each
    d = S.soup_deltas(ads)
    # q: 0.5 * 2 * [[3, 6], [4, 8]] + 0.5 * 0.5 * [[1, 1], [0, 2]]
    assert torch.allclose(d[f"{P}q"], torch.tensor([[3 + 0.25, 6 + 0.25], [4, 8 + 0.5]]))
    assert torch.allclose(d[f"{P}k"], torch.tensor([[1.0, 0.0], [1.0, 0.0]]))


def test_soup_deltas_half_precision_factors_are_multiplied_in_float32(tmp_path):
    big = 300.0   # 300 * 300 = 90000 overflows float16 (max 65504): the product must be taken in float32
    half = torch.tensor([[big]], dtype=torch.float16)
    a = _adapter(tmp_path / "a", {"lora_alpha": 1}, {f"{P}q.lora_A.weight": half, f"{P}q.lora_B.weight": half.clone()})
    d = S.soup_deltas([S.read_adapter(a)], [1.0])
    assert d[f"{P}q"].dtype == torch.float32 and d[f"{P}q"].item() == 90000.0


# ------------------------------------------------------------------ non-LoRA tensors
def _extras_adapter(path, rows, saved, ids=(7,)):
    cfg = {"lora_alpha": 1, "trainable_token_indices": list(ids), "modules_to_save": ["score"]}
    return S.read_adapter(_adapter(path, cfg, {**_lora("q", *A_Q), f"{P}embed.token_adapter.trainable_tokens_delta":
                                               torch.tensor(rows), f"{P}score.weight": torch.tensor(saved)}))


def test_soup_extras_weighted_values(tmp_path):
    a = _extras_adapter(tmp_path / "a", [[1.0, 2.0]], [4.0])
    b = _extras_adapter(tmp_path / "b", [[3.0, 6.0]], [8.0])
    tokens, full = S.soup_extras([a, b], [0.25, 0.75])
    assert torch.allclose(tokens[f"{P}embed"], torch.tensor([[2.5, 5.0]]))
    assert torch.allclose(full[f"{P}score.weight"], torch.tensor([7.0]))
    assert S._unit_sum([0.5, 0.5 + 5e-7], "x") is None   # within 1e-6 of 1
    with pytest.raises(ValueError, match="sum to 1, got sum 1.00001"):
        S.soup_extras([a, b], [0.5, 0.50001])
    with pytest.raises(ValueError, match="sum to 1, got sum 2"):
        S.soup_extras([a, b], [1.0, 1.0])
    # no such tensors: the weights need not sum to 1
    plain = [S.read_adapter(_adapter(tmp_path / n, {}, _lora("q", *A_Q))) for n in ("c", "d")]
    assert S.soup_extras(plain, [1.0, 1.0]) == ({}, {})


def test_soup_extras_refusals(tmp_path):
    a = _extras_adapter(tmp_path / "a", [[1.0, 2.0]], [4.0])
    plain = S.read_adapter(_adapter(tmp_path / "p", {}, _lora("q", *A_Q)))
    with pytest.raises(ValueError, match=f"^the adapters carry different trainable-token rows: {tmp_path / 'a'}: "
                                         rf"\['base_model.model.embed'\]; {tmp_path / 'p'}: \[\]$"):
        S.soup_extras([a, plain], [0.5, 0.5])
    saved = S.read_adapter(_adapter(tmp_path / "s", {"modules_to_save": ["score"]},
                                    {**_lora("q", *A_Q), f"{P}score.weight": torch.ones(1)}))
    with pytest.raises(ValueError, match="^the adapters carry different modules_to_save tensors: "):
        S.soup_extras([saved, plain], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"'base_model.model.embed' has different shapes across adapters: "
                                         r"\[\(1, 2\), \(1, 3\)\]"):
        S.soup_extras([a, _extras_adapter(tmp_path / "b", [[1.0, 2.0, 3.0]], [4.0])], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"different token ids.*\[7\], \[8\]"):
        S.soup_extras([a, _extras_adapter(tmp_path / "c", [[1.0, 2.0]], [4.0], ids=(8,))], [0.5, 0.5])
    # the same ids by module, written in another key order, are the same ids
    rows = {f"{P}embed.token_adapter.trainable_tokens_delta": torch.ones(1, 2)}
    d1 = S.read_adapter(_adapter(tmp_path / "d1", {"trainable_token_indices": {"embed": [1], "lm": [2]}}, rows))
    d2 = S.read_adapter(_adapter(tmp_path / "d2", {"trainable_token_indices": {"lm": [2], "embed": [1]}}, rows))
    assert torch.equal(S.soup_extras([d1, d2], [0.5, 0.5])[0][f"{P}embed"], torch.ones(1, 2))


# ------------------------------------------------------------------ the saved adapter
def test_saved_adapter_is_the_rank_concatenation(tmp_path, two):
    ads = [S.read_adapter(p) for p in two]
    out = S.save_soup_adapter(ads, tmp_path / "soup", [0.25, 2.0])
    t = st.load_file(str(out / "adapter_model.safetensors"))
    # q: A = [0.25 * 2 * A_a; 2.0 * 0.5 * A_b] (rows), B = [B_a, B_b] (columns)
    assert torch.equal(t[f"{P}q.lora_A.weight"], torch.tensor([[0.5, 1.0], [1.0, 0.0], [0.0, 1.0]]))
    assert torch.equal(t[f"{P}q.lora_B.weight"], torch.tensor([[3.0, 1.0, 1.0], [4.0, 0.0, 2.0]]))
    assert torch.equal(t[f"{P}k.lora_A.weight"], torch.tensor([[4.0, 0.0]]))
    cfg = json.loads((out / "adapter_config.json").read_text())
    # ranks: q 3, k 1 -> r = 1 (alpha 1), q pinned at 3 with alpha 3: scaling 1 everywhere
    assert cfg["r"] == 1 and cfg["lora_alpha"] == 1 and cfg["rank_pattern"] == {"q": 3} == cfg["alpha_pattern"]
    assert cfg["use_rslora"] is False and cfg["lora_dropout"] == 0.0 and cfg["peft_type"] == "LORA"
    assert cfg["target_modules"] == ["k", "q"]
    meta = json.loads((out / "soup.json").read_text())
    assert meta["sources"] == [str(p) for p in two] and meta["weights"] == [0.25, 2.0]
    assert meta["method"] == "rank-concatenation (exact delta average)"
    from safetensors import safe_open

    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}   # transformers / peft loaders expect format=pt
    assert meta["non_lora"] == {"trainable_token_rows": [], "modules_to_save": [],
                                "rule": "weighted average of values (weights sum to 1)"}
    # reading it back gives the same dense deltas
    got, want = S.soup_deltas([S.read_adapter(out)], [1.0]), S.soup_deltas(ads, [0.25, 2.0])
    assert set(got) == set(want) and all(torch.allclose(got[m], want[m]) for m in want)


def test_saved_adapter_equal_ranks_have_no_patterns_and_keep_dtype(tmp_path):
    def half(name, A, B):
        return {k: v.to(torch.bfloat16) for k, v in _lora(name, A, B).items()}
    a = S.read_adapter(_adapter(tmp_path / "a", {"lora_alpha": 1, "rank_pattern": {"q": 1}, "alpha_pattern": {"q": 2},
                                                 "use_rslora": True, "lora_dropout": 0.1}, half("q", *A_Q)))
    b = S.read_adapter(_adapter(tmp_path / "b", {"lora_alpha": 1}, half("q", *A_Q)))
    out = S.save_soup_adapter([a, b], tmp_path / "soup")
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["r"] == 2 and cfg["lora_alpha"] == 2 and cfg["rank_pattern"] == {} and cfg["alpha_pattern"] == {}
    assert cfg["use_rslora"] is False and cfg["lora_dropout"] == 0.0
    t = st.load_file(str(out / "adapter_model.safetensors"))
    assert t[f"{P}q.lora_A.weight"].dtype == torch.bfloat16   # the first adapter's dtype by default
    # a: alpha_pattern 2 / r 1 = 2, default weight 1/2 -> 1 * A; b: 1/2 * 1 * A
    assert torch.equal(t[f"{P}q.lora_A.weight"].float(), torch.tensor([[1.0, 2.0], [0.5, 1.0]]))
    s32 = S.save_soup_adapter([a, b], tmp_path / "s32", dtype=torch.float32)
    t = st.load_file(str(s32 / "adapter_model.safetensors"))
    assert t[f"{P}q.lora_B.weight"].dtype == torch.float32


@pytest.mark.parametrize("targets, want", [
    ((["q"], ["k", "q"]), ["k", "q"]),
    ((r".*\.(q|k)", r".*\.(q|k)"), r".*\.(q|k)"),                  # one regex shared by all: kept
    ((r".*\.q", r".*\.(q|k)"), ["k", "q"]),                         # different regexes: the module names
    ((r".*\.q", ["q"]), ["k", "q"]),                                 # regex + list: the module names
])
def test_saved_adapter_target_modules(tmp_path, targets, want):
    ads = [S.read_adapter(_adapter(tmp_path / f"a{i}", {"lora_alpha": 1, "target_modules": t},
                                   {**_lora("q", *A_Q), **_lora("k", *A_Q)})) for i, t in enumerate(targets)]
    out = S.save_soup_adapter(ads, tmp_path / "soup")
    assert json.loads((out / "adapter_config.json").read_text())["target_modules"] == want


def test_saved_adapter_refuses_mixed_fan_in_fan_out(tmp_path):
    a = S.read_adapter(_adapter(tmp_path / "a", {"fan_in_fan_out": True}, _lora("q", *A_Q)))
    b = S.read_adapter(_adapter(tmp_path / "b", {}, _lora("q", *A_Q)))
    with pytest.raises(ValueError, match="different fan_in_fan_out"):
        S.save_soup_adapter([a, b], tmp_path / "soup")
    assert not (tmp_path / "soup").exists()


def test_saved_adapter_carries_averaged_extras_in_their_dtype(tmp_path):
    a = _extras_adapter(tmp_path / "a", [[1.0, 2.0]], [4.0])
    b = _extras_adapter(tmp_path / "b", [[3.0, 6.0]], [8.0])
    out = S.save_soup_adapter([a, b], tmp_path / "soup", [0.25, 0.75])
    c = S.read_adapter(out)
    assert torch.equal(c.tokens[f"{P}embed"], torch.tensor([[2.5, 5.0]]))
    assert torch.equal(c.full[f"{P}score.weight"], torch.tensor([7.0]))
    meta = json.loads((out / "soup.json").read_text())["non_lora"]
    assert meta["trainable_token_rows"] == [f"{P}embed"] and meta["modules_to_save"] == [f"{P}score.weight"]


# ------------------------------------------------------------------ merge into a checkpoint
def _base(path, tensors, files=None):
    path.mkdir(parents=True, exist_ok=True)
    files = files or {"model.safetensors": list(tensors)}
    for name, keys in files.items():
        st.save_file({k: tensors[k] for k in keys}, str(path / name), metadata={"format": "pt", "who": name})
    (path / "config.json").write_text('{"model_type": "x"}')
    (path / "sub").mkdir()
    return path


def test_merge_adds_deltas_in_the_base_dtype_and_copies_the_rest(tmp_path, two):
    base = _base(tmp_path / "base", {"model.layers.q.weight": torch.ones(2, 2, dtype=torch.bfloat16),
                                     "model.layers.k.weight": torch.zeros(2, 2), "model.layers.k.bias": torch.ones(2),
                                     "model.layers.o.weight": torch.full((2, 2), 5.0)},
                 files={"a.safetensors": ["model.layers.q.weight", "model.layers.o.weight"],
                        "b.safetensors": ["model.layers.k.weight", "model.layers.k.bias"]})
    ads = [S.read_adapter(p) for p in two]
    deltas = {f"{P}layers.q": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), f"{P}layers.k": torch.eye(2)}
    out = S.merge_into_checkpoint(deltas, base, tmp_path / "out")
    a, b = st.load_file(str(out / "a.safetensors")), st.load_file(str(out / "b.safetensors"))
    assert a["model.layers.q.weight"].dtype == torch.bfloat16
    assert torch.equal(a["model.layers.q.weight"].float(), torch.tensor([[2.0, 3.0], [4.0, 5.0]]))
    assert torch.equal(a["model.layers.o.weight"], torch.full((2, 2), 5.0))       # untouched
    assert torch.equal(b["model.layers.k.weight"], torch.eye(2))
    assert torch.equal(b["model.layers.k.bias"], torch.ones(2))
    assert (out / "config.json").read_text() == '{"model_type": "x"}' and not (out / "sub").exists()
    from safetensors import safe_open

    with safe_open(str(out / "b.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt", "who": "b.safetensors"}
    assert ads   # the fixture's adapters are unused here: deltas are given directly


def test_merge_rows_and_modules_to_save(tmp_path):
    base = _base(tmp_path / "base", {"model.embed.weight": torch.zeros(4, 2), "model.score.weight": torch.zeros(1, 2),
                                     "model.score.bias": torch.zeros(1), "model.head.proj.bias": torch.zeros(2)})
    rows = {f"{P}embed": ([1, 3], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))}
    out = S.merge_into_checkpoint({}, base, tmp_path / "out", rows=rows,
                                  full={f"{P}score.weight": torch.tensor([[7.0, 8.0]]),
                                        f"{P}score.bias": torch.tensor([9.0]),
                                        f"{P}head.proj.bias": torch.tensor([1.0, 2.0])})
    t = st.load_file(str(out / "model.safetensors"))
    assert torch.equal(t["model.embed.weight"], torch.tensor([[0.0, 0.0], [1.0, 2.0], [0.0, 0.0], [3.0, 4.0]]))
    assert torch.equal(t["model.score.bias"], torch.tensor([9.0]))
    assert torch.equal(t["model.score.weight"], torch.tensor([[7.0, 8.0]]))
    assert torch.equal(t["model.head.proj.bias"], torch.tensor([1.0, 2.0]))   # module "head.proj", leaf "bias"
    with pytest.raises(ValueError, match=r"rows \[4\] do not fit 'model.embed.weight' of shape \(4, 2\)"):
        S.merge_into_checkpoint({}, base, tmp_path / "o2", rows={f"{P}embed": ([4], torch.ones(1, 2))})
    with pytest.raises(ValueError, match="do not fit"):
        S.merge_into_checkpoint({}, base, tmp_path / "o3", rows={f"{P}embed": ([0], torch.ones(1, 3))})
    with pytest.raises(ValueError, match=r"modules_to_save tensor for 'model.score.bias' has shape \(2,\), "
                                         r"the base \(1,\)"):
        S.merge_into_checkpoint({}, base, tmp_path / "o4", full={f"{P}score.bias": torch.ones(2)})


def test_merge_refusals(tmp_path):
    (tmp_path / "nothing").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        S.merge_into_checkpoint({}, tmp_path / "nothing", tmp_path / "o")
    base = _base(tmp_path / "base", {"model.layers.q.weight": torch.zeros(2, 2), "x.q.weight": torch.zeros(1, 1)})
    with pytest.raises(ValueError, match=r"delta for 'model.layers.q.weight' has shape \(3, 2\), the weight \(2, 2\)"):
        S.merge_into_checkpoint({f"{P}layers.q": torch.zeros(3, 2)}, base, tmp_path / "o1")
    with pytest.raises(ValueError, match="both map to base weight 'model.layers.q'"):
        S.merge_into_checkpoint({f"{P}layers.q": torch.zeros(2, 2), f"{P}model.layers.q": torch.zeros(2, 2)},
                                base, tmp_path / "o2")
    with pytest.raises(ValueError, match="no base weight found for adapter module 'layers.v'"):
        S.merge_into_checkpoint({f"{P}layers.v": torch.zeros(2, 2)}, base, tmp_path / "o3")


def test_match_module_rules():
    # the longest suffix that names exactly one base module wins (a shorter one would be ambiguous)
    assert S.match_module("a.l.q", ["a.l.q", "b.l.q"]) == "a.l.q"
    assert S.match_module("m.a.l.q", ["x.a.l.q", "b.l.q"]) == "x.a.l.q"
    # at least two components: "l.q" never matches on "q" alone
    with pytest.raises(ValueError, match="no base weight"):
        S.match_module("l.q", ["z.q"])
    # a one-component module may match on itself
    assert S.match_module("q", ["z.q"]) == "z.q"
    # dotted boundaries: "xl.q" does not end with ".l.q"
    with pytest.raises(ValueError, match="no base weight"):
        S.match_module("l.q", ["xl.q"])
    with pytest.raises(ValueError, match=r"matches several base weights: \['a.l.q', 'b.l.q'\]"):
        S.match_module("l.q", ["b.l.q", "a.l.q"])


def test_token_ids_spec():
    assert S._token_ids([3, "5"], "x.embed") == [3, 5]
    assert S._token_ids({"embed_tokens": ["2"], "other": [9]}, "model.embed_tokens") == [2]
    with pytest.raises(ValueError, match="no trainable_token_indices entry for module 'model.my_embed_tokens'"):
        S._token_ids({"embed_tokens": [2]}, "model.my_embed_tokens")
    with pytest.raises(ValueError, match="no trainable_token_indices entry"):
        S._token_ids(None, "embed")


def test_lora_soup_merged_output_with_token_rows(tmp_path):
    cfg = {"lora_alpha": 1, "trainable_token_indices": {"embed": [1]}}
    def mk(n, row, A):
        return _adapter(tmp_path / n, cfg, {**_lora("layers.q", A, [[1.0], [0.0]]),
                                            f"{P}embed.token_adapter.trainable_tokens_delta": torch.tensor([row])})
    a, b = mk("a", [2.0, 2.0], [[1.0, 0.0]]), mk("b", [4.0, 0.0], [[0.0, 1.0]])
    base = _base(tmp_path / "base", {"model.embed.weight": torch.zeros(3, 2),
                                     "model.layers.q.weight": torch.zeros(2, 2)})
    out = S.lora_soup([a, b], tmp_path / "merged", [0.5, 0.5], base=base)
    t = st.load_file(str(out / "model.safetensors"))
    assert torch.equal(t["model.embed.weight"], torch.tensor([[0.0, 0.0], [3.0, 1.0], [0.0, 0.0]]))
    assert torch.equal(t["model.layers.q.weight"], torch.tensor([[0.5, 0.5], [0.0, 0.0]]))
    # weights are used as given: [1, 1] doubles the LoRA delta (and is refused for the token rows)
    with pytest.raises(ValueError, match="sum to 1"):
        S.lora_soup([a, b], tmp_path / "m2", [1.0, 1.0], base=base)


# ------------------------------------------------------------------ preference-model directories
def _pref(path, head, *, cfg=None, tokenizer=b"tok", adapter_q=A_Q):
    path.mkdir(parents=True)
    _adapter(path / "adapter", {"lora_alpha": 1, "target_modules": ["q"]}, _lora("q", *adapter_q))
    st.save_file(head, str(path / "head.safetensors"))
    (path / "processor").mkdir()
    (path / "processor" / "tokenizer.json").write_bytes(tokenizer)
    (path / "processor" / "extra.txt").write_text(path.name)
    base_cfg = {"format": "rewardkit-preference", "head": "linear", "weights": "lora", "base_model": "tiny",
                "reward_token": "<|reward|>", "template": "t"}
    (path / "preference_config.json").write_text(json.dumps({**base_cfg, **(cfg or {})}))
    (path / "calibration.json").write_text("{}")
    return path


def test_soup_of_preference_directories(tmp_path, monkeypatch):
    a = _pref(tmp_path / "a", {"w": torch.tensor([[1.0, 2.0]]), "b": torch.tensor([1.0])})
    b = _pref(tmp_path / "b", {"w": torch.tensor([[3.0, 6.0]]), "b": torch.tensor([5.0])}, adapter_q=B_Q)
    out = S.lora_soup([a, b], tmp_path / "out", [0.25, 0.75])
    h = st.load_file(str(out / "head.safetensors"))
    assert torch.equal(h["w"], torch.tensor([[2.5, 5.0]])) and torch.equal(h["b"], torch.tensor([4.0]))
    assert h["w"].dtype == torch.float32
    from safetensors import safe_open

    with safe_open(str(out / "head.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "rewardkit-preference"}   # the models' own format tag
    d = S.soup_deltas([S.read_adapter(out / "adapter")], [1.0])[f"{P}q"]
    # 0.25 * 1 * [[3, 6], [4, 8]] + 0.75 * (1/2) * [[1, 1], [0, 2]]
    assert torch.allclose(d, torch.tensor([[0.75 + 0.375, 1.5 + 0.375], [1.0, 2.0 + 0.75]]))
    assert (out / "processor" / "extra.txt").read_text() == "a"
    assert json.loads((out / "preference_config.json").read_text())["head"] == "linear"
    assert not (out / "calibration.json").exists()
    assert json.loads((out / "soup.json").read_text()) == {
        "sources": [str(a), str(b)], "weights": [0.25, 0.75],
        "adapter": "exact LoRA delta average (rank concatenation); reward-token rows averaged",
        "head": "parameter average sum_i w_i theta_i",
        "calibration": "not carried over: run rewardkit calibrate on the soup"}
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    # an earlier soup is replaced (written beside it first, then renamed: never half-written); default weights 1/2
    import shutil

    made = []
    real_copytree = shutil.copytree
    monkeypatch.setattr(S.shutil, "copytree", lambda src, dst, **kw: made.append(dst) or real_copytree(src, dst, **kw))
    out = S.soup_preference_models([a, b], tmp_path / "out")
    assert len(made) == 1 and made[0].parent.parent == tmp_path and made[0].parent.name.startswith(".out.tmp-")
    assert torch.equal(st.load_file(str(out / "head.safetensors"))["b"], torch.tensor([3.0]))
    # models without a format tag: the head gets an empty one
    for m in (a, b):
        cfg = json.loads((m / "preference_config.json").read_text())
        del cfg["format"]
        (m / "preference_config.json").write_text(json.dumps(cfg))
    out = S.soup_preference_models([a, b], tmp_path / "untagged")
    with safe_open(str(out / "head.safetensors"), "pt") as f:
        assert f.metadata() == {"format": ""}


def test_soup_of_preference_directories_refusals(tmp_path):
    head = {"w": torch.tensor([[1.0, 2.0]])}
    a = _pref(tmp_path / "a", head)
    with pytest.raises(ValueError, match=r"^--base merges plain peft adapters; preference model directories are souped "
                                         r"into a preference model directory \(drop --base\)$"):
        S.lora_soup([a, a], tmp_path / "o", base=tmp_path)
    plain = _adapter(tmp_path / "plain", {}, _lora("q", *A_Q))
    with pytest.raises(ValueError, match="not a rewardkit preference model"):
        S.lora_soup([a, plain], tmp_path / "o")
    with pytest.raises(ValueError, match="fully fine-tuned preference model \\(weights: 'full'\\); soup averages LoRA "
                                         "models \\(train with lora.enabled=true\\)"):
        S.soup_preference_models([a, _pref(tmp_path / "full", head, cfg={"weights": "full"})], tmp_path / "o")
    nohead = _pref(tmp_path / "nohead", head)
    (nohead / "head.safetensors").rename(nohead / "head.bin")
    with pytest.raises(FileNotFoundError, match="no head.safetensors \\(found a pickle file"):
        S.soup_preference_models([a, nohead], tmp_path / "o")
    (nohead / "head.bin").unlink()
    with pytest.raises(FileNotFoundError, match="no head.safetensors$"):
        S.soup_preference_models([a, nohead], tmp_path / "o")
    for key in ("head", "base_model", "reward_token", "template"):
        other = _pref(tmp_path / f"diff-{key}", head, cfg={key: "other"})
        with pytest.raises(ValueError, match=f"^{other} and {a} differ in {key}: only models of one base"):
            S.soup_preference_models([a, other], tmp_path / "o")
    tok = _pref(tmp_path / "tok", head, tokenizer=b"other")
    with pytest.raises(ValueError, match=f"^{tok} and {a} have different tokenizers$"):
        S.soup_preference_models([a, tok], tmp_path / "o")
    with pytest.raises(ValueError, match="sum to 1"):
        S.soup_preference_models([a, a], tmp_path / "o", [1.0, 1.0])
    with pytest.raises(ValueError, match="heads have different tensors or shapes"):
        S.soup_preference_models([a, _pref(tmp_path / "h2", {"w": torch.ones(1, 3)})], tmp_path / "o")
    with pytest.raises(ValueError, match="heads have different tensors or shapes"):
        S.soup_preference_models([a, _pref(tmp_path / "h3", {**head, "b": torch.ones(1)})], tmp_path / "o")
    assert not (tmp_path / "o").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not an earlier soup"):
        S.soup_preference_models([a, a], mine)
    assert (mine / "notes.txt").read_text() == "keep"
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
