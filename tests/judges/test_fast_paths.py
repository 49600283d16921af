"""Transformers judge: the paths that skip work give the answers of the work they skip.

- a repeated conversation (same token ids and images) is run once per call (EVR's K equal greedy claims);
- continuations and decode steps get the additive 4-D attention mask that transformers (``sdpa_mask``) and
  torch's SDPA would build from the 2-D mask, built once (and on CPU written into one reused buffer);
- a prefill whose prefixes all miss the session cache is itself the prefix state (no copy back).

Each is compared with the computation it replaces: transformers' own mask function, the boolean-mask path of
the same judge, the session cache's assembled state, or transformers' own forward on each conversation.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.masking_utils")  # imported at collection: its first import is slow

from rewardkit.judges import _transformers_cache  # noqa: E402
from rewardkit.judges._transformers_cache import _additive_mask  # noqa: E402
from rewardkit.judges.transformers_backend import TransformersJudge, _unique  # noqa: E402
from rewardkit.testing import random_images, tiny_qwen2_5_vl, tiny_qwen3_vl  # noqa: E402

BUILDERS = {"qwen2_5_vl": tiny_qwen2_5_vl, "qwen3_vl": tiny_qwen3_vl}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def tiny(request):
    return BUILDERS[request.param]()


@pytest.fixture(scope="module")
def images():
    return random_images(4, sizes=[(56, 56), (40, 64), (64, 32), (28, 28)], seed=11)


def conv(ims, question, system="You are a judge."):
    return [{"role": "system", "content": system},
            {"role": "user", "content": [*({"type": "image", "image": i} for i in ims),
                                         {"type": "text", "text": question}]}]


def questions(images):
    """Rows of different lengths; shared prefixes (same images) and distinct ones; a text-only row."""
    a, b, c, d = images
    return [conv([a, b], "Is there a cat? Answer Yes or No."),
            conv([a, b], "Is the second image brighter than the first one? Answer Yes or No."),
            conv([c], "Yes or No?"),
            conv([d, c, a], "Three images, one question about all of them: Yes or No?"),
            [{"role": "user", "content": "A text-only question: Yes or No?"}]]


def full_forward_probs(model, proc, c, ids):
    """Reference: transformers' own forward on the processor's inputs, one conversation, no cache."""
    text = proc.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
    ims = [item["image"] for msg in c if isinstance(msg["content"], list) for item in msg["content"]
           if item.get("type") == "image"]
    inp = proc(text=[text], images=ims or None, return_tensors="pt")
    with torch.inference_mode():
        return torch.softmax(model(**inp).logits[0, -1, ids].float(), -1)


# ------------------------------------------------------------------------------------ additive masks
@pytest.mark.parametrize("offset_from_end", [0, 3])
def test_additive_mask_is_transformers_sdpa_mask_in_float(offset_from_end):
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    # [left pad | prefix | suffix pad | suffix | extra slots]: the layouts the judge builds
    rows = [[0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
            [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]]
    mask = torch.tensor(rows)
    R, W = mask.shape
    S = 5
    offset = W - S - offset_from_end  # queries in columns offset .. offset + S - 1
    # transformers' boolean mask for these queries (masking_utils.sdpa_mask, as create_causal_mask calls it)
    ref_bool = sdpa_mask(batch_size=R, q_length=S, kv_length=W, q_offset=offset, kv_offset=0,
                         mask_function=causal_mask_function, attention_mask=mask.bool(),
                         allow_is_causal_skip=False)
    got = _additive_mask(mask, offset, S, torch.float32)
    assert got.shape == ref_bool.shape == (R, 1, S, W)
    assert torch.equal(got == 0, ref_bool) and bool(((got == 0) | (got == float("-inf"))).all())
    # the same into a reused buffer (a larger one: only its first R * S * W elements are written)
    buf = torch.full((R * S * W + 7,), 5.0)
    assert torch.equal(_additive_mask(mask, offset, S, torch.float32, out=buf), got)
    # and SDPA gives bit for bit the result of the boolean mask it replaces
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(R, 2, n, 8, generator=g) for n in (S, W, W))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(sdpa(q, k, v, attn_mask=got), sdpa(q, k, v, attn_mask=ref_bool))


def _boolean_masks(judge):
    """The same judge on the 2-D mask path (what it did before the additive masks)."""
    judge._additive_masks = lambda: False
    return judge


def test_additive_masks_give_the_boolean_mask_answers(tiny, images):
    model, proc = tiny
    convs = questions(images)
    fast = TransformersJudge(model, proc)
    slow = _boolean_masks(TransformersJudge(model, proc))
    assert fast._additive_masks() and fast._attn_impl() == "sdpa"
    for judge in (fast, slow):
        judge.out = {
            "greedy": judge.generate(convs, max_new_tokens=7),
            # sampled, n=3: the static cache forked per sample, one mask column opened per step
            "sampled": judge.generate(convs, n=3, temperature=1.0, max_new_tokens=7, seed=5),
            "probs": judge.choice_probs(convs, ["Yes", "No"]),
            "raw": judge.raw_choice_probs(convs, ["Yes", "No"]),
        }
    assert fast.out["greedy"] == slow.out["greedy"]
    assert fast.out["sampled"] == slow.out["sampled"]
    assert torch.equal(fast.out["probs"], slow.out["probs"])
    assert torch.equal(fast.out["raw"], slow.out["raw"])
    ids = fast.choice_token_ids(["Yes", "No"])
    for c, p in zip(convs, fast.out["probs"]):
        assert torch.allclose(p, full_forward_probs(model, proc, c, ids), atol=1e-5)


def test_mask_buffer_is_reused_and_changes_nothing(images, monkeypatch):
    model, proc = tiny_qwen2_5_vl()
    convs = questions(images)
    big, small = convs, [convs[2], convs[4]]
    judge = TransformersJudge(model, proc)
    want = [TransformersJudge(model, proc).choice_probs(x, ["Yes", "No"]) for x in (big, small, big)]
    got = [judge.choice_probs(big, ["Yes", "No"])]
    buf = judge._mask_buf
    assert buf is not None and buf.dtype == model.dtype
    got += [judge.choice_probs(small, ["Yes", "No"]), judge.choice_probs(big, ["Yes", "No"])]
    assert judge._mask_buf is buf  # the larger call's buffer serves the smaller one and the next
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    # above the budget: no buffer, fresh masks, same answers
    monkeypatch.setattr(_transformers_cache, "_MASK_BUFFER_BYTES", 0)
    none = TransformersJudge(model, proc)
    assert torch.equal(none.choice_probs(big, ["Yes", "No"]), want[0]) and none._mask_buf is None


# ------------------------------------------------------------------------------------ repeated conversations
def test_repeated_conversations_are_run_once(images):
    model, proc = tiny_qwen2_5_vl()
    qs = questions(images)
    a, b, c = qs[0], qs[1], qs[3]
    a_copy = copy.deepcopy(a)  # equal content, other objects (the image too): equal by content hash
    batch = [a, b, a, c, a_copy, b]
    distinct = [a, b, c]
    where = [0, 1, 0, 2, 0, 1]
    judge = TransformersJudge(model, proc)
    ids = judge.choice_token_ids(["Yes", "No"])

    judge.stats.clear()
    once = judge.choice_probs(distinct, ["Yes", "No"])
    work = judge.stats["prefill_tokens"]
    judge.stats.clear()
    probs = judge.choice_probs(batch, ["Yes", "No"])
    assert judge.stats["prefill_tokens"] == work  # the repeats cost nothing
    for row, j in zip(probs, where):
        assert torch.equal(row, once[j])
    for c_, p in zip(distinct, once):
        assert torch.allclose(p, full_forward_probs(model, proc, c_, ids), atol=1e-5)

    # greedy and seeded sampling: a repeat's texts are its first occurrence's, decoded once
    for kw in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 3, "n": 2}):
        judge.stats.clear()
        want = judge.generate(distinct, max_new_tokens=5, **kw)
        work = judge.stats["decode_tokens"]
        judge.stats.clear()
        got = judge.generate(batch, max_new_tokens=5, **kw)
        assert judge.stats["decode_tokens"] == work
        assert got == [want[j] for j in where]
        assert got[0] is not got[2]  # separate lists: a caller may edit one answer
    # unseeded sampling: repeats stay independent draws (each row is decoded; counted as rows handed to the
    # decoding loop, not as decoded tokens, which an early end-of-sequence draw would make random)
    rows = []
    decode = judge._decode
    judge._decode = lambda run, convs, n, **kw: rows.append(len(convs) * n) or decode(run, convs, n, **kw)
    judge.generate([a, a, a], max_new_tokens=5, temperature=1.0)
    assert rows == [3]


def test_unique_needs_equal_ids_and_images():
    from rewardkit.judges.transformers_backend import _Conv

    x = _Conv(ids=[1, 2, 3], images=["h1"], image_end=1, digest=7)
    same = _Conv(ids=[1, 2, 3], images=["h1"], image_end=1, digest=7)
    collide = _Conv(ids=[1, 2, 4], images=["h1"], image_end=1, digest=7)  # same digest, other ids
    other_image = _Conv(ids=[1, 2, 3], images=["h2"], image_end=1, digest=7)
    uniq, back = _unique([x, same, collide, other_image, x])
    assert uniq == [x, collide, other_image] and back == [0, 0, 1, 2, 0]
    assert _unique([x, collide]) == ([x, collide], None)


def test_seed_digest_is_the_blake2b_of_ids_and_image_content_hashes(images):
    """The per-row seed material of seeded sampling, computed only when sampling asks for it: the same value as
    before the cheap image keys (blake2b-64 of the int64 ids then the joined full content hashes of the images,
    ``media.image_hash``, little-endian; those hashes were the image keys then), so seeded samples do not
    change. Without the hashes (scoring) it refuses rather than seed from the keys."""
    import hashlib
    from array import array

    from rewardkit.media import _to_pil, image_hash

    model, proc = tiny_qwen2_5_vl()
    judge = TransformersJudge(model, proc)
    qs = questions(images)
    with torch.inference_mode():
        convs, _ = judge._prepare(qs, digests=True)
        plain, _ = judge._prepare(qs)
    for c, q in zip(convs, qs):
        assert c.digest is None  # not computed while preparing
        ims = [item["image"] for msg in q if isinstance(msg["content"], list) for item in msg["content"]
               if item.get("type") == "image"]
        assert c.image_digests == [image_hash(_to_pil(im)) for im in ims]
        h = hashlib.blake2b(digest_size=8)
        h.update(array("q", c.ids).tobytes())
        h.update("".join(c.image_digests).encode())
        assert c.seed_digest() == int.from_bytes(h.digest(), "little") == c.digest
    with pytest.raises(RuntimeError, match="digests=True"):
        plain[0].seed_digest()


# ------------------------------------------------------------------------------------ continuation rows
def test_left_padded_is_the_nested_list_layout():
    from rewardkit.judges._transformers_cache import _left_padded

    rows = [[5, 6, 7], [8], [9, 10, 11, 12], (13, 14)]
    ids, mask = _left_padded(rows, 5, 0, torch.device("cpu"))
    assert ids.tolist() == [[0, 0, 5, 6, 7], [0, 0, 0, 0, 8], [0, 9, 10, 11, 12], [0, 0, 0, 13, 14]]
    assert mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert ids.dtype == mask.dtype == torch.long
    ids, mask = _left_padded([[], [3]], 2, 7, torch.device("cpu"))
    assert ids.tolist() == [[7, 7], [7, 3]] and mask.tolist() == [[0, 0], [0, 1]]
    with pytest.raises(ValueError, match="does not fit"):
        _left_padded([[1, 2, 3]], 2, 0, torch.device("cpu"))


def test_row_chunks_go_in_suffix_length_order(images):
    """Continuation rows are chunked shortest suffix first, so a chunk's padding is its own rows' spread; the
    answers are the chunk-free ones and transformers' own forward's."""
    model, proc = tiny_qwen2_5_vl()
    a, b = images[:2]
    qs = ["Yes or No?", "A much longer question about the two images that needs many more tokens: Yes or No?",
          "Is it? Yes or No.", "Another long question, with words enough to be the longest of them all: Yes or No?"]
    convs = [conv([a, b], q) for q in qs]
    whole = TransformersJudge(model, proc)
    chunked = TransformersJudge(model, proc, max_rows=2)
    widths = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda m, args, kw: widths.append(tuple((kw.get("input_ids") if kw.get("input_ids") is not None
                                                 else kw["inputs_embeds"]).shape[:2])), with_kwargs=True)
    try:
        with torch.inference_mode():
            cs, _ = chunked._prepare(convs)
            _, split, _ = chunked._plan(cs)
            lengths = [len(c.ids) - split[i] for i, c in enumerate(cs)]
            widths.clear()
            got = chunked.choice_probs(convs, ["Yes", "No"])
    finally:
        hook.remove()
    short = sorted(lengths)
    assert widths[1:] == [(2, short[1]), (2, short[3])]  # after the prefix prefill: two chunks, shortest first
    # in the given order both chunks would be padded to a long row
    assert sum(r * w for r, w in widths[1:]) < 2 * max(lengths[:2]) + 2 * max(lengths[2:])
    want = whole.choice_probs(convs, ["Yes", "No"])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    ids = whole.choice_token_ids(["Yes", "No"])
    for c, p in zip(convs, got):
        assert torch.allclose(p, full_forward_probs(model, proc, c, ids), atol=1e-5)


# ------------------------------------------------------------------------------------ fresh prefill as the state
def test_fresh_prefill_state_equals_the_assembled_cache_state(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    convs = questions(images)
    with torch.inference_mode(), judge.session():
        cs, feats = judge._prepare(convs)
        prefixes, split, prefix_of = judge._plan(cs)
        lengths = {len(p) for p, _ in prefixes}
        assert len(lengths) > 1  # left padding in the prefill batch
        state = judge._prefix_state(prefixes, feats)  # every prefix new: the prefill's own state
        entries = [judge._session_prefixes[(tuple(p), tuple(k))] for p, k in prefixes]
        assembled = judge._assemble(entries)  # what the session path returned before
        assert torch.equal(state["mask"], assembled["mask"]) and torch.equal(state["next_pos"], assembled["next_pos"])
        # the kept entries are the prefill's unpadded rows (what the mask-indexing kept)
        for r, e in enumerate(entries):
            valid = state["mask"][r].bool()
            for layer, (k, v) in zip(state["cache"].layers, e["kv"]):
                assert torch.equal(k, layer.keys[r][:, valid]) and torch.equal(v, layer.values[r][:, valid])
        which = [prefix_of[i] for i in range(len(cs))]
        suffixes = [cs[i].ids[split[i]:] for i in range(len(cs))]
        got = judge._continue(state, which, suffixes)[0]
        want = judge._continue(assembled, which, suffixes)[0]
    assert torch.equal(got, want)


def test_a_repeated_conversation_is_prepared_once(images, monkeypatch):
    from rewardkit.judges.transformers_backend import _repeat_key

    model, proc = tiny_qwen2_5_vl()
    judge = TransformersJudge(model, proc)
    a, b = questions(images)[:2]
    rebuilt = [dict(m) if isinstance(m["content"], str) else {"role": m["role"], "content": [dict(i) for i in m["content"]]}
               for m in a]  # new dicts, same texts and image objects
    other_objects = copy.deepcopy(a)  # equal pixels in new image objects: prepared again, equal by content
    assert _repeat_key(rebuilt) == _repeat_key(a) != _repeat_key(b)
    assert _repeat_key(other_objects) != _repeat_key(a)
    assert _repeat_key([{"role": "user", "content": "x", "extra": ["unhashable"]}]) is None
    rendered = []
    render = judge._templates.render
    monkeypatch.setattr(judge._templates, "render", lambda c: rendered.append(c) or render(c))
    with torch.inference_mode():
        convs, _ = judge._prepare([a, b, rebuilt, other_objects, a], digests=True)
        alone, _ = judge._prepare([a, b], digests=True)
    assert len(rendered) == 3 + 2  # a, b, other_objects; then a, b
    assert convs[0] is convs[2] is convs[4] and convs[3] is not convs[0]
    for c in (convs[0], convs[3]):
        assert (c.ids, c.images, c.image_end, c.seed_digest()) == (alone[0].ids, alone[0].images,
                                                                   alone[0].image_end, alone[0].seed_digest())
    assert convs[1].ids == alone[1].ids


def test_cached_row_positions_are_the_batch_positions(tiny, images):
    """Prefix positions from the per-layout cache (a miss, then hits) are the vectorised batch computation's and
    the model's own ``get_rope_index``'s, with left padding and several images per row; rows of another image
    size or text length get their own entries; a layout the ids do not match is not served from the cache."""
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    with torch.inference_mode():
        cs, feats = judge._prepare(questions(images)[:4])  # rows with images only
        prefixes, _, _ = judge._plan(cs)
        got = []
        for _ in range(2):  # misses (filled), then hits
            judge._pos_cache_on = True
            got.append(judge._prefill(prefixes, feats))
        assert len(judge._pos_cache) == len({(len(p), tuple(k)) for p, k in prefixes})
        judge._pos_cache_on = False
        ref_st = judge._prefill(prefixes, feats)
        ids, mask = ref_st["ids"], ref_st["mask"]
        grid = torch.stack([feats[h].grid_thw for _, keys in prefixes for h in keys])
        types = (ids == judge.image_token_id).int()
        ref, deltas = model.model.get_rope_index(ids, types, image_grid_thw=grid, attention_mask=mask)
        judge._pos_cache_on = True
        # an image token outside the image runs: no cached layout fits, the batch path decides
        p0, k0 = prefixes[0]
        stray = (p0[:-1] + [judge.image_token_id], k0)
        assert judge._prefix_positions([stray], feats, len(p0)) is None
    assert len(set(mask.sum(-1).tolist())) > 1
    for st in got:
        assert torch.equal(st["pos"], ref_st["pos"]) and torch.equal(st["next_pos"], ref_st["next_pos"])
        assert torch.equal(st["pos"][:, mask.bool()], ref[:, mask.bool()])
        assert torch.equal(st["next_pos"], mask.sum(-1) + deltas.reshape(-1))


@pytest.mark.parametrize("extra", [0, 3])
def test_continuing_every_prefix_row_leaves_the_prefix_cache_as_it_was(tiny, images, extra):
    """One continuation per prefix row, in order, forks without selecting rows first: the forward that extends
    the fork (dynamic, or static with room for decoding) must not write into the prefix state's tensors, so a
    second continuation of the same state gives the same logits, equal to the row-selecting fork's."""
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    with torch.inference_mode():
        cs, feats = judge._prepare(questions(images)[:4])
        prefixes, split, prefix_of = judge._plan(cs)
        st = judge._prefill(prefixes, feats)
        before = [(layer.keys.clone(), layer.values.clone()) for layer in st["cache"].layers]
        rows = {prefix_of[c]: c for c in range(len(cs))}  # one conversation per prefix
        which = sorted(rows)
        assert which == list(range(len(prefixes)))
        suffixes = [cs[rows[p]].ids[split[rows[p]]:] for p in which]
        first = judge._continue(st, which, suffixes, extra)[0]
        second = judge._continue(st, which, suffixes, extra)[0]
        # the same rows through index_select (a permutation made identity again), as before the shortcut
        perm = list(reversed(which))
        third = judge._continue(st, perm, suffixes[::-1], extra)[0].flip(0)
    for layer, (k, v) in zip(st["cache"].layers, before):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert torch.equal(first, second)
    torch.testing.assert_close(first, third, rtol=1e-5, atol=1e-6)  # another row order: batch rounding only


