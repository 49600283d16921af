"""hpsv3: the legacy (transformers 4.45) Qwen2-VL checkpoint converts to a preference model whose scores match a
reference built independently: transformers' own legacy-key loading + HPSv3's input recipe + the ranknet head
computed by hand."""

from __future__ import annotations

import json

import pytest
import torch

from rewardkit.testing import random_images


@pytest.fixture(scope="module")
def hpsv3_dirs(tmp_path_factory):
    from rewardkit.convert import convert
    from rewardkit.convert.tiny import write_tiny_hpsv3

    root = tmp_path_factory.mktemp("hpsv3")
    ckpt, base = write_tiny_hpsv3(root / "src", seed=5)
    out = convert("hpsv3", ckpt, root / "out", base=str(base), pixels=56 * 56)
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
    _, _, out = hpsv3_dirs
    reward = HPSv3(model=str(out), device="cpu")
    text = reward.model.input_encoder().render("a red car", 0)
    user = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert user.endswith(INSTRUCTION.format(text_prompt="a red car") + SUFFIX)  # the token inside the user text
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|Reward|>") == 1
    ip = reward.model.processor.image_processor
    assert ip.size["shortest_edge"] == ip.size["longest_edge"] == 56 * 56  # HPSv3: min = max pixels
    enc = reward.model.encode(random_images(3, sizes=[(32, 32), (200, 200), (40, 90)]), ["a", "b", "c"])
    # qwen-vl smart_resize (factor 28): squares land exactly on the budget; 40x90 -> 56x84 (ceil to reach min)
    assert enc["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4], [1, 6, 4]]
    cfg = json.loads((out / "preference_config.json").read_text())
    assert cfg["head"]["type"] == "ranknet" and cfg["reward_token"] == "<|Reward|>"


def test_hpsv3_conversion_parity(hpsv3_dirs, tmp_path):
    import transformers
    from safetensors.torch import load_file, save_file

    from rewardkit.models.vlm import image_only_processor
    from rewardkit.convert.hpsv3 import INSTRUCTION, SUFFIX
    from rewardkit.rewards.hpsv3 import HPSv3

    ckpt, base, out = hpsv3_dirs
    sd = load_file(str(ckpt))
    assert "model.embed_tokens.weight" in sd and "visual.patch_embed.proj.weight" in sd  # legacy layout
    # reference: transformers loads the legacy names itself (its own conversion mapping)
    tok = transformers.AutoTokenizer.from_pretrained(str(base))
    tok.add_special_tokens({"additional_special_tokens": ["<|Reward|>"]}, replace_extra_special_tokens=False)
    cfg = transformers.AutoConfig.from_pretrained(str(base))
    cfg.text_config.vocab_size = len(tok)
    ref_dir = tmp_path / "ref"
    cfg.save_pretrained(ref_dir)
    save_file({k: v for k, v in sd.items() if not k.startswith("rm_head.")}, str(ref_dir / "model.safetensors"))
    ref = transformers.Qwen2VLForConditionalGeneration.from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(str(base))
    ip.size = {"shortest_edge": 56 * 56, "longest_edge": 56 * 56}
    proc = image_only_processor(transformers.Qwen2VLProcessor)(image_processor=ip, tokenizer=tok,
                                                               chat_template=tok.chat_template)
    prompts = ["a red car", "two birds on a branch", "a cat"]
    ims = random_images(3, sizes=[(32, 32), (80, 40), (30, 70)], seed=9)
    rid = tok.convert_tokens_to_ids("<|Reward|>")
    mus, log_sigmas = [], []
    with torch.no_grad():
        for im, p in zip(ims, prompts):  # one at a time: no padding in the reference
            msgs = [{"role": "user", "content": [{"type": "image"},
                                                 {"type": "text", "text": INSTRUCTION.format(text_prompt=p) + SUFFIX}]}]
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            enc = proc(text=[text], images=[im], return_tensors="pt")
            o = ref(**enc, output_hidden_states=True)
            pos = (enc["input_ids"][0] == rid).nonzero().item()
            h = o.hidden_states[-1][0, pos].float()
            x = torch.relu(h @ sd["rm_head.0.weight"].T + sd["rm_head.0.bias"])
            x = torch.relu(x @ sd["rm_head.3.weight"].T + sd["rm_head.3.bias"])
            y = x @ sd["rm_head.5.weight"].T + sd["rm_head.5.bias"]
            mus.append(y[0])
            log_sigmas.append(y[1])
    reward = HPSv3(model=str(out), device="cpu")
    got = reward(ims, prompts)
    torch.testing.assert_close(got.scores, torch.stack(mus), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.dimensions["sigma"], torch.stack(log_sigmas).exp(), atol=1e-4, rtol=1e-4)
    cmp = reward.compare(ims[:1], ims[1:2], prompts[:1])
    torch.testing.assert_close(cmp.prob_a, torch.sigmoid(mus[0] - mus[1]).reshape(1), atol=1e-4, rtol=1e-4)


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


def _ranknet(sd, prefix, h):
    x = torch.relu(h @ sd[prefix + "0.weight"].T + sd[prefix + "0.bias"])
    x = torch.relu(x @ sd[prefix + "3.weight"].T + sd[prefix + "3.bias"])
    return x @ sd[prefix + "5.weight"].T + sd[prefix + "5.bias"]


def test_editreward_conversion_parity(tmp_path):
    import transformers
    from safetensors.torch import load_file, save_file

    from rewardkit.convert import convert
    from rewardkit.convert._editreward_prompts import INSTRUCTION_EDIT_FOLLOWING, INSTRUCTION_EDIT_QUALITY
    from rewardkit.convert.hpsv3 import SUFFIX
    from rewardkit.convert.tiny import write_tiny_editreward
    from rewardkit.models.vlm import image_only_processor
    from rewardkit.rewards.editreward import EditReward

    assert INSTRUCTION_EDIT_FOLLOWING.count("  \n") == 11 and "score from 1 to 4" in INSTRUCTION_EDIT_QUALITY
    ckpt, base = write_tiny_editreward(tmp_path / "src", seed=2)
    out = convert("editreward", ckpt, tmp_path / "out", base=str(base), pixels=56 * 56)
    sd = load_file(str(ckpt))
    tok = transformers.AutoTokenizer.from_pretrained(str(base))
    tok.add_special_tokens({"additional_special_tokens": ["<|Reward|>"]}, replace_extra_special_tokens=False)
    cfg = transformers.AutoConfig.from_pretrained(str(base))
    cfg.text_config.vocab_size = len(tok)
    ref_dir = tmp_path / "ref"
    cfg.save_pretrained(ref_dir)
    save_file({k: v for k, v in sd.items() if not k.startswith("rm_heads.")}, str(ref_dir / "model.safetensors"))
    ref = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(str(base))
    ip.size = {"shortest_edge": 56 * 56, "longest_edge": 56 * 56}
    proc = image_only_processor(transformers.Qwen2_5_VLProcessor)(image_processor=ip, tokenizer=tok,
                                                                  chat_template=tok.chat_template)
    rid = tok.convert_tokens_to_ids("<|Reward|>")
    edits = random_images(2, sizes=[(40, 40), (64, 36)], seed=3)
    srcs = random_images(2, sizes=[(40, 40), (64, 36)], seed=4)
    prompts = ["add a green bowl", "make the sky red"]
    want, dims = [], {"f": [], "q": []}
    with torch.no_grad():
        for src, ed, p in zip(srcs, edits, prompts):
            mus = []
            for key, instr, prefix in (("f", INSTRUCTION_EDIT_FOLLOWING, "rm_heads.head_0."),
                                       ("q", INSTRUCTION_EDIT_QUALITY, "rm_heads.head_1.")):
                msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                     {"type": "text", "text": instr.format(text_prompt=p) + SUFFIX}]}]
                text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                enc = proc(text=[text], images=[src, ed], return_tensors="pt")
                h = ref(**enc, output_hidden_states=True).hidden_states[-1][0]
                y = _ranknet(sd, prefix, h[(enc["input_ids"][0] == rid).nonzero().item()])
                mus.append(y[0])
                dims[key].append(y[0])
            want.append((mus[0] + mus[1]) / 2)
    reward = EditReward(model=str(out), device="cpu")
    got = reward(edits, prompts, sources=[[s] for s in srcs])
    torch.testing.assert_close(got.scores, torch.stack(want), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.dimensions["instruction_following"], torch.stack(dims["f"]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.dimensions["visual_quality"], torch.stack(dims["q"]), atol=1e-4, rtol=1e-4)
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
