"""Qwen-VL patch embeddings as one matrix product (rewardkit.models.patch_embed): the same numbers as
transformers' own fused patch embedding, within float rounding of the convolution, switchable both ways."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from rewardkit.models.patch_embed import PatchwiseConv3d, is_patchwise, set_patch_embed
from rewardkit.testing import TINY_KINDS, random_images


def _patchwise(conv: nn.Conv3d) -> nn.Conv3d:
    import copy

    c = copy.deepcopy(conv)
    c.__class__ = PatchwiseConv3d
    return c


def test_patchwise_conv_hand_computed_and_within_rounding_of_the_convolution():
    # hand-computed: 1 channel, 1 frame, 2x2 patches, 2 outputs with integer weights and a bias
    conv = nn.Conv3d(1, 2, kernel_size=(1, 2, 2), stride=(1, 2, 2), bias=True)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[1., 2., 3., 4.], [0., -1., 0., 1.]]).view(2, 1, 1, 2, 2))
        conv.bias.copy_(torch.tensor([0.5, -2.0]))
    x = torch.tensor([[1., 1., 1., 1.], [1., 0., 2., 3.]]).view(2, 1, 1, 2, 2)
    want = torch.tensor([[1 + 2 + 3 + 4 + 0.5, 0 - 1 + 0 + 1 - 2.0],
                         [1 + 0 + 6 + 12 + 0.5, 0 - 0 + 0 + 3 - 2.0]]).view(2, 2, 1, 1, 1)
    assert torch.equal(_patchwise(conv)(x), want) and torch.equal(conv(x), want)
    # Qwen's shape (3 channels, 2 frames, 14x14 patches), with and without bias: the product sums in another
    # order than oneDNN's convolution, so the two agree to float rounding, not bit for bit
    torch.manual_seed(0)
    for bias in (False, True):
        conv = nn.Conv3d(3, 32, kernel_size=(2, 14, 14), stride=(2, 14, 14), bias=bias)
        x = torch.randn(64, 3, 2, 14, 14)
        with torch.no_grad():
            got, ref = _patchwise(conv)(x), conv(x)
        assert got.shape == ref.shape == (64, 32, 1, 1, 1)
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=0)
        # the product itself: each output the dot product of the flattened patch with the flattened filter
        by_hand = torch.einsum("nk,dk->nd", x.reshape(64, -1).double(), conv.weight.reshape(32, -1).double())
        if bias:
            by_hand = by_hand + conv.bias.double()
        torch.testing.assert_close(got.view(64, 32).double(), by_hand, atol=2e-5, rtol=0)
        # an input larger than one kernel is a real convolution: it goes to the convolution, unchanged
        big = torch.randn(2, 3, 2, 28, 42)
        with torch.no_grad():
            assert torch.equal(_patchwise(conv)(big), conv(big))


def test_only_non_overlapping_convolutions_qualify():
    assert is_patchwise(nn.Conv3d(3, 8, kernel_size=(2, 14, 14), stride=(2, 14, 14), bias=False))
    assert not is_patchwise(nn.Conv3d(3, 8, kernel_size=(2, 14, 14), stride=(1, 14, 14)))
    assert not is_patchwise(nn.Conv3d(3, 8, kernel_size=2, stride=2, padding=1))
    assert not is_patchwise(nn.Conv3d(4, 8, kernel_size=2, stride=2, groups=2))
    assert not is_patchwise(nn.Conv3d(3, 8, kernel_size=2, stride=2, dilation=2))
    assert not is_patchwise(nn.Conv2d(3, 8, kernel_size=14, stride=14))


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_switching_in_place_keeps_the_weights_and_conv_restores_the_stock_numbers(kind):
    import copy

    vlm, proc = TINY_KINDS[kind]()
    vlm.eval()
    stock = copy.deepcopy(vlm)
    before = {k: (v.shape, v.data_ptr()) for k, v in vlm.state_dict().items()}
    assert set_patch_embed(vlm, "linear") == 1
    proj = vlm.model.visual.patch_embed.proj
    assert type(proj) is PatchwiseConv3d and isinstance(proj, nn.Conv3d)
    assert {k: (v.shape, v.data_ptr()) for k, v in vlm.state_dict().items()} == before  # same tensors, same keys
    assert type(copy.deepcopy(vlm).model.visual.patch_embed.proj) is PatchwiseConv3d
    enc = proc(text=["<|vision_start|><|image_pad|><|vision_end|>hi"], images=random_images(1, size=56),
               return_tensors="pt")
    pe = vlm.model.visual.patch_embed
    with torch.no_grad():
        lin = pe(enc["pixel_values"])
        set_patch_embed(vlm, "conv")
        assert type(proj) is nn.Conv3d
        assert torch.equal(pe(enc["pixel_values"]), stock.model.visual.patch_embed(enc["pixel_values"]))
        assert torch.equal(vlm(**enc).logits, stock(**enc).logits)
    torch.testing.assert_close(lin, pe(enc["pixel_values"]), atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="patch_embed must be one of"):
        set_patch_embed(vlm, "fused")
    assert set_patch_embed(nn.Sequential(nn.Linear(2, 2)), "linear") == 0  # nothing to switch: no change


_FUSED_CHILD = textwrap.dedent("""
    import json, sys, torch, transformers
    from pathlib import Path
    from safetensors.torch import load_file, save_file
    from transformers.core_model_loading import Conv3dToLinear

    def run(src, inputs, out):
        model = transformers.AutoModelForImageTextToText.from_pretrained(src, fusion_config={"patch_embeddings": True})
        model.eval()
        pe = model.model.visual.patch_embed
        assert type(pe).__name__.startswith("Fused") and not hasattr(pe, "proj"), type(pe)
        # transformers 5.24 does not convert Qwen2-VL / Qwen2.5-VL checkpoints for this fusion: their class-name key
        # mapping shadows the fusion's model-type mapping (conversion_mapping.get_model_conversion_mapping), and
        # the fused weight stays randomly initialised. Load it with transformers' own conversion op.
        ckpt = load_file(str(Path(src) / "model.safetensors"))
        key = next(k for k in ckpt if k.endswith("patch_embed.proj.weight"))
        op = Conv3dToLinear(in_channels=3, kernel_size=tuple(ckpt[key].shape[2:]))
        w = op.convert({key: ckpt[key]}, [key], ["w"])["w"]
        converted_on_load = torch.equal(pe.linear_proj.weight, w)
        with torch.no_grad():
            pe.linear_proj.weight.copy_(w)
            bias = ckpt.get(key[:-len("weight")] + "bias")
            if bias is not None:
                pe.linear_proj.bias.copy_(bias)
        x = load_file(inputs)
        with torch.no_grad():
            hidden = model.model(**x).last_hidden_state
            patches = pe(x["pixel_values"])
        save_file({"hidden": hidden.contiguous(), "patches": patches.contiguous()}, out)
        return converted_on_load

    # (checkpoint, inputs, output) per model kind, in one process (each start imports torch and transformers)
    args = sys.argv[1:]
    print(json.dumps({src: run(src, inp, out) for src, inp, out in zip(args[0::3], args[1::3], args[2::3])}))
