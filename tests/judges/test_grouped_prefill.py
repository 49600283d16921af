"""Prefixes of different lengths (images of mixed sizes) are prefilled on CPU in buckets of similar length, one
forward each, and laid out as the one padded forward did (issue 41, item 2): the buckets are the least-cost
split (hand-computed cases), the stacked state holds each bucket's own state in its rows, and the answers equal
the padded path's and the full forward's within the batching bound (1e-5 absolute on probabilities, the bound
tests/judges/test_transformers_backend.py holds batched against one by one; the difference is float rounding
of other batch shapes and of a masked against a causal attention kernel). The tiny models' forwards are cheap
in tokens, so the tests set ``prefill_forward_tokens = 0`` (one bucket per length) to take the split path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rewardkit.judges._transformers_cache import length_buckets  # noqa: E402
from rewardkit.judges.transformers_backend import TransformersJudge  # noqa: E402
from rewardkit.testing import random_images, tiny_qwen2_5_vl, tiny_qwen3_vl  # noqa: E402

BUILDERS = {"qwen2_5_vl": tiny_qwen2_5_vl, "qwen3_vl": tiny_qwen3_vl}
BOUND = 1e-5


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tiny(request):
    return BUILDERS[request.param]()


@pytest.fixture(scope="module")
def images():
    # 4, 2, 1, 4 (same length as the first) and 2 merged tokens: three lengths, two of them shared
    return random_images(5, sizes=[(56, 56), (56, 28), (28, 28), (60, 50), (30, 60)], seed=21)


def convs(images):
    def conv(im, q):
        return [{"role": "user", "content": [{"type": "image", "image": im}, {"type": "text", "text": q}]}]

    return [conv(im, "Does this figure show a red cube? Answer Yes or No.") for im in images]


@pytest.mark.parametrize("lengths, cost, want", [
    ([10, 10, 10], 5, [[0, 1, 2]]),  # one length: one forward
    ([100, 10], 5, [[1], [0]]),  # padded: 5 + 2 * 100 = 205; split: 5 + 10 + 5 + 100 = 120
    ([100, 95], 20, [[0, 1]]),  # padded: 20 + 200 = 220; split: 20 + 100 + 20 + 95 = 235
    # 161 all in one; {10} {50, 52}: 5 + 10 + 5 + 104 = 124; each alone: 15 + 112 = 127; {10, 50} {52}: 162
    ([52, 10, 50], 5, [[1], [0, 2]]),
    ([52, 10, 50, 10], 0, [[1, 3], [2], [0]]),  # free forwards: one per length
    ([52, 10, 50], float("inf"), [[0, 1, 2]]),
])
def test_length_buckets_are_the_least_cost_split(lengths, cost, want):
    assert length_buckets(lengths, cost) == want


def test_the_stacked_state_holds_each_groups_own_state(tiny, images):
    """Row r of the grouped state is row r of its group's own padded prefill (bit for bit), right-aligned; the
    columns before it are masked."""
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    judge.prefill_forward_tokens = 0
    with torch.inference_mode():
        prepared, feats = judge._prepare(convs(images))
        prefixes = [(c.ids[:-1], c.images) for c in prepared]
        lengths = [len(p) for p, _ in prefixes]
        assert len(set(lengths)) == 3
        calls = []
        real = judge._prefill_padded
        judge._prefill_padded = lambda ps, fs: calls.append(len(ps)) or real(ps, fs)
        st = judge._prefill(prefixes, feats)
        judge._prefill_padded = real
        assert sorted(calls) == [1, 2, 2]  # one forward per distinct length
        L = max(lengths)
        assert st["mask"].shape == (5, L)
        for length in set(lengths):
            rows = [j for j, n in enumerate(lengths) if n == length]
            alone = real([prefixes[j] for j in rows], feats)
            for i, r in enumerate(rows):
                a = L - length
                assert st["mask"][r].tolist() == [0] * a + [1] * length
                assert st["ids"][r, a:].tolist() == prefixes[r][0]
                assert torch.equal(st["pos"][:, r, a:], alone["pos"][:, i])
                assert int(st["next_pos"][r]) == int(alone["next_pos"][i])
                for lg, la in zip(st["cache"].layers, alone["cache"].layers):
                    assert torch.equal(lg.keys[r, :, a:], la.keys[i])
                    assert torch.equal(lg.values[r, :, a:], la.values[i])
                    assert not lg.keys[r, :, :a].any() and not lg.values[r, :, :a].any()


def test_grouped_answers_equal_the_padded_path_and_one_by_one(tiny, images):
    model, proc = tiny
    grouped, padded = TransformersJudge(model, proc), TransformersJudge(model, proc)
    grouped.prefill_forward_tokens = 0
    padded.group_prefill = False
    cs = convs(images)
    p_grouped = grouped.choice_probs(cs, ["Yes", "No"])
    p_padded = padded.choice_probs(cs, ["Yes", "No"])
    p_single = torch.cat([padded.choice_probs([c], ["Yes", "No"]) for c in cs])
    torch.testing.assert_close(p_grouped, p_padded, atol=BOUND, rtol=0)
    torch.testing.assert_close(p_grouped, p_single, atol=BOUND, rtol=0)
    # the full forward of the model on the processor's inputs, one conversation at a time
    ids = grouped.choice_token_ids(["Yes", "No"])
    with torch.inference_mode():
        for i, c in enumerate(cs):
            text = proc.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
            inp = proc(text=[text], images=[images[i]], return_tensors="pt")
            ref = torch.softmax(model(**inp).logits[0, -1, ids].float(), -1)
            torch.testing.assert_close(p_grouped[i], ref, atol=BOUND, rtol=0)
    assert grouped.generate(cs, max_new_tokens=5) == padded.generate(cs, max_new_tokens=5)


def test_one_length_is_one_padded_forward(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    judge.prefill_forward_tokens = 0
    calls = []
    real = judge._prefill_padded
    judge._prefill_padded = lambda ps, fs: calls.append(len(ps)) or real(ps, fs)
    same = [images[0], images[3]]  # the same number of image tokens: prefixes of one length
    judge.choice_probs(convs(same), ["Yes", "No"])
    assert calls == [2]


def test_forward_cost_follows_the_hidden_size(tiny):
    """The default cost of a forward (4.2e6 / hidden_size**2 tokens): the tiny models (hidden 32) keep one padded
    forward for these prefixes (about 4100 tokens per forward against a few padded ones)."""
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    assert judge.prefill_forward_tokens == pytest.approx(4.2e6 / 32 ** 2)
    assert length_buckets([80, 81, 82, 334], judge.prefill_forward_tokens) == [[0, 1, 2, 3]]