def test_choice_token_ids_are_kept_per_choices(tiny):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    calls = []
    enc = judge.tokenizer.encode
    judge.tokenizer.encode = lambda *a, **k: calls.append(a) or enc(*a, **k)
    try:
        first = judge.choice_token_ids(["Yes", "No"])
        again = judge.choice_token_ids(("Yes", "No"))
        assert first == again and len(calls) == 2  # tokenized once
        again.append(-1)  # a caller's list: the kept one is not changed
        assert judge.choice_token_ids(["Yes", "No"]) == first
        from rewardkit.judges.base import ChoiceError

        for _ in range(2):  # the refusal is kept too, and raised every time
            with pytest.raises(ChoiceError):
                judge.choice_token_ids(["Yes", "Yes"])
    finally:
        del judge.tokenizer.encode


def test_prefill_positions_are_the_models_get_rope_index(tiny, images):
    model, proc = tiny
    judge = TransformersJudge(model, proc)
    with torch.inference_mode():
        cs, feats = judge._prepare(questions(images))  # several images per row, a text-only row, left padding
        prefixes, _, _ = judge._plan(cs)
        st = judge._prefill(prefixes, feats)
        ids, mask = st["ids"], st["mask"]
        grid = torch.stack([feats[h].grid_thw for _, keys in prefixes for h in keys])
        types = (ids == judge.image_token_id).int()
        assert judge._rope_positions(types, mask, grid) is not None  # the vectorised path was taken
        ref, deltas = model.model.get_rope_index(ids, types, image_grid_thw=grid, attention_mask=mask)
    valid = mask.bool()
    assert len(set(mask.sum(-1).tolist())) > 1
    assert torch.equal(st["pos"][:, valid], ref[:, valid])
    assert torch.equal(st["next_pos"], mask.sum(-1) + deltas.reshape(-1))