""")
_KINDS = ["qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def fused_reference(tmp_path_factory):
    """Per model kind: ``(checkpoint dir, processor inputs, transformers' fused outputs, whether transformers'
    own loading converted the weight)``, the reference computed for both kinds in one separate process."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    if not hasattr(transformers, "fusion_mapping") and not _has_fusion_mapping():
        pytest.skip("this transformers has no fusion_mapping")
    root = tmp_path_factory.mktemp("fused")
    texts = ["<|vision_start|><|image_pad|><|vision_end|>a cat", "<|vision_start|><|image_pad|><|vision_end|>x"]
    encs, argv = {}, []
    for kind in _KINDS:
        vlm, proc = TINY_KINDS[kind]()
        vlm.save_pretrained(root / kind)
        encs[kind] = proc(text=texts, images=random_images(2, sizes=[(56, 56), (40, 64)]), padding=True,
                          return_tensors="pt")
        save_file({k: v.contiguous() for k, v in encs[kind].items()}, str(root / f"{kind}.in.safetensors"))
        argv += [str(root / kind), str(root / f"{kind}.in.safetensors"), str(root / f"{kind}.out.safetensors")]
    run = subprocess.run([sys.executable, "-c", _FUSED_CHILD, *argv], check=True, timeout=300,
                         capture_output=True, text=True)
    converted = json.loads(run.stdout.strip().splitlines()[-1])
    return {kind: (root / kind, encs[kind], load_file(str(root / f"{kind}.out.safetensors")),
                   converted[str(root / kind)]) for kind in _KINDS}


@pytest.mark.slow  # a separate process (the reference)
@pytest.mark.parametrize("kind", _KINDS)
def test_linear_patch_embedding_is_transformers_fused_forward_bit_for_bit(kind, fused_reference):
    """The reference is transformers' own fusion (``from_pretrained(..., fusion_config={"patch_embeddings":
    True})``, transformers/fusion_mapping.py), in a separate process: it registers the fusion process-wide."""
    import transformers

    model_dir, enc, want, converted_on_load = fused_reference[kind]
    if kind == "qwen3_vl":  # transformers' own loading converts this one (Qwen2.5-VL's: see the child)
        assert converted_on_load is True
    ours = transformers.AutoModelForImageTextToText.from_pretrained(str(model_dir)).eval()  # a user's load
    x = dict(enc)
    with torch.no_grad():
        stock_hidden = ours.model(**x).last_hidden_state
        set_patch_embed(ours, "linear")
        hidden = ours.model(**x).last_hidden_state
        patches = ours.model.visual.patch_embed(x["pixel_values"])
    assert torch.equal(patches, want["patches"])
    assert torch.equal(hidden, want["hidden"])
    # the comparison can tell: the stock convolution is not bit for bit the product, only within rounding
    assert not torch.equal(stock_hidden, hidden)
    torch.testing.assert_close(stock_hidden, hidden, atol=1e-5, rtol=0)


def _has_fusion_mapping() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers.fusion_mapping") is not None
