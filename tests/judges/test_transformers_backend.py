"""Transformers judge backend on tiny Qwen2.5-VL / Qwen3-VL: exactness of prefix-KV reuse, batching, counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rewardkit.judges import ChoiceError, JudgeBackend, load_judge, load_template  # noqa: E402
from rewardkit.judges.transformers_backend import TransformersJudge  # noqa: E402
from rewardkit.testing import random_images, tiny_qwen2_5_vl, tiny_qwen3_vl  # noqa: E402

BUILDERS = {"qwen2_5_vl": tiny_qwen2_5_vl, "qwen3_vl": tiny_qwen3_vl}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tiny(request):
    model, proc = BUILDERS[request.param]()
    return model, proc


@pytest.fixture(scope="module")
def images():
    # different sizes in one batch: different numbers of vision tokens per image
    return random_images(4, sizes=[(56, 56), (40, 64), (64, 32), (28, 28)], seed=3)


def conv(ims, question, system="You are a judge."):
    return [{"role": "system", "content": system},
            {"role": "user", "content": [*({"type": "image", "image": i} for i in ims), {"type": "text", "text": question}]}]


def batch(images):
    a, b, c, d = images
    return [conv([a, b], "Is there a cat? Answer Yes or No."),
            conv([a, b], "Is there a dog? Answer Yes or No."),
            conv([c], "Rate the image 1 2 3 4 5."),
            conv([a, b], "Is there a dog? Answer Yes or No."),  # exact duplicate
            conv([d, c, a], "Three images: Yes or No?"),
            [{"role": "user", "content": "A text-only question: Yes or No?"}]]


def full_forward(model, proc, c):
    """Reference: the processor's ids + pixel values, one conversation, no cache. The images are read from the
    conversation here, in order (not with the backend's own conversation_images, which the judge also uses)."""
    text = proc.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
    ims = [item["image"] for msg in c if isinstance(msg["content"], list) for item in msg["content"]
           if item.get("type") == "image"]
    inp = proc(text=[text], images=ims or None, return_tensors="pt")
    return inp


def test_choice_probs_match_full_forward_and_batching(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    convs = batch(images)
    ids = judge.choice_token_ids(["Yes", "No"])
    probs = judge.choice_probs(convs, ["Yes", "No"])
    assert probs.shape == (len(convs), 2) and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(convs)))
    single = torch.cat([judge.choice_probs([c], ["Yes", "No"]) for c in convs])
    torch.testing.assert_close(probs, single, atol=1e-5, rtol=0)
    with torch.no_grad():
        for i, c in enumerate(convs):
            logits = model(**full_forward(model, proc, c)).logits[0, -1]
            ref = torch.softmax(logits[ids].float(), -1)
            torch.testing.assert_close(probs[i], ref, atol=1e-5, rtol=0)
    # three choices: still a distribution
    p3 = judge.choice_probs(convs[:2], ["1", "2", "3"])
    torch.testing.assert_close(p3.sum(-1), torch.ones(2))


