"""Which text-attention kinds the transformers judge accepts: full attention in every layer only.

A sliding-window layer would lose its window in the judge's ready 4-D masks (transformers hands a 4-D mask to
every layer unchanged; sdpa takes the window only from the mask) and its KV cache keeps only the window, so
the judge's prefix slices and forks are not a fresh prefill's. Measured on the tiny 2-layer Qwen2.5-VL below
with ``sliding_window=12`` before the refusal: row scoring off the full forward by up to 2.3e-3 in P(Yes),
packed scoring crashing in sdpa. Such checkpoints are refused at load; ``use_sliding_window: true`` that
windows no layer (``max_window_layers >= num_hidden_layers``) is plain full attention and is accepted.
"""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rewardkit import load_reward  # noqa: E402
from rewardkit.judges import load_judge  # noqa: E402
from rewardkit.judges.transformers_backend import TransformersJudge  # noqa: E402
from rewardkit.models.vlm import load_processor  # noqa: E402
from rewardkit.testing import random_images, save_tiny_checkpoint, tiny_qwen2_5_vl  # noqa: E402

N_LAYERS = 2


@pytest.fixture(scope="module")
def two_layer_dir(tmp_path_factory):
    """A tiny 2-layer Qwen2.5-VL checkpoint (full attention), as ``save_tiny_checkpoint`` writes it."""
    return save_tiny_checkpoint("qwen2_5_vl", tmp_path_factory.mktemp("attn") / "base", num_layers=N_LAYERS)


def edited_checkpoint(src, dst, *, drop_layer_types: bool = True, **text_fields):
    """A copy of ``src`` whose ``config.json`` text config has ``text_fields`` set, the way a user edits a
    checkpoint's config. ``drop_layer_types``: remove the saved ``layer_types`` so that transformers' config
    class rebuilds it from ``use_sliding_window`` / ``sliding_window`` / ``max_window_layers`` (what a hub
    config.json without ``layer_types`` gets)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    text = cfg["text_config"]
    if drop_layer_types:
        text.pop("layer_types", None)
    text.update(text_fields)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


WINDOWED = {
    # layer i is windowed when i >= max_window_layers (Qwen2_5_VLTextConfig.__post_init__)
    "max_window_layers": (dict(use_sliding_window=True, sliding_window=12, max_window_layers=1), True, 1),
    "all_layers": (dict(use_sliding_window=True, sliding_window=12, max_window_layers=0), True, 0),
    # an explicit layer_types is used as is (the config class only builds it when it is missing)
    "layer_types": (dict(use_sliding_window=True, sliding_window=12, max_window_layers=80,
                         layer_types=["full_attention", "sliding_attention"]), False, 1),
}


@pytest.mark.parametrize("case", sorted(WINDOWED))
def test_sliding_window_checkpoint_is_refused_at_load(case, two_layer_dir, tmp_path):
    fields, drop, first = WINDOWED[case]
    d = edited_checkpoint(two_layer_dir, tmp_path / case, drop_layer_types=drop, **fields)
    text = transformers.AutoConfig.from_pretrained(d).text_config
    assert text.layer_types[first] == "sliding_attention" and text.sliding_window == 12  # a window really applies
    n = sum(t == "sliding_attention" for t in text.layer_types)
    expected = [f"sliding-window attention in {n} of {N_LAYERS} layers", f"from layer {first}",
                "use_sliding_window=True", "sliding_window=12", f"max_window_layers={fields['max_window_layers']}",
                f"num_hidden_layers={N_LAYERS}", "use_sliding_window: false",
                "max_window_layers >= num_hidden_layers", "vllm / openai backend"]

    # the path users take: a judge spec string (what EVR / PARROT / UnifiedReward configs hold)
    with pytest.raises(TypeError, match="not supported by the transformers judge backend") as err:
        load_judge(f"transformers:{d}", device="cpu")
    for part in expected:
        assert part in str(err.value), part

    # a model loaded by the caller is refused the same way
    model = transformers.AutoModelForImageTextToText.from_pretrained(d)
    with pytest.raises(TypeError) as err2:
        TransformersJudge(model, load_processor(str(d)))
    for part in expected:
        assert part in str(err2.value), part

    # refused from config.json alone, before the weights are read
    (d / "model.safetensors").unlink()
    with pytest.raises(TypeError, match="sliding-window attention"):
        TransformersJudge(str(d), device="cpu")
    # a judge reward's spec goes through the same load (EVR builds its judge when it is built)
    with pytest.raises(TypeError, match="sliding-window attention"):
        load_reward("evr", judge=f"transformers:{d}", device="cpu")


def test_sliding_window_flag_that_windows_no_layer_is_accepted(two_layer_dir, tmp_path):
    """``use_sliding_window: true`` with ``max_window_layers >= num_hidden_layers``: transformers' config class
    marks every layer "full_attention" (a 4-token window is set but no layer uses it), so the model is full
    attention and the judge gives the model's own full-forward answers."""
    d = edited_checkpoint(two_layer_dir, tmp_path / "no_window", use_sliding_window=True, sliding_window=4,
                          max_window_layers=N_LAYERS)
    judge = load_judge(f"transformers:{d}", device="cpu")
    text = judge.model.config.text_config
    assert text.use_sliding_window and text.sliding_window == 4
    assert text.layer_types == ["full_attention"] * N_LAYERS
    ims = random_images(2, sizes=[(56, 56), (40, 64)], seed=3)
    convs = [[{"role": "system", "content": "You are a judge."},
              {"role": "user", "content": [{"type": "image", "image": ims[0]}, {"type": "text", "text": q}]}]
             for q in ("Is there a cat in the picture? Yes or No.", "a dog, a red car: aligned? Yes or No.")]
    got = judge.choice_probs(convs, ["Yes", "No"])
    ids = judge.choice_token_ids(["Yes", "No"])
    ref = []
    for c in convs:  # reference: the processor's inputs through the model's own forward, no cache
        text_in = judge.processor.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        inp = judge.processor(text=[text_in], images=[ims[0]], return_tensors="pt")
        with torch.no_grad():
            ref.append(torch.softmax(judge.model(**inp).logits[0, -1, ids].float(), -1))
    torch.testing.assert_close(got, torch.stack(ref), atol=1e-6, rtol=0)


