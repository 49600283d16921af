"""Qwen-VL pixel values for PIL images in torch (rewardkit.models.pil_pixels) equal the PIL processor's, bit
for bit: the reference is transformers' ``Qwen2VLImageProcessorPil`` itself, and the 8-bit table is checked
against the processor's own ``rescale`` / ``normalize`` (``transformers/image_transforms.py``) for all 256
values of each channel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rewardkit.models.pil_pixels import pil_pixel_values, rescale_normalize_table


def _processor(kind: str):
    from rewardkit.testing import TINY_KINDS

    return TINY_KINDS[kind]()[1].image_processor


def test_table_is_the_processors_rescale_and_normalize_for_every_value():
    from transformers.image_transforms import normalize, rescale

    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]  # Qwen-VL's
    values = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 1, 256)).copy()  # CHW, every value per channel
    want = normalize(rescale(values, 1 / 255), mean, std)
    got = rescale_normalize_table(1 / 255, mean, std)
    assert want.dtype == np.float32
    assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(want[:, 0, :])))


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_pil_pixel_values_equal_the_processor(kind):
    from rewardkit.testing import random_images

    ip = _processor(kind)
    # sizes that keep their size, that are resized up, down and to another aspect ratio; repeated sizes
    ims = random_images(2, size=56) + random_images(2, size=64) + [random_images(1, size=33)[0].resize((90, 40))]
    ims += [random_images(1, size=200)[0], random_images(1, size=56, seed=3)[0]]
    ref = ip(images=ims, return_tensors="pt")
    got = pil_pixel_values(ims, ip)
    assert got is not None
    assert torch.equal(got["image_grid_thw"], ref["image_grid_thw"])
    assert got["pixel_values"].dtype == ref["pixel_values"].dtype
    assert torch.equal(got["pixel_values"], ref["pixel_values"])


def test_pil_pixel_values_decline_what_they_do_not_reproduce():
    from PIL import Image

    ip = _processor("qwen2_5_vl")
    assert pil_pixel_values([Image.new("RGBA", (56, 56))], ip) is None  # the processor converts; we do not
    assert pil_pixel_values([], ip) is None
    ip.resample = 0  # nearest: not a filter this path takes
    assert pil_pixel_values([Image.new("RGB", (56, 56))], ip) is None


def test_clip_pil_pixel_values_equal_the_processor(tiny_clip_dir):
    """CLIP: resize of the shortest edge (up, down, unchanged), center crop of odd margins, rescale, normalise."""
    import transformers

    from rewardkit.models.pil_pixels import clip_pil_pixel_values
    from rewardkit.testing import random_images

    ip = transformers.AutoProcessor.from_pretrained(tiny_clip_dir).image_processor
    assert type(ip).__name__ == "CLIPImageProcessorPil"
    ims = random_images(6, sizes=[(32, 32), (40, 64), (64, 40), (33, 47), (96, 24), (17, 17)], seed=3)
    got = clip_pil_pixel_values(ims, ip)
    ref = ip(images=ims, return_tensors="pt")["pixel_values"]
    assert got is not None and got.dtype == ref.dtype and torch.equal(got, ref)


def test_clip_backbone_uses_the_batched_pixels_after_checking_them(tiny_clip_dir):
    from rewardkit import load_reward
    from rewardkit.testing import random_images

    reward = load_reward("clipscore", model=str(tiny_clip_dir))
    ims = random_images(4, sizes=[(32, 32), (40, 64), (64, 40), (33, 47)], seed=1)
    first = reward(ims, "a cat").scores  # checked against the processor: its output is used
    assert reward.backbone._fast_pixels is True
    assert torch.equal(reward(ims, "a cat").scores, first)  # the batched path: the same scores, bit for bit

