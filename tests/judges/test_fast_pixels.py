"""The transformers judge's vision inputs (rewardkit.judges._pixels) equal transformers' PIL image processor's,
bit for bit, and a judge call through them gives the old path's answers exactly (issue 41, item 3).

The reference is always ``Qwen2VLImageProcessorPil`` itself (``image_processor(images=..., return_tensors="pt")``),
on the images the judge hands it: canonical RGB images from :func:`rewardkit.media._to_pil` (grey, RGBA, palette,
16-bit, float inputs are converted there first, as before this change), of sizes that keep their size, grow
(``min_pixels``), shrink (``max_pixels``), change aspect ratio, are odd, and repeat out of order.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from PIL import Image  # noqa: E402

from rewardkit.judges._pixels import JudgePixels  # noqa: E402
from rewardkit.judges.transformers_backend import TransformersJudge  # noqa: E402
from rewardkit.media import _to_pil  # noqa: E402
from rewardkit.testing import random_images, tiny_qwen2_5_vl, tiny_qwen3_vl  # noqa: E402

BUILDERS = {"qwen2_5_vl": tiny_qwen2_5_vl, "qwen3_vl": tiny_qwen3_vl}


def _inputs() -> list:
    """Judge inputs of many kinds and sizes (w, h), as the caller passes them (not yet canonical)."""
    rng = np.random.default_rng(7)
    out: list = random_images(3, sizes=[(56, 56), (33, 47), (200, 120)], seed=5)  # kept, odd, shrunk
    out.append(Image.fromarray(rng.integers(0, 256, (9, 61), dtype=np.uint8), "L"))  # grey, tiny and odd
    out.append(Image.fromarray(rng.integers(0, 256, (45, 29, 4), dtype=np.uint8), "RGBA"))  # alpha
    out.append(Image.fromarray(rng.integers(0, 65536, (70, 31), dtype=np.uint16)))  # 16-bit grey (I;16)
    out.append(Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), "RGB").convert("P"))  # palette
    out.append(rng.random((23, 97, 3)).astype(np.float32))  # float array in [0, 1]
    out.append(random_images(1, sizes=[(56, 56)], seed=9)[0])  # a repeated size, not next to the first
    out.append(Image.fromarray(rng.integers(0, 256, (3, 500, 3), dtype=np.uint8), "RGB"))  # aspect ratio 167
    return out


def _processors() -> dict:
    """Qwen-VL PIL image processors with the settings a checkpoint may carry."""
    P = transformers.Qwen2VLImageProcessorPil
    return {
        "tiny_qwen2_5_vl": tiny_qwen2_5_vl()[1].image_processor,  # patch 14, 28^2..4 * 28^2
        "tiny_qwen3_vl": tiny_qwen3_vl()[1].image_processor,  # patch 16
        "default": P(),  # Qwen2-VL's own: 56^2 .. 28^2 * 1280 pixels (everything here grows to 56^2 at least)
        "max_pixels_small": P(min_pixels=14 * 14, max_pixels=28 * 28 * 3),  # most images shrink
        "min_pixels_large": P(min_pixels=28 * 28 * 20, max_pixels=28 * 28 * 64),  # most images grow
        "size_dict": P(size={"shortest_edge": 32 * 32, "longest_edge": 32 * 32 * 8}, patch_size=16),
        "bilinear_custom_norm": P(resample=Image.Resampling.BILINEAR, image_mean=[0.5, 0.25, 0.75],
                                  image_std=[0.2, 0.3, 0.4], min_pixels=28 * 28, max_pixels=28 * 28 * 6),
        "no_normalize": P(do_normalize=False, min_pixels=28 * 28, max_pixels=28 * 28 * 6),
        "temporal_1": P(temporal_patch_size=1, min_pixels=28 * 28, max_pixels=28 * 28 * 6),
    }


@pytest.fixture(scope="module")
def canonical():
    return [_to_pil(x) for x in _inputs()]


@pytest.mark.parametrize("name", sorted(_processors()))
def test_judge_pixels_equal_the_processor(name, canonical):
    ip = _processors()[name]
    ref = ip(images=canonical, return_tensors="pt")
    pixels = JudgePixels(ip)
    first = pixels(canonical)  # checked against the processor: the processor's own output is returned
    assert pixels.fast is True
    got = pixels(canonical)  # from now on the batched path
    for out in (first, got):
        assert out["pixel_values"].dtype == ref["pixel_values"].dtype == torch.float32
        assert out["image_grid_thw"].dtype == ref["image_grid_thw"].dtype
        assert torch.equal(out["image_grid_thw"], ref["image_grid_thw"])
        assert torch.equal(out["pixel_values"], ref["pixel_values"])
    # one image at a time too (the judge's vision batches are bounded, a batch may hold a single image)
    for im in canonical[:4]:
        one = ip(images=[im], return_tensors="pt")
        mine = pixels([im])
        assert torch.equal(mine["pixel_values"], one["pixel_values"])
        assert torch.equal(mine["image_grid_thw"], one["image_grid_thw"])


def test_the_processor_is_kept_where_the_fast_path_does_not_apply(canonical):
    ip = transformers.Qwen2VLImageProcessorPil(resample=Image.Resampling.NEAREST, min_pixels=28 * 28,
                                               max_pixels=28 * 28 * 4)
    pixels = JudgePixels(ip)
    out = pixels(canonical[:3])
    ref = ip(images=canonical[:3], return_tensors="pt")
    assert torch.equal(out["pixel_values"], ref["pixel_values"])
    assert pixels.fast is None  # never taken, never judged


def test_a_difference_on_the_first_batch_retires_the_fast_path(canonical, monkeypatch):
    import rewardkit.models.pil_pixels as pp

    ip = tiny_qwen2_5_vl()[1].image_processor
    real = pp.pil_pixel_values

    def off_by_a_bit(images, image_processor):
        out = real(images, image_processor)
        out["pixel_values"][0, 0] = torch.nextafter(out["pixel_values"][0, 0], torch.tensor(10.0))
        return out

    monkeypatch.setattr(pp, "pil_pixel_values", off_by_a_bit)
    pixels = JudgePixels(ip)
    ref = ip(images=canonical, return_tensors="pt")
    assert torch.equal(pixels(canonical)["pixel_values"], ref["pixel_values"])
    assert pixels.fast is False
    assert torch.equal(pixels(canonical)["pixel_values"], ref["pixel_values"])  # the processor from now on


# ------------------------------------------------------------------------------------------- the judge
def _convs(ims):
    def conv(images, q):
        return [{"role": "system", "content": "You are a judge."},
                {"role": "user", "content": [*({"type": "image", "image": i} for i in images),
                                             {"type": "text", "text": q}]}]

    return [conv([ims[0]], "Is there a cat? Answer Yes or No."),
            conv([ims[1], ims[2]], "Is the second image brighter? Answer Yes or No."),
            conv([ims[3]], "Yes or No?"),
            conv([ims[4], ims[5], ims[6]], "Three images: Yes or No?"),
            conv([ims[7]], "Does this figure show a dog? Answer Yes or No."),
            conv([ims[8], ims[0]], "Same? Yes or No."),
            conv([ims[9]], "A thin strip: Yes or No?")]


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tiny(request):
    return BUILDERS[request.param]()


def test_judge_token_ids_equal_the_processors(tiny):
    """The text side: the chat template and each image placeholder expanded to the image's token count, as the
    processor's ``input_ids`` (its own image call decides the counts there)."""
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    ims = _inputs()
    convs = _convs(ims)
    for _ in range(2):  # the first call checks the pixels against the processor, the second uses them
        prepared, feats = judge._prepare(convs)
        for c, p in zip(convs, prepared):
            text = proc.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
            pics = [_to_pil(item["image"]) for item in c[1]["content"] if item.get("type") == "image"]
            ref = proc(text=[text], images=pics, return_tensors="pt")
            assert p.ids == ref["input_ids"][0].tolist()
            assert torch.equal(torch.stack([feats[h].grid_thw for h in p.images]), ref["image_grid_thw"])
    assert judge.pixels.fast is True


def test_judge_answers_equal_the_processor_paths(tiny):
    """Choice probabilities and greedy texts through the batched pixels equal the processor path's, bit for bit
    (the vision tower gets the same tensor)."""
    model, proc = tiny
    convs = _convs(_inputs())
    old = TransformersJudge(model, proc)
    old.pixels.fast = False  # the image processor on every call (the path before issue 41)
    new = TransformersJudge(model, proc)
    new.choice_probs(convs[:1], ["Yes", "No"])  # the first batch: checked against the processor
    assert new.pixels.fast is True
    want = old.choice_probs(convs, ["Yes", "No"])
    got = new.choice_probs(convs, ["Yes", "No"])
    assert torch.equal(got, want)
    assert new.generate(convs, max_new_tokens=4) == old.generate(convs, max_new_tokens=4)