def test_prefix_token_ids_equal_processor_ids(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    convs = batch(images)
    prepared, _ = judge._prepare(convs)
    for c, p in zip(convs, prepared):
        assert p.ids == full_forward(model, proc, c)["input_ids"][0].tolist()


def test_greedy_generate_equals_hf_generate(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc, max_rows=5)  # forces several row chunks
    convs = batch(images)
    out = judge.generate(convs, n=2, max_new_tokens=6, temperature=0.0)
    assert len(out) == len(convs) and all(len(o) == 2 for o in out)
    for c, texts in zip(convs, out):
        inp = full_forward(model, proc, c)
        g = model.generate(**inp, max_new_tokens=6, do_sample=False)
        ref = proc.tokenizer.decode(g[0, inp["input_ids"].shape[1]:], skip_special_tokens=True)
        assert texts == [ref, ref]


def test_greedy_samples_are_decoded_once(tiny, images):
    """At temperature 0 the n samples of a conversation are one text: decoded once, returned n times."""
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    convs = batch(images)
    one = judge.generate(convs, n=1, max_new_tokens=5, temperature=0.0)
    tokens_one = judge.stats["decode_tokens"]
    three = judge.generate(convs, n=3, max_new_tokens=5, temperature=0.0)
    assert three == [t * 3 for t in one]
    assert judge.stats["decode_tokens"] == 2 * tokens_one  # not 1 + 3 times


def test_vision_encoder_sees_each_distinct_image_once_per_session(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    seen = []
    hook = model.model.visual.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(int(kwargs["grid_thw"].shape[0])), with_kwargs=True)
    try:
        convs = batch(images)  # 4 distinct images, used 10 times
        with judge.session():
            judge.generate(convs * 3, n=4, max_new_tokens=3)
            judge.choice_probs(convs * 5, ["Yes", "No"])
        assert sum(seen) == 4
        assert judge.stats["images_encoded"] == 4
        judge.choice_probs(convs, ["Yes", "No"])  # outside a session: once per call
        assert sum(seen) == 8
    finally:
        hook.remove()


def test_stale_rope_deltas_do_not_leak(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    convs = batch(images)[:3]
    before = judge.choice_probs(convs, ["Yes", "No"])
    with torch.no_grad():  # leaves model.model.rope_deltas of another batch shape behind
        model(**full_forward(model, proc, batch(images)[4]))
    torch.testing.assert_close(judge.choice_probs(convs, ["Yes", "No"]), before)


def test_seeded_sampling_does_not_depend_on_the_batch(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    convs = batch(images)
    whole = judge.generate(convs, n=3, temperature=1.0, max_new_tokens=5, seed=7)
    alone = judge.generate([convs[2]], n=3, temperature=1.0, max_new_tokens=5, seed=7)
    assert whole[2] == alone[0]
    assert len(set(whole[2])) > 1  # the samples differ from each other
    assert judge.generate([convs[2]], n=3, temperature=1.0, max_new_tokens=5, seed=8)[0] != alone[0]


def test_stop_strings_and_errors(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    c = batch(images)[:1]
    full = judge.generate(c, max_new_tokens=8)[0][0]
    assert len(full) >= 2
    stop = full[1:3]
    cut = judge.generate(c, max_new_tokens=8, stop=[stop])[0][0]
    assert cut == full[:full.find(stop)]
    with pytest.raises(ChoiceError, match="tokens"):
        judge.choice_probs(c, ["Yes please", "No"])
    with pytest.raises(ChoiceError):
        judge.choice_probs(c, [])
    with pytest.raises(ValueError):
        judge.generate(c, n=0)
    assert judge.generate([], n=2) == []


def test_load_judge_specs(tiny_qwen2_5_vl_dir, tmp_path):
    judge = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")
    assert isinstance(judge, JudgeBackend) and judge.describe()["kind"] == "transformers"
    assert load_judge(judge) is judge
    with pytest.raises(ValueError):
        load_judge(judge, device="cpu")
    assert isinstance(load_judge(str(tiny_qwen2_5_vl_dir)), TransformersJudge)
    with pytest.raises(ValueError, match="unknown judge backend|cannot read"):
        load_judge("nonsense:xyz")
    with pytest.raises(ValueError, match="cannot read"):
        load_judge(str(tmp_path / "missing"))
    with pytest.raises(TypeError):
        load_judge(3)
    with pytest.raises(ValueError, match="model="):
        load_judge("openai:http://127.0.0.1:9/v1")


def test_templates_are_versioned_files():
    t = load_template("evr")
    assert t.id == "evr/default@3" and t.path.endswith("templates/evr/default.yaml")
    assert set(t["dimensions"]) == {"reference_consistency", "scene_consistency", "harmony",
                                    "instruction_consistency", "visual_quality"}
    assert "Score" in t["evaluate_format_cot"]
    with pytest.raises(KeyError, match="instruction"):
        t.render("context", n_refs=2, ref_roles="")
    yn = load_template("judges", "yes_no")
    assert yn.version == "1" and yn.render("question", question="A cat?").startswith("A cat?")
    with pytest.raises(FileNotFoundError, match="available"):
        load_template("evr", "nope")


def test_prefilled_assistant_turn_is_continued(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    c = conv(images[:2], "Rate it.") + [{"role": "assistant", "content": "Score:"}]
    p = judge.choice_probs([c, batch(images)[0]], ["1", "2", "3"])
    text = proc.apply_chat_template(c, tokenize=False, continue_final_message=True)
    assert text.endswith("Score:")
    inp = proc(text=[text], images=images[:2], return_tensors="pt")
    ids = judge.choice_token_ids(["1", "2", "3"])
    with torch.no_grad():
        ref = torch.softmax(model(**inp).logits[0, -1, ids].float(), -1)
    torch.testing.assert_close(p[0], ref, atol=1e-5, rtol=0)


# the judge modules' import weight is checked in test_imports.py (one subprocess for every stage)


def test_unsupported_model_is_refused_clearly():
    from rewardkit.testing import tiny_clip

    model, proc = tiny_clip()
    with pytest.raises(TypeError, match="Qwen-VL-family"):
        TransformersJudge(model, proc)
    with pytest.raises(ValueError, match="processor"):
        TransformersJudge(model)


def test_packed_scoring_equals_one_row_per_question(tiny, images):
    model, proc = tiny
    convs = batch(images) * 3
    packed = TransformersJudge(model, proc, packed_scoring=True, pack_tokens=60)  # several rows per prefix
    assert packed._attn_impl() == "sdpa"
    rows = TransformersJudge(model, proc, packed_scoring=False)
    torch.testing.assert_close(packed.choice_probs(convs, ["Yes", "No"]), rows.choice_probs(convs, ["Yes", "No"]),
                               atol=1e-5, rtol=0)
    model.config._attn_implementation = "eager"  # the float additive-mask path
    model.config.get_text_config()._attn_implementation = "eager"
    try:
        eager = TransformersJudge(model, proc, packed_scoring=True)
        assert eager._attn_impl() == "eager"
        torch.testing.assert_close(eager.choice_probs(convs, ["Yes", "No"]), rows.choice_probs(convs, ["Yes", "No"]),
                                   atol=1e-5, rtol=0)
    finally:
        model.config._attn_implementation = "sdpa"
        model.config.get_text_config()._attn_implementation = "sdpa"


def test_patch_embedding_of_a_loaded_checkpoint_is_one_product_and_a_passed_model_is_left_alone(tiny_qwen2_5_vl_dir):
    """A checkpoint the judge loads gets the patch embedding as one matrix product (rewardkit.models.patch_embed,
    tested against transformers' fused forward in tests/models/test_patch_embed.py); its answers stay within float
    rounding of the stock Conv3d's, which ``patch_embed="conv"`` keeps. A model passed in keeps its own."""
    from torch import nn

    from rewardkit.models.patch_embed import PatchwiseConv3d

    stock = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu", patch_embed="conv")
    lin = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")
    assert type(stock.model.model.visual.patch_embed.proj) is nn.Conv3d
    assert type(lin.model.model.visual.patch_embed.proj) is PatchwiseConv3d
    ims = random_images(2, sizes=[(56, 56), (40, 64)], seed=7)
    qs = [[{"role": "user", "content": [{"type": "image", "image": im},
                                           {"type": "text", "text": "A cat? Yes or No."}]}] for im in ims]
    want = stock.choice_probs(qs, ["Yes", "No"])
    got = lin.choice_probs(qs, ["Yes", "No"])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    passed = TransformersJudge(stock.model, stock.processor)
    assert type(passed.model.model.visual.patch_embed.proj) is nn.Conv3d
    with pytest.raises(ValueError, match="patch_embed must be one of"):
        load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", patch_embed="fused")
