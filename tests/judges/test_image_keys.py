"""The transformers judge's image content keys (rewardkit.judges._image_keys): a cheap fingerprint first, a full
content hash only where fingerprints meet; equal keys exactly for equal pixels, never a wrong match."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from PIL import Image

from rewardkit.judges._image_keys import ImageKeys, fingerprint
from rewardkit.media import image_hash

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def picture(seed: int, size=(64, 48)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def twin_but_one_pixel(im: Image.Image) -> Image.Image:
    """A copy that differs in one pixel the fingerprint's sample does not read (so the fingerprints are equal)."""
    for x in range(im.width):
        other = im.copy()
        r, g, b = other.getpixel((x, 1))
        other.putpixel((x, 1), ((r + 1) % 256, g, b))
        if fingerprint(other) == fingerprint(im):
            assert other.tobytes() != im.tobytes()
            return other
    raise AssertionError("every pixel of row 1 is sampled")


def test_distinct_fingerprints_need_no_full_hash():
    keys = ImageKeys()
    ims = [picture(i) for i in range(5)] + [picture(9, (30, 20))]
    got = [keys.key(im) for im in ims]
    assert len(set(got)) == len(ims) and keys.full_hashes == 0
    assert got[-1].startswith("30x20:RGB:")


def test_same_size_images_that_share_a_fingerprint_get_different_keys():
    keys = ImageKeys()
    a = picture(1)
    b = twin_but_one_pixel(a)
    c = twin_but_one_pixel(b)
    ka, kb, kc = keys.key(a), keys.key(b), keys.key(c)
    assert len({ka, kb, kc}) == 3  # a wrong shared key would be a wrong score
    # equal pixels in new objects: the key of the first of them, whichever it was
    assert keys.key(a.copy()) == ka and keys.key(b.copy()) == kb and keys.key(c.copy()) == kc
    assert [keys.digest(k) for k in (ka, kb, kc)] == [image_hash(x) for x in (a, b, c)]


def test_mode_and_size_are_part_of_the_key():
    keys = ImageKeys()
    a = picture(2, (32, 32))
    flat = Image.frombytes("RGB", (16, 64), a.tobytes())  # the same bytes, another shape
    assert len({keys.key(a), keys.key(a.convert("RGBA")), keys.key(flat)}) == 3


@pytest.mark.parametrize("hold", [0, 64 * 48 * 3 * 2, 2 ** 30])
def test_kept_images_are_bounded_and_twins_still_match(hold):
    """Past ``hold_bytes`` the oldest images are hashed and let go; a twin arriving later matches either way."""
    keys = ImageKeys(hold_bytes=hold)
    ims = [picture(i) for i in range(6)]
    first = [keys.key(im) for im in ims]
    assert keys._held_bytes <= hold and all(e.im is None for e in keys._by_key.values() if e.digest is not None)
    assert len(keys._held) == min(len(ims), hold // (64 * 48 * 3))
    copies = [im.copy() for im in ims]
    del ims
    assert [keys.key(im) for im in copies] == first


def test_session_reuses_features_for_equal_pixels_across_calls(tiny_qwen2_5_vl_dir):
    """Across the calls of a session, equal pixels in new objects (a later chunk's decode of the same file) are
    encoded once; an image that differs in one unsampled pixel is encoded again and scores as itself."""
    from rewardkit.judges import load_judge

    judge = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")

    def conv(im):
        return [{"role": "user", "content": [{"type": "image", "image": im},
                                             {"type": "text", "text": "Is there a cat? Answer Yes or No."}]}]

    a = picture(3, (56, 56))
    b = twin_but_one_pixel(a)
    judge.stats.clear()
    with judge.session():
        p1 = judge.raw_choice_probs([conv(a)], ["Yes"])
        p2 = judge.raw_choice_probs([conv(a.copy())], ["Yes"])
        pb = judge.raw_choice_probs([conv(b)], ["Yes"])
    assert judge.stats["images_encoded"] == 2
    assert torch.equal(p1, p2)
    alone = judge.raw_choice_probs([conv(b)], ["Yes"])  # b in a fresh call: its own features
    assert torch.equal(pb, alone)


def test_threads_calling_one_judge_get_their_own_answers(tiny_qwen2_5_vl_dir):
    """The keys live in the judge's session, under its lock: threads scoring different images concurrently get
    what each gets alone."""
    from rewardkit.judges import load_judge

    judge = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")
    ims = [picture(10 + i, (56, 56)) for i in range(4)] + [twin_but_one_pixel(picture(10, (56, 56)))]

    def conv(im):
        return [{"role": "user", "content": [{"type": "image", "image": im},
                                             {"type": "text", "text": "A dog? Yes or No."}]}]

    want = [judge.raw_choice_probs([conv(im)], ["Yes", "No"]) for im in ims]
    got: dict[int, torch.Tensor] = {}

    def run(i):
        for _ in range(3):
            with judge.session():
                got[i] = judge.raw_choice_probs([conv(ims[i])], ["Yes", "No"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ims))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(got[i], want[i]) for i in range(len(ims)))