def test_full_attention_tiny_model_still_loads(tiny_qwen2_5_vl_dir):
    judge = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")
    assert set(judge.model.config.text_config.layer_types) == {"full_attention"}
    assert judge._additive_masks()


def test_hybrid_linear_attention_model_is_refused_clearly(tmp_path):
    """Qwen3.5 (linear-attention + full-attention layers) has the Qwen-VL methods the judge looks for, but its
    linear-attention cache layers cannot be sliced or forked; before this refusal the judge failed at its first
    call with ``AttributeError: 'LinearAttentionLayer' object has no attribute 'get_seq_length'``."""
    if not hasattr(transformers, "Qwen3_5Config"):
        pytest.skip("this transformers has no Qwen3.5")
    cfg = transformers.Qwen3_5Config(
        text_config=dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
                         linear_conv_kernel_dim=2, linear_key_head_dim=8, linear_value_head_dim=8,
                         linear_num_key_heads=2, linear_num_value_heads=2,
                         layer_types=["linear_attention", "full_attention"]),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32,
                           num_position_embeddings=16))
    cfg.save_pretrained(tmp_path)  # config.json only: refused before any weights are looked for
    with pytest.raises(TypeError, match=r"'linear_attention' layers .*vllm or openai backend"):
        load_judge(f"transformers:{tmp_path}", device="cpu")
    model = transformers.Qwen3_5ForConditionalGeneration(cfg).eval()
    with pytest.raises(TypeError, match="hybrid model"):
        TransformersJudge(model, tiny_qwen2_5_vl()[1])
