"""LoRA soup: numerically equal to sum_i w_i s_i B_i A_i on a tiny Qwen2.5-VL with real peft adapters."""

from __future__ import annotations

import json

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from rewardkit.compose.soup import lora_soup, read_adapter, soup_deltas  # noqa: E402

LM_TARGET = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def _load_base(path):
    return transformers.AutoModelForImageTextToText.from_pretrained(path).eval()


@pytest.fixture(scope="module")
def adapters(tiny_qwen2_5_vl_dir, tmp_path_factory):
    """Two adapters with different ranks, alphas and rsLoRA, random non-zero A and B."""
    root = tmp_path_factory.mktemp("soup")
    specs = [dict(r=4, lora_alpha=8, use_rslora=False, seed=1), dict(r=2, lora_alpha=3, use_rslora=True, seed=2)]
    paths, factors = [], []
    for k, spec in enumerate(specs):
        base = _load_base(tiny_qwen2_5_vl_dir)
        cfg = peft.LoraConfig(r=spec["r"], lora_alpha=spec["lora_alpha"], use_rslora=spec["use_rslora"],
                              lora_dropout=0.0, target_modules=LM_TARGET)
        model = peft.get_peft_model(base, cfg)
        g = torch.Generator().manual_seed(spec["seed"])
        facts = {}
        for name, mod in model.named_modules():
            if hasattr(mod, "lora_A") and "default" in mod.lora_A:
                with torch.no_grad():
                    mod.lora_A["default"].weight.normal_(0, 0.5, generator=g)
                    mod.lora_B["default"].weight.normal_(0, 0.5, generator=g)
                s = mod.scaling["default"]
                facts[name.removeprefix("base_model.model.")] = (
                    mod.lora_B["default"].weight.detach().clone(), mod.lora_A["default"].weight.detach().clone(), s)
        p = root / f"adapter{k}"
        model.save_pretrained(p)
        paths.append(p)
        factors.append(facts)
    return paths, factors


def _expected(factors, weights):
    out = {}
    for facts, w in zip(factors, weights):
        for m, (B, A, s) in facts.items():
            out[m] = out.get(m, 0) + w * s * (B @ A)
    return out


def test_read_adapter_scalings(adapters):
    paths, factors = adapters
    a0, a1 = read_adapter(paths[0]), read_adapter(paths[1])
    m = next(iter(factors[0]))
    assert a0.scaling[f"base_model.model.{m}"] == pytest.approx(8 / 4)
    assert a1.scaling[f"base_model.model.{m}"] == pytest.approx(3 / 2 ** 0.5)   # rsLoRA: alpha / sqrt(r)
    assert a1.scaling[f"base_model.model.{m}"] == pytest.approx(factors[1][m][2])


def test_soup_adapter_equals_weighted_delta_sum(adapters, tiny_qwen2_5_vl_dir, tmp_path):
    paths, factors = adapters
    weights = [0.5, 0.5]
    out = lora_soup(paths, tmp_path / "soup", weights)
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["r"] == 6 and cfg["lora_alpha"] == 6 and json.loads((out / "soup.json").read_text())["weights"] == weights
    model = peft.PeftModel.from_pretrained(_load_base(tiny_qwen2_5_vl_dir), out).eval()
    expect = _expected(factors, weights)
    seen = 0
    for name, mod in model.named_modules():
        if hasattr(mod, "lora_A") and "default" in mod.lora_A:
            got = mod.get_delta_weight("default")
            torch.testing.assert_close(got, expect[name.removeprefix("base_model.model.")], atol=1e-5, rtol=1e-5)
            seen += 1
    assert seen == len(expect) > 0
    # functional check: logits equal the base model with the averaged deltas added by hand
    ids = torch.tensor([[1, 5, 9, 20, 33, 40]])
    with torch.no_grad():
        soup_logits = model(input_ids=ids).logits
        ref = _load_base(tiny_qwen2_5_vl_dir)
        params = dict(ref.named_parameters())
        for m, d in expect.items():
            params[f"{m}.weight"].add_(d)
        ref_logits = ref(input_ids=ids).logits
    torch.testing.assert_close(soup_logits, ref_logits, atol=1e-5, rtol=1e-4)


