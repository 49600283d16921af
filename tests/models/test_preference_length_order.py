"""PreferenceModel.encode_by_length (issue 41): on CPU a batch of mixed sequence lengths is encoded in order of
length, so that forward_grouped's length groups are runs of rows passed on as views; the predicted order is the
one the encoded lengths give, and the scores are exactly those of the batch in the caller's order."""

from __future__ import annotations

import pytest
import torch

from rewardkit.models.preference import PreferenceModel, _base
from rewardkit.models.preference_inputs import split_by_length
from rewardkit.testing import random_images

# samples of one length are not neighbours: 0 and 2 share a size, 1 and 4 share one (64x40 and 40x64 give the same
# number of image tokens), 3 is alone
SIZES = [(32, 32), (64, 40), (32, 32), (56, 56), (40, 64)]
PROMPTS = ["a cat"] * 5


@pytest.fixture(scope="module")
def model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        m = PreferenceModel.from_backbone("tiny:qwen2_5_vl", head="uncertainty")
    return m.eval()


@pytest.fixture(scope="module")
def images():
    return random_images(5, sizes=SIZES)


def _lengths(model, images, prompts, sources=None) -> list[int]:
    """The sequence lengths the processor gives (its attention mask), one sample at a time."""
    return [int(model.encode([im], [p], None if sources is None else [s])["attention_mask"].sum())
            for im, p, s in zip(images, prompts, sources or [None] * len(images))]


def test_the_order_is_the_encoded_lengths_sorted(model, images):
    lengths = _lengths(model, images, PROMPTS)
    assert lengths[0] == lengths[2] and lengths[1] == lengths[4] and len(set(lengths)) == 3  # the fixture's premise
    order = model.input_encoder().length_order(images, PROMPTS)
    assert order == sorted(range(5), key=lengths.__getitem__)  # stable: equal lengths keep their order
    # with sources and different prompts: the text and every image count
    srcs = [[], [images[3]], [], [], [images[0], images[2]]]
    prompts = ["a cat", "x", "a red car on a long road at night", "a cat", "x"]
    lengths = _lengths(model, images, prompts, srcs)
    order = model.input_encoder().length_order(images, prompts, srcs)
    runs = [x for i, x in enumerate(lengths) if i == 0 or x != lengths[i - 1]]
    assert (order is None) == (len(runs) == len(set(runs)))
    if order is not None:
        assert order == sorted(range(5), key=lengths.__getitem__)


def test_no_order_when_nothing_is_gained(model, images):
    enc = model.input_encoder()
    assert enc.length_order(images[:2], PROMPTS[:2]) is None  # two samples: any grouping is a run
    assert enc.length_order([images[0], images[2], images[1]], PROMPTS[:3]) is None  # lengths already together
    assert enc.length_order([images[0], images[3], images[2]], PROMPTS[:3]) == [0, 2, 1]
    assert enc.length_order(["not an image"] * 3, PROMPTS[:3]) is None  # the encoding says why, not this


def test_scores_equal_the_given_order_and_groups_are_views(model, images):
    srcs = [[], [images[3]], [], [], [images[3]]]  # an edit pair among text-to-image samples
    enc0 = model.encode(images, PROMPTS, srcs)
    r0, l0 = model.forward_grouped(**enc0)
    enc, order = model.encode_by_length(images, PROMPTS, srcs)
    assert order is not None and order.tolist() != list(range(5))
    for k in enc0:  # the same encoding, rows permuted
        if k in ("input_ids", "attention_mask", "mm_token_type_ids"):
            assert torch.equal(enc[k], enc0[k][order])
    r, l = model.forward_grouped(order, **enc)
    assert torch.equal(r, r0) and torch.equal(l, l0)  # exactly, in the caller's order
    cfg = _base(model.vlm).config
    groups = split_by_length(enc, int(cfg.image_token_id), int(cfg.vision_config.spatial_merge_size))
    assert len(groups) == 3
    storage = enc["pixel_values"].untyped_storage().data_ptr()
    for idx, sub in groups:
        assert idx.tolist() == list(range(int(idx[0]), int(idx[-1]) + 1))
        assert sub["pixel_values"].untyped_storage().data_ptr() == storage  # a view: no copy of the pixels
    # and the score() path gives the same
    r2, l2 = model.score(images, PROMPTS, srcs)
    assert torch.equal(r2, r0) and torch.equal(l2, l0)
