"""``jpeg-compressibility`` / ``jpeg-incompressibility`` equal DDPO's and flow_grpo's formulas (transcribed in
tests/helpers/host_rewards.py with file and line) on 20 images, float tensors as the hosts pass them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.host_rewards import (ddpo_jpeg_compressibility, flow_grpo_jpeg_compressibility,
                                        host_jpeg_incompressibility)


def _twenty_images() -> torch.Tensor:
    """20 float NCHW images in [0, 1] of very different JPEG sizes: noise, gradients, flat, stripes, and
    values just around the rounding midpoints (x * 255 = k + 0.5)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(20):
        kind = i % 5
        if kind == 0:
            x = torch.rand(3, 48, 48, generator=g)
        elif kind == 1:
            x = torch.linspace(0, 1, 48).view(1, 1, 48).expand(3, 48, 48).clone()
        elif kind == 2:
            x = torch.full((3, 48, 48), (i * 13 % 255 + 0.5) / 255)  # exactly on a rounding midpoint
        elif kind == 3:
            x = (torch.arange(48).view(1, 48, 1) // (1 + i % 4) % 2).float().expand(3, 48, 48).clone()
        else:
            x = (torch.rand(3, 48, 48, generator=g) * 0.2 + 0.4)
        out.append(x)
    return torch.stack(out)


IMAGES = _twenty_images()


def test_incompressibility_equals_the_hosts_formula_on_20_images():
    from rewardkit import load_reward

    got = load_reward("jpeg_incompressibility")(IMAGES).scores.double().numpy()
    want = host_jpeg_incompressibility(IMAGES)
    assert len(set(np.round(want, 3))) > 8  # the images differ in size: a constant would fail
    np.testing.assert_array_equal(got, want.astype(np.float32))  # scores are float32


def test_compressibility_ddpo_and_flow_grpo_scales():
    from rewardkit import load_reward

    ddpo = load_reward("jpeg_compressibility")(IMAGES)
    np.testing.assert_array_equal(ddpo.scores.numpy(), ddpo_jpeg_compressibility(IMAGES).astype(np.float32))
    fg = load_reward("jpeg_compressibility", divisor=500)(IMAGES)
    np.testing.assert_array_equal(fg.scores.numpy(), flow_grpo_jpeg_compressibility(IMAGES).astype(np.float32))
    # the size itself, in kB of 1000 bytes, is a dimension
    np.testing.assert_array_equal(fg.dimensions["size_kb"].numpy(), host_jpeg_incompressibility(IMAGES).astype(np.float32))


def test_hand_computed_scale_and_sign():
    """A 1-pixel-wide bug check by hand: size 12345 bytes -> 12.345 kB; DDPO -12.345; flow_grpo -0.02469."""
    from rewardkit.rewards.jpeg import JpegCompressibility, JpegIncompressibility

    class Fixed:
        def save(self, buf, format, quality):
            assert (format, quality) == ("JPEG", 95)
            buf.write(b"\0" * 12345)

    from rewardkit.rewards.jpeg import jpeg_size_kb

    assert jpeg_size_kb(Fixed()) == 12.345
    assert JpegIncompressibility.sign == 1.0 and JpegCompressibility.sign == -1.0
    # -12.345 / 500 = -0.02469
    assert abs(-jpeg_size_kb(Fixed()) / 500 - (-0.02469)) < 1e-12


def test_a_different_quality_changes_the_scores():
    """The planted bug (quality 90 instead of 95) is caught by the 20-image comparison."""
    from rewardkit import load_reward

    got = load_reward("jpeg_incompressibility", quality=90)(IMAGES).scores.double().numpy()
    assert np.abs(got - host_jpeg_incompressibility(IMAGES)).max() > 0.05


@pytest.mark.parametrize("bad", [{"quality": 0}, {"quality": 101}, {"quality": 9.5}, {"divisor": 0},
                                 {"divisor": float("nan")}])
def test_bad_options_are_refused(bad):
    from rewardkit import load_reward

    with pytest.raises(Exception, match="quality|divisor"):
        load_reward("jpeg_compressibility", **bad)


def test_each_reward_has_its_module_and_the_old_import_paths_still_work():
    """One public reward class per module; ``rewardkit.rewards.jpeg`` re-exports both (and the config and size
    helper), and the registry builds the classes of the new modules."""
    import rewardkit.rewards.jpeg as family
    from rewardkit.registry import get_reward_class
    from rewardkit.rewards.jpeg_compressibility import JpegCompressibility
    from rewardkit.rewards.jpeg_incompressibility import JpegConfig, JpegIncompressibility, jpeg_size_kb

    assert JpegCompressibility.__module__ == "rewardkit.rewards.jpeg_compressibility"
    assert JpegIncompressibility.__module__ == "rewardkit.rewards.jpeg_incompressibility"
    assert (family.JpegCompressibility, family.JpegIncompressibility, family.JpegConfig, family.jpeg_size_kb) == (
        JpegCompressibility, JpegIncompressibility, JpegConfig, jpeg_size_kb)
    assert set(family.__all__) == {"JpegCompressibility", "JpegIncompressibility", "jpeg_size_kb"}
    assert get_reward_class("jpeg-compressibility") is JpegCompressibility
    assert get_reward_class("jpeg_incompressibility") is JpegIncompressibility
    assert issubclass(JpegCompressibility, JpegIncompressibility)  # as before the split