def test_peft_linear_combination_is_not_the_delta_average(adapters, tiny_qwen2_5_vl_dir):
    """Why the soup does not use add_weighted_adapter(..., 'linear'): it has cross terms (and equal ranks)."""
    paths, factors = adapters
    model = peft.PeftModel.from_pretrained(_load_base(tiny_qwen2_5_vl_dir), paths[0], adapter_name="a")
    model.load_adapter(paths[0], adapter_name="b")   # equal ranks: linear needs them
    model.add_weighted_adapter(["a", "b"], [0.5, 0.5], "lin", combination_type="linear")
    name, mod = next((n, m) for n, m in model.named_modules() if hasattr(m, "lora_A") and "lin" in m.lora_A)
    B, A, s = factors[0][name.removeprefix("base_model.model.")]
    exact = s * (B @ A)                               # the mean of two identical deltas is the delta itself
    assert (mod.get_delta_weight("lin") - exact).abs().max() > 1e-3


def test_merged_weights_and_weights_validation(adapters, tiny_qwen2_5_vl_dir, tmp_path):
    paths, factors = adapters
    weights = [0.25, 0.75]
    merged = lora_soup(paths, tmp_path / "merged", weights, base=tiny_qwen2_5_vl_dir)
    assert (merged / "config.json").is_file()
    m_model = _load_base(merged)
    ref = _load_base(tiny_qwen2_5_vl_dir)
    expect = _expected(factors, weights)
    ref_params = dict(ref.named_parameters())
    for name, p in m_model.named_parameters():
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        want = ref_params[name] + expect[mod] if mod in expect else ref_params[name]
        torch.testing.assert_close(p, want, atol=1e-6, rtol=1e-5)
    deltas = soup_deltas([read_adapter(p) for p in paths], weights)
    assert len(deltas) == len(expect)
    from rewardkit.compose.soup import match_module

    assert match_module("model.language_model.layers.0.mlp.up_proj",
                        ["model.layers.0.mlp.up_proj", "visual.blocks.0.mlp.up_proj"]) == "model.layers.0.mlp.up_proj"
    assert match_module("blocks.1.attn", ["transformer.blocks.1.attn"]) == "transformer.blocks.1.attn"
    with pytest.raises(ValueError, match="several"):
        match_module("x.mlp.up_proj", ["a.mlp.up_proj", "b.mlp.up_proj"])
    with pytest.raises(ValueError, match="weights"):
        lora_soup(paths, tmp_path / "bad", [1.0])
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        lora_soup([tmp_path], tmp_path / "bad2")


def test_soup_cli(adapters, tmp_path):
    from rewardkit.cli import main

    paths, _ = adapters
    rc = main(["soup", str(paths[0]), str(paths[1]), "--output", str(tmp_path / "cli_soup")])
    assert rc == 0
    assert json.loads((tmp_path / "cli_soup" / "soup.json").read_text())["weights"] == [0.5, 0.5]
    assert read_adapter(tmp_path / "cli_soup").A


def test_soup_cli_from_recipe_yaml(adapters, tmp_path):
    from rewardkit.cli import main

    paths, _ = adapters
    cfg = tmp_path / "stage3.yaml"
    cfg.write_text(f"soup:\n  adapters: [{paths[0]}, {paths[1]}]\n  weights: [0.5, 0.5]\n"
                   f"  output: {tmp_path / 'yaml_soup'}\n  base: null\n")
    assert main(["soup", "--config", str(cfg)]) == 0
    assert json.loads((tmp_path / "yaml_soup" / "soup.json").read_text())["weights"] == [0.5, 0.5]
    cfg.write_text("soup:\n  adapter: [a]\n")
    assert main(["soup", "--config", str(cfg)]) == 2                 # unknown key: a clear config error
