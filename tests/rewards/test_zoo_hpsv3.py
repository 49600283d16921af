"""hpsv3 / editreward: the official checkpoints convert to preference models whose scores match a reference built
independently: transformers' own legacy-key loading, the official input recipe (right-padded batches), and the
official forward transcribed line by line (inputs_embeds built by hand, the language model called with
position_ids=None and no image grid, the ranknet head in fp32 on the reward token)."""

from __future__ import annotations

import json

import pytest
import torch

from rewardkit.testing import random_images


def _unit_scale(ckpt, seed):
    """Redraw the backbone's matrices of a tiny checkpoint at unit scale (std 1/sqrt(fan_in), query / key
    projections x3 for sharper attention; embeddings std 1), heads unchanged. At the 0.02 init of a tiny random
    model every score is nearly the same constant, so a wrong position, mask or image order would go unnoticed;
    at this scale each one moves the score."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(ckpt))
    gen = torch.Generator().manual_seed(seed)
    for k, v in sd.items():
        if v.ndim >= 2 and not k.startswith("rm_head"):
            fan_in = v[0].numel() if "embed_tokens" not in k else 1
            gain = 3.0 if ("q_proj" in k or "k_proj" in k) else 1.0
            sd[k] = gain * torch.randn(v.shape, generator=gen, dtype=v.dtype) / fan_in ** 0.5
    save_file(sd, str(ckpt))
    return ckpt


PIXELS = 112 * 112  # 16 merged tokens per image: the 3-D positions differ from the 1-D ones enough to show


@pytest.fixture(scope="module")
def hpsv3_dirs(tmp_path_factory):
    from rewardkit.convert import convert
    from rewardkit.convert.tiny import write_tiny_hpsv3

    root = tmp_path_factory.mktemp("hpsv3")
    ckpt, base = write_tiny_hpsv3(root / "src", seed=5)
    _unit_scale(ckpt, seed=5)
    out = convert("hpsv3", ckpt, root / "out", base=str(base), pixels=PIXELS)
    return ckpt, base, out


def test_ranknet_head_is_hpsv3s():
    from rewardkit.models.preference import HEADS, RankNetHead

    head = RankNetHead(8)
    assert HEADS["ranknet"] is RankNetHead
    assert sorted(head.state_dict()) == ["0.bias", "0.weight", "3.bias", "3.weight", "5.bias", "5.weight"]
    assert [type(m).__name__ for m in head] == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Linear"]
    assert head[0].out_features == 1024 and head[3].out_features == 16 and head[5].out_features == 2


def test_hpsv3_prompt_and_pixels(hpsv3_dirs):
    from rewardkit.convert.hpsv3 import INSTRUCTION, SUFFIX
    from rewardkit.rewards.hpsv3 import HPSv3

    assert "**Visual Quality:**  \n" in INSTRUCTION and INSTRUCTION.endswith("Textual prompt - {text_prompt}\n\n\n")
    assert SUFFIX == "\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"
    # the whole instruction, byte for byte, as the official package has it: sha256 of the string literals
    # ``INSTRUCTION`` (lines 11-32) and ``prompt_with_special_token`` (lines 38-42) of the hpsv3==1.0.0 wheel's
    # hpsv3/dataset/data_collator_qwen.py (file sha256 sPk26J-N9lLG... in the wheel's RECORD), read with ast
    import hashlib

    assert (len(INSTRUCTION), hashlib.sha256(INSTRUCTION.encode()).hexdigest()) == (
        2523, "0393599dad45a971903d1d62a3acf9bad3ccccdafa7f40f680523419e1f68b7a")
    assert hashlib.sha256(SUFFIX.encode()).hexdigest() == "2471faca094ae5bd6fe17b71dce20c3d7583625545e235889f7e74e7eeb69d0a"
    _, _, out = hpsv3_dirs
    reward = HPSv3(model=str(out), device="cpu")
    text = reward.model.input_encoder().render("a red car", 0)
    user = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert user.endswith(INSTRUCTION.format(text_prompt="a red car") + SUFFIX)  # the token inside the user text
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|Reward|>") == 1
    ip = reward.model.processor.image_processor
    assert ip.size["shortest_edge"] == ip.size["longest_edge"] == PIXELS  # HPSv3: min = max pixels
    enc = reward.model.encode(random_images(3, sizes=[(32, 32), (200, 200), (40, 90)]), ["a", "b", "c"])
    # qwen-vl smart_resize (factor 28, 112*112 px): squares land exactly on the budget; 40x90 -> 84x168
    # (scale sqrt(12544 / 3600) = 1.867; 40 * 1.867 = 74.7 -> ceil to 3 * 28; 90 * 1.867 = 168 = 6 * 28)
    assert enc["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8], [1, 12, 6]]
    cfg = json.loads((out / "preference_config.json").read_text())
    assert cfg["head"]["type"] == "ranknet" and cfg["reward_token"] == "<|Reward|>"


def _reference_backbone(sd, base, tmp_path, cls_name, head_prefix):
    """transformers itself loads the checkpoint (legacy names through its own conversion mapping)."""
    import transformers
    from safetensors.torch import save_file

    tok = transformers.AutoTokenizer.from_pretrained(str(base))
    tok.add_special_tokens({"additional_special_tokens": ["<|Reward|>"]}, replace_extra_special_tokens=False)
    tok.padding_side = "right"  # hpsv3 train.py:53 / EditReward: processor loaded with padding_side="right"
    cfg = transformers.AutoConfig.from_pretrained(str(base))
    cfg.text_config.vocab_size = len(tok)
    ref_dir = tmp_path / "ref"
    cfg.save_pretrained(ref_dir)
    save_file({k: v for k, v in sd.items() if not k.startswith(head_prefix)}, str(ref_dir / "model.safetensors"))
    model = getattr(transformers, cls_name).from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    return model, tok


def _ranknet(sd, prefix, h):
    """HPSv3 / EditReward ``rm_head``: Linear, ReLU, Dropout (eval: identity), Linear, ReLU, Linear, in fp32."""
    x = torch.relu(h @ sd[prefix + "0.weight"].T + sd[prefix + "0.bias"])
    x = torch.relu(x @ sd[prefix + "3.weight"].T + sd[prefix + "3.bias"])
    return x @ sd[prefix + "5.weight"].T + sd[prefix + "5.bias"]


def official_hpsv3_logits(model, batch, sd, reward_id):
    """HPSv3's forward, transcribed from the ``hpsv3==1.0.0`` wheel, ``hpsv3/model/qwen2vl_trainer.py``.

    Under its pinned transformers 4.45.2, ``self.model`` is the Qwen2-VL *text* model (here
    ``model.model.language_model``) and ``self.visual`` returned the merged image embeddings (here
    ``model.model.visual(...).pooler_output``). Nothing of rewardkit's forward is used.
    """
    input_ids = batch["input_ids"]
    # qwen2vl_trainer.py:148-161: inputs_embeds built by hand, image embeddings scattered into them
    inputs_embeds = model.model.language_model.embed_tokens(input_ids)
    pixel_values = batch["pixel_values"].type(model.model.visual.get_dtype())
    image_embeds = model.model.visual(pixel_values, grid_thw=batch["image_grid_thw"]).pooler_output
    image_mask = (input_ids == model.config.image_token_id).unsqueeze(-1).expand_as(inputs_embeds)
    image_embeds = image_embeds.to(inputs_embeds.device, inputs_embeds.dtype)
    inputs_embeds = inputs_embeds.masked_scatter(image_mask, image_embeds)
    attention_mask = batch["attention_mask"].to(inputs_embeds.device)
    # qwen2vl_trainer.py:179-190: input_ids=None, position_ids=None, no image_grid_thw -> the text model's own
    # positions, arange(T) on all three rope sections (4.45.2 modeling_qwen2_vl.py:1204-1205; same today)
    outputs = model.model.language_model(input_ids=None, position_ids=None, attention_mask=attention_mask,
                                         past_key_values=None, inputs_embeds=inputs_embeds, use_cache=None)
    hidden_states = outputs[0]  # [B, L, D]
    logits = _ranknet(sd, "rm_head.", hidden_states.float())  # :192-193, fp32 head on every position
    # :233-241: "special" pooling, the logits where input_ids == <|Reward|>, one per sample
    special_token_mask = input_ids == reward_id
    return logits[special_token_mask, ...].view(input_ids.shape[0], -1)  # [B, 2] = (mu, log sigma)


def _hpsv3_reference(hpsv3_dirs, tmp_path, ims, prompts):
    """HPSv3's inference recipe (hpsv3/inference.py:97-145): one right-padded processor batch, then the official
    forward above."""
    import transformers
    from safetensors.torch import load_file

    from rewardkit.convert.hpsv3 import INSTRUCTION, SUFFIX
    from rewardkit.models.vlm import image_only_processor

    ckpt, base, _ = hpsv3_dirs
    sd = load_file(str(ckpt))
    assert "model.embed_tokens.weight" in sd and "visual.patch_embed.proj.weight" in sd  # legacy layout
    ref, tok = _reference_backbone(sd, base, tmp_path, "Qwen2VLForConditionalGeneration", "rm_head.")
    ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(str(base))
    ip.size = {"shortest_edge": PIXELS, "longest_edge": PIXELS}
    proc = image_only_processor(transformers.Qwen2VLProcessor)(image_processor=ip, tokenizer=tok,
                                                               chat_template=tok.chat_template)
    msgs = [[{"role": "user", "content": [{"type": "image"},
                                          {"type": "text", "text": INSTRUCTION.format(text_prompt=p) + SUFFIX}]}]
            for p in prompts]
    texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in msgs]
    batch = proc(text=texts, images=ims, padding=True, return_tensors="pt")
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 1  # the batch really is padded
    with torch.no_grad():
        return official_hpsv3_logits(ref, batch, sd, tok.convert_tokens_to_ids("<|Reward|>"))


# different sizes -> different token counts -> padding inside a batch
_HPS_SIZES = [(32, 32), (80, 40), (30, 70)]
_HPS_PROMPTS = ["a red car", "two birds on a branch", ""]  # HPSv3 scores an empty prompt too


def test_hpsv3_conversion_parity(hpsv3_dirs, tmp_path):
    from rewardkit.rewards.hpsv3 import HPSv3

    ims = random_images(3, sizes=_HPS_SIZES, seed=9)
    # + image 0 with prompt 1, for compare(image 0, image 1 | prompt 1)
    want = _hpsv3_reference(hpsv3_dirs, tmp_path, ims + ims[:1], _HPS_PROMPTS + _HPS_PROMPTS[1:2])
    want, want_0_p1 = want[:3], want[3]
    reward = HPSv3(model=str(hpsv3_dirs[2]), device="cpu")
    got = reward(ims, _HPS_PROMPTS)
    torch.testing.assert_close(got.scores, want[:, 0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.dimensions["sigma"], want[:, 1].exp(), atol=1e-6, rtol=1e-5)
    assert got.info["positions"] == "sequential"
    cmp = reward.compare(ims[:1], ims[1:2], _HPS_PROMPTS[1:2])
    torch.testing.assert_close(cmp.prob_a, torch.sigmoid(want_0_p1[0] - want[1, 0]).reshape(1), atol=1e-6, rtol=1e-5)
    # padding side and batching do not move a score: left / right padded batches = one sample at a time
    tok = reward.model.processor.tokenizer
    for side in ("left", "right"):
        tok.padding_side = side
        mask = reward.model.encode(ims, _HPS_PROMPTS)["attention_mask"]
        assert (mask[:, 0] if side == "left" else mask[:, -1]).min() == 0  # really padded on that side
        torch.testing.assert_close(reward(ims, _HPS_PROMPTS).scores, want[:, 0], atol=1e-6, rtol=1e-5)
    one = torch.cat([reward(ims[i:i + 1], _HPS_PROMPTS[i:i + 1]).scores for i in range(3)])
    torch.testing.assert_close(one, want[:, 0], atol=1e-6, rtol=1e-5)


def test_hpsv3_positions_option(hpsv3_dirs, tmp_path):
    """Qwen2-VL's 3-D positions (rewardkit's earlier behaviour, ``positions="mrope"``) do not give HPSv3's
    numbers; a directory converted before the option existed gets the official positions."""
    import shutil

    from rewardkit.rewards.hpsv3 import HPSv3

    _, _, out = hpsv3_dirs
    assert json.loads((out / "rewardkit.json").read_text())["positions"] == "sequential"
    assert json.loads((out / "preference_config.json").read_text())["positions"] == "sequential"
    ims = random_images(3, sizes=_HPS_SIZES, seed=9)
    want = _hpsv3_reference(hpsv3_dirs, tmp_path, ims, _HPS_PROMPTS)[:, 0]
    mrope = HPSv3(model=str(out), device="cpu", positions="mrope")(ims, _HPS_PROMPTS).scores
    assert (mrope - want).abs().max() > 1e-3  # tiny random model: the 3-D positions move the score
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for name in ("rewardkit.json", "preference_config.json"):
        d = json.loads((old / name).read_text())
        del d["positions"]
        (old / name).write_text(json.dumps(d))
    r = HPSv3(model=str(old), device="cpu")
    assert r.model.positions == "sequential"
    torch.testing.assert_close(r(ims, _HPS_PROMPTS).scores, want, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="positions must be one of"):
        HPSv3(model=str(out), device="cpu", positions="2d")


def test_hpsv3_converter_checks(hpsv3_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    from rewardkit.convert import convert

    ckpt, base, _ = hpsv3_dirs
    sd = load_file(str(ckpt))
    no_head = tmp_path / "nohead.safetensors"
    save_file({k: v for k, v in sd.items() if not k.startswith("rm_head.")}, str(no_head))
    with pytest.raises(ValueError, match="rm_head"):
        convert("hpsv3", no_head, tmp_path / "o1", base=str(base))
    bad_vocab = tmp_path / "vocab.safetensors"
    sd2 = dict(sd)
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        sd2[k] = torch.cat([sd[k], sd[k][:1]])
    save_file(sd2, str(bad_vocab))
    with pytest.raises(ValueError, match="rows but the tokenizer"):
        convert("hpsv3", bad_vocab, tmp_path / "o2", base=str(base))


def official_editreward_head_logits(model, batch, sd, head_prefix, reward_id):
    """One head of EditReward's multi-head forward, transcribed from TIGER-AI-Lab/EditReward@edb027e
    ``EditReward/model/qwen2_5_vl_trainer.py`` ``_run_single_batch_through_model_and_head`` (lines 207-277).

    Under its pinned transformers (4.57.0) ``self.model`` is the outer ``Qwen2_5_VLModel`` (vision tower + text
    model) and ``self.visual`` returned the merged image embeddings (here ``.pooler_output``). Called with
    ``input_ids=None``, ``position_ids=None`` and no ``image_grid_thw``, 4.57's ``get_rope_index`` falls back to
    ``attention_mask.cumsum(-1) - 1`` on all three sections (4.57.0 modeling_qwen2_5_vl.py:1120-1123); today's
    model gives ``arange(T)``, the same on every non-padding token of a right-padded batch.
    """
    input_ids = batch["input_ids"]
    # :229-254
    inputs_embeds = model.get_input_embeddings()(input_ids)
    image_embeds = model.model.visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"]).pooler_output
    image_mask = (input_ids == model.config.image_token_id).unsqueeze(-1).expand_as(inputs_embeds)
    image_embeds = image_embeds.to(inputs_embeds.device, inputs_embeds.dtype)
    inputs_embeds = inputs_embeds.masked_scatter(image_mask, image_embeds)
    attention_mask = batch["attention_mask"].to(inputs_embeds.device)
    # :257-268
    outputs = model.model(input_ids=None, position_ids=None, attention_mask=attention_mask, past_key_values=None,
                          inputs_embeds=inputs_embeds, use_cache=None, return_dict=True)
    hidden_states = outputs[0]
    logits = _ranknet(sd, head_prefix, hidden_states.float())  # :272-273, fp32 head
    # :196-202 ("special" pooling)
    return logits[input_ids == reward_id, ...].view(input_ids.shape[0], -1)


def test_editreward_conversion_parity(tmp_path):
    import transformers
    from safetensors.torch import load_file

    from rewardkit.convert import convert
    from rewardkit.convert._editreward_prompts import INSTRUCTION_EDIT_FOLLOWING, INSTRUCTION_EDIT_QUALITY
    from rewardkit.convert.hpsv3 import SUFFIX
    from rewardkit.convert.tiny import write_tiny_editreward
    from rewardkit.models.vlm import image_only_processor
    from rewardkit.rewards.editreward import EditReward

    assert INSTRUCTION_EDIT_FOLLOWING.count("  \n") == 11 and "score from 1 to 4" in INSTRUCTION_EDIT_QUALITY
    # byte for byte as upstream (the reference below shares these constants): sha256 of the string literals
    # INSTRUCTION_EDIT_FOLLOWING (lines 1-28) and INSTRUCTION_EDIT_QUALITY (lines 30-57) of
    # TIGER-AI-Lab/EditReward@edb027e EditReward/dataset/prompts.py, read with ast
    import hashlib

    assert [(len(t), hashlib.sha256(t.encode()).hexdigest()) for t in (INSTRUCTION_EDIT_FOLLOWING,
                                                                       INSTRUCTION_EDIT_QUALITY)] == [
        (1820, "da5bfc26898cc8e0e534a29675ad78c3462d331b7feaebf13bae5aa50195864f"),
        (1724, "89bbc5c2ac1bbea9c45a0fde298e9a97d1c079170a30780392c577fc1cd8d286")]
    ckpt, base = write_tiny_editreward(tmp_path / "src", seed=2)
    _unit_scale(ckpt, seed=2)
    out = convert("editreward", ckpt, tmp_path / "out", base=str(base), pixels=PIXELS)
    assert json.loads((out / "rewardkit.json").read_text())["positions"] == "sequential"
    sd = load_file(str(ckpt))
    ref, tok = _reference_backbone(sd, base, tmp_path, "Qwen2_5_VLForConditionalGeneration", "rm_heads.")
    ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(str(base))
    ip.size = {"shortest_edge": PIXELS, "longest_edge": PIXELS}
    proc = image_only_processor(transformers.Qwen2_5_VLProcessor)(image_processor=ip, tokenizer=tok,
                                                                  chat_template=tok.chat_template)
    rid = tok.convert_tokens_to_ids("<|Reward|>")
    edits = random_images(3, sizes=[(40, 40), (64, 36), (30, 90)], seed=3)
    srcs = random_images(3, sizes=[(40, 40), (64, 36), (56, 56)], seed=4)
    prompts = ["add a green bowl", "make the sky red", "remove the dog"]
    heads = []
    with torch.no_grad():
        # inference_edit.py:144-205: one right-padded batch per head, [source, edited, text], then
        # qwen2_5_vl_trainer.py:368-376 runs head_i on batch_dim{i+1} and :386-387 averages them ("mean")
        for instr, prefix in ((INSTRUCTION_EDIT_FOLLOWING, "rm_heads.head_0."),
                              (INSTRUCTION_EDIT_QUALITY, "rm_heads.head_1.")):
            msgs = [[{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                  {"type": "text", "text": instr.format(text_prompt=p) + SUFFIX}]}]
                    for p in prompts]
            texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in msgs]
            flat = [im for pair in zip(srcs, edits) for im in pair]
            batch = proc(text=texts, images=flat, padding=True, return_tensors="pt")
            assert len(set(batch["attention_mask"].sum(1).tolist())) > 1
            heads.append(official_editreward_head_logits(ref, batch, sd, prefix, rid))
    final = torch.stack(heads, 0).mean(0)  # [B, 2]
    reward = EditReward(model=str(out), device="cpu")
    got = reward(edits, prompts, sources=[[s] for s in srcs])
    torch.testing.assert_close(got.scores, final[:, 0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.dimensions["instruction_following"], heads[0][:, 0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.dimensions["visual_quality"], heads[1][:, 0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.dimensions["log_sigma"], final[:, 1], atol=1e-6, rtol=1e-5)
    assert got.info["positions"] == "sequential"
    tok_ = reward.following.processor.tokenizer
    for side in ("left", "right"):  # padding side and batching do not move a score
        tok_.padding_side = side
        mask = reward.following.encode(edits, prompts, [[s] for s in srcs])["attention_mask"]
        assert (mask[:, 0] if side == "left" else mask[:, -1]).min() == 0
        torch.testing.assert_close(reward(edits, prompts, sources=[[s] for s in srcs]).scores, final[:, 0],
                                   atol=1e-6, rtol=1e-5)
    one = torch.cat([reward(edits[i:i + 1], prompts[i:i + 1], sources=[[srcs[i]]]).scores for i in range(3)])
    torch.testing.assert_close(one, final[:, 0], atol=1e-6, rtol=1e-5)
    mrope = EditReward(model=str(out), device="cpu", positions="mrope")(edits, prompts, sources=[[s] for s in srcs])
    assert (mrope.scores - final[:, 0]).abs().max() > 1e-3  # rewardkit's earlier (3-D) positions: not the same
    from rewardkit.errors import RewardInputError

    with pytest.raises(RewardInputError, match="sources"):
        reward(edits, prompts)


def test_hub_ids_only_fetch_safetensors(tmp_path, hpsv3_dirs):
    from rewardkit.cli import main
    from rewardkit.convert import convert
    from rewardkit.convert._io import resolve_source

    _, base, _ = hpsv3_dirs
    with pytest.raises(FileNotFoundError, match="no safetensors file could be downloaded"):
        convert("hpsv3", "no-such-org/HPSv3", tmp_path / "o", base=str(base))  # offline in the tests
    with pytest.raises(FileNotFoundError, match="no candidates"):
        resolve_source("org/name", ("weights.pt",))  # a pickle is never downloaded
    assert main(["convert", "hpsv3", str(hpsv3_dirs[0]), str(tmp_path / "cli"), "--base", str(base)]) == 0
    assert (tmp_path / "cli" / "preference_config.json").is_file()


def test_official_positions_per_backbone():
    """HPSv3 (Qwen2-VL) and EditReward on Qwen2.5-VL / MiMo-VL call the language model with position_ids=None and
    no image grid (1-D); EditReward's Qwen3-VL trainer passes input_ids + image_grid_thw (the model's own 3-D)."""
    from rewardkit.convert.hpsv3 import official_positions
    from rewardkit.rewards.hpsv3 import resolve_positions

    assert [official_positions(t) for t in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")] == ["sequential", "sequential",
                                                                                       "mrope"]
    assert resolve_positions("", {}, "qwen3_vl") == "mrope"                     # converted before the key existed
    assert resolve_positions("", {"positions": "sequential"}, "qwen3_vl") == "sequential"  # as recorded
    assert resolve_positions("mrope", {"positions": "sequential"}, "qwen2_vl") == "mrope"  # the override
