"""hpsv2 and aesthetic: converters checked against independent reference forwards written here from the
published architectures (OpenCLIP ViT with fused in_proj attention; the aesthetic MLP), the published
preprocessing recipes on several aspect ratios, and the safety of the pickle reader."""

from __future__ import annotations

import json
import pickle
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from rewardkit.testing import random_images
from tests.helpers.upstream_preprocess import hpsv2_eval_pixels, openai_clip_eval_pixels

SIZES = [(32, 32), (48, 20), (20, 50), (33, 17), (64, 64), (31, 45)]


# ------------------------------------------------------------------ an OpenCLIP reference, written from the paper
class _Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)  # fused in_proj_weight, like OpenCLIP
        self.mlp = nn.Sequential(OrderedDict(c_fc=nn.Linear(d, 4 * d), gelu=nn.GELU(), c_proj=nn.Linear(4 * d, d)))

    def forward(self, x, mask=None):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class _Tower(nn.Module):
    def __init__(self, d, heads, n):
        super().__init__()
        self.resblocks = nn.ModuleList([_Block(d, heads) for _ in range(n)])


class OpenCLIPRef(nn.Module):
    """OpenCLIP ``CLIP`` (ViT + causal text transformer), parameter names as in OpenCLIP checkpoints."""

    def __init__(self, sd, heads=2):
        super().__init__()
        vw, _, p, _ = sd["visual.conv1.weight"].shape
        tw = sd["token_embedding.weight"].shape[1]
        nv = len({k.split(".")[3] for k in sd if k.startswith("visual.transformer.resblocks.")})
        nt = len({k.split(".")[2] for k in sd if k.startswith("transformer.resblocks.")})
        self.visual = nn.Module()
        self.visual.conv1 = nn.Conv2d(3, vw, p, p, bias=False)
        self.visual.class_embedding = nn.Parameter(torch.zeros(vw))
        self.visual.positional_embedding = nn.Parameter(torch.zeros_like(sd["visual.positional_embedding"]).float())
        self.visual.ln_pre, self.visual.ln_post = nn.LayerNorm(vw), nn.LayerNorm(vw)
        self.visual.transformer = _Tower(vw, heads, nv)
        self.visual.proj = nn.Parameter(torch.zeros_like(sd["visual.proj"]).float())
        self.token_embedding = nn.Embedding(*sd["token_embedding.weight"].shape)
        self.positional_embedding = nn.Parameter(torch.zeros_like(sd["positional_embedding"]).float())
        self.transformer = _Tower(tw, heads, nt)
        self.ln_final = nn.LayerNorm(tw)
        self.text_projection = nn.Parameter(torch.zeros_like(sd["text_projection"]).float())
        self.logit_scale = nn.Parameter(torch.zeros(()))
        self.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)

    def encode_image(self, x):
        v = self.visual
        x = v.conv1(x).flatten(2).transpose(1, 2)
        x = torch.cat([v.class_embedding.expand(x.shape[0], 1, -1), x], 1) + v.positional_embedding
        x = v.ln_pre(x)
        for b in v.transformer.resblocks:
            x = b(x)
        return v.ln_post(x[:, 0]) @ v.proj

    def encode_text(self, ids, eot_id):
        x = self.token_embedding(ids) + self.positional_embedding[: ids.shape[1]]
        t = ids.shape[1]
        mask = torch.full((t, t), float("-inf")).triu(1)
        for b in self.transformer.resblocks:
            x = b(x, mask)
        x = self.ln_final(x)
        # OpenCLIP pools at argmax(ids), the end-of-text token (the largest id in OpenAI's vocabulary);
        # the tiny vocabulary puts it elsewhere, so pool at its first occurrence (the same position).
        pos = (ids == eot_id).int().argmax(1)
        return x[torch.arange(x.shape[0]), pos] @ self.text_projection


# HPSv2's eval transform (ToTensor, ResizeMaxSize: tensor bicubic antialias, centred zero pad, normalise),
# transcribed from hpsv2/src/open_clip/transform.py lines 37-49 and 141-156 in tests/helpers/upstream_preprocess.py
_hpsv2_reference_pixels = hpsv2_eval_pixels


@pytest.fixture(scope="module")
def hps(tmp_path_factory):
    from rewardkit.convert import convert
    from rewardkit.convert.tiny import save_tiny_clip_tokenizer, write_tiny_hpsv2

    root = tmp_path_factory.mktemp("hps")
    tok = save_tiny_clip_tokenizer(root / "tok")
    src = write_tiny_hpsv2(root / "HPS_v2.1_compressed.pt", tokenizer_dir=tok, seed=3)
    out = convert("hpsv2", src, root / "out", tokenizer=str(tok), vision_heads=2, text_heads=2)
    return src, out, tok


def test_hpsv2_preprocessing_matches_recipe():
    from rewardkit.models.zoo import hpsv2_pixels

    ims = random_images(len(SIZES), sizes=SIZES, seed=5)
    got = hpsv2_pixels(ims, 32)
    assert got.shape == (len(SIZES), 3, 32, 32)
    for i, im in enumerate(ims):
        torch.testing.assert_close(got[i], _hpsv2_reference_pixels(im, 32), atol=1e-5, rtol=1e-5)
    # a 48x20 (w x h) image: resized to 32 x 13, 19 rows of black padding split 9 above / 10 below
    black = (-torch.tensor([0.48145466, 0.4578275, 0.40821073]) / torch.tensor([0.26862954, 0.26130258, 0.27577711]))
    torch.testing.assert_close(got[1, :, :9, :], black.view(3, 1, 1).expand(3, 9, 32))
    torch.testing.assert_close(got[1, :, 22:, :], black.view(3, 1, 1).expand(3, 10, 32))
    assert not torch.allclose(got[1, :, 9, :], black.view(3, 1).expand(3, 32))


def test_hpsv2_conversion_parity(hps):
    from transformers import AutoTokenizer

    from rewardkit.models.zoo import hpsv2_pixels
    from rewardkit.rewards.hpsv2 import HPSv2

    src, out, tok_dir = hps
    sd = torch.load(src, weights_only=True)["state_dict"]
    assert all(v.dtype == torch.float16 for v in sd.values())
    ref = OpenCLIPRef(sd, heads=2).eval()
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    prompts = ["a cat on a mat", "two birds on a branch", "a red car", "a photo of a dog",
               "score the quality of this picture", "a green bowl"]
    ims = random_images(len(SIZES), sizes=SIZES, seed=1)
    with torch.no_grad():
        img = nn.functional.normalize(ref.encode_image(torch.stack([_hpsv2_reference_pixels(i, 32) for i in ims])), dim=-1)
        ids = tok(prompts, padding=True, return_tensors="pt")["input_ids"]
        txt = nn.functional.normalize(ref.encode_text(ids, tok.eos_token_id), dim=-1)
    want = (img * txt).sum(-1)
    reward = HPSv2(model=str(out), device="cpu")
    got = reward(ims, prompts)
    torch.testing.assert_close(got.scores, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.dimensions["cosine"], want, atol=1e-5, rtol=1e-4)
    hundred = HPSv2(model=str(out), device="cpu", scale=100.0)
    torch.testing.assert_close(hundred(ims, prompts).scores, 100 * want, atol=1e-3, rtol=1e-4)
    assert json.loads((out / "rewardkit.json").read_text())["variant"] == "v2.1"
    assert hpsv2_pixels([], 32).shape == (0, 3, 32, 32)


def test_hpsv2_image_too_long_for_its_resize_is_that_samples_error(hps):
    """At size 32 a 7000x64 image (aspect 109, inside the default bound of 200) has a 0-pixel side after
    HPSv2's longest-side resize (round(64 * 32 / 7000) = 0): that sample is NaN + reason, the other is scored
    (before: a ValueError failed the whole call)."""
    from PIL import Image

    from rewardkit.rewards.hpsv2 import HPSv2

    reward = HPSv2(model=str(hps[1]), device="cpu")
    ok = Image.new("RGB", (64, 64), (200, 30, 30))
    out = reward([Image.new("RGB", (7000, 64)), ok], "a cat", on_error="nan")
    assert out.valid.tolist() == [False, True] and "side of 0 pixels" in out.errors[0]
    torch.testing.assert_close(out.scores[1:], reward([ok], "a cat").scores)
    edge = Image.new("RGB", (2048, 64))  # aspect 32: round(64 * 32 / 2048) = 1 pixel, still scored
    assert reward([edge], "a cat", on_error="nan").valid.all()


def test_aesthetic_conversion_parity(tmp_path, tiny_clip_dir):
    from transformers import CLIPModel

    from rewardkit.convert import convert
    from rewardkit.convert.tiny import write_tiny_aesthetic
    from rewardkit.rewards.aesthetic import Aesthetic

    ims = random_images(len(SIZES), sizes=SIZES, seed=2)
    clip = CLIPModel.from_pretrained(str(tiny_clip_dir)).eval()
    for act in (None, "relu"):
        name = "reluMSE" if act else "linearMSE"
        src = write_tiny_aesthetic(tmp_path / f"sac+logos+ava1-l14-{name}.pth", in_features=16, activation=act, seed=4)
        sd = torch.load(src, weights_only=True)
        want_keys = ["layers.0", "layers.3", "layers.6", "layers.9", "layers.11"] if act else \
            ["layers.0", "layers.2", "layers.4", "layers.6", "layers.7"]
        assert sorted({k.rsplit(".", 1)[0] for k in sd}) == sorted(want_keys)
        out = convert("aesthetic", src, tmp_path / f"out-{name}", clip=str(tiny_clip_dir))
        reward = Aesthetic(model=str(out), device="cpu")
        # reference: OpenAI CLIP transform (PIL bicubic short side, centre crop), encode_image, L2, MLP by hand
        with torch.no_grad():
            pix = torch.stack([_openai_clip_reference(im, 32) for im in ims])
            e = clip.get_image_features(pixel_values=pix)
            e = getattr(e, "pooler_output", e)
            x = e / e.norm(dim=-1, keepdim=True)
            for k in want_keys:
                x = x @ sd[k + ".weight"].T + sd[k + ".bias"]
                if act and k != want_keys[-1]:
                    x = x.clamp(min=0)
        got = reward(ims)
        torch.testing.assert_close(got.scores, x[:, 0], atol=1e-5, rtol=1e-4)
        assert json.loads((out / "rewardkit.json").read_text())["variant"] == ("relu" if act else "linear")


# OpenAI CLIP's _transform (PIL bicubic short side, int() long side, round() centre crop, ToTensor, normalise),
# transcribed from openai/CLIP clip/clip.py lines 79-86 in tests/helpers/upstream_preprocess.py
_openai_clip_reference = openai_clip_eval_pixels


def test_openai_clip_preprocessing_matches_recipe():
    from rewardkit.models.zoo import openai_clip_pixels

    ims = random_images(len(SIZES), sizes=SIZES, seed=7)
    got = openai_clip_pixels(ims, 24)
    for i, im in enumerate(ims):
        torch.testing.assert_close(got[i], _openai_clip_reference(im, 24), atol=1e-5, rtol=1e-5)


def test_openai_clip_pixels_equal_the_recipe_bit_for_bit_for_a_batch_and_for_decoded_crops():
    """The batched, in-place conversion gives exactly the per-image ToTensor + Normalize values (the transcription
    of clip/clip.py in tests/helpers/upstream_preprocess.py), for a batch of mixed sizes (upscaled, downscaled,
    already at the size, odd crop offsets) and for the crops ImageReward / aesthetic decode to
    (``official_openai_clip_rgb``), RGB or not."""
    from rewardkit.models.zoo import official_openai_clip_rgb, openai_clip_pixels

    sizes = [(24, 24), (25, 27), (97, 61), (61, 97), (100, 25), (13, 40)]
    ims = random_images(len(sizes), sizes=sizes, seed=11)
    ref = torch.stack([_openai_clip_reference(im, 24) for im in ims])
    assert torch.equal(openai_clip_pixels(ims, 24), ref)
    assert torch.equal(openai_clip_pixels([official_openai_clip_rgb(im, 24) for im in ims], 24), ref)
    for mode in ("RGBA", "L", "P"):  # the official order: resize and crop in that mode, then RGB
        crops = [official_openai_clip_rgb(im.convert(mode), 24) for im in ims]
        assert all(c.mode == "RGB" and c.size == (24, 24) for c in crops)
        assert torch.equal(openai_clip_pixels(crops, 24), torch.stack([_openai_clip_reference(c, 24) for c in crops]))


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickle_reader_refuses_non_tensor_objects(tmp_path, capsys):
    from rewardkit.convert import convert
    from rewardkit.convert._io import UnsafeCheckpointError, read_checkpoint

    bad = tmp_path / "evil.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "x": _Evil()}, bad)
    with pytest.raises(UnsafeCheckpointError, match="print"):  # protocol 2 names it __builtin__.print
        read_checkpoint(bad)
    assert "pwned" not in capsys.readouterr().out
    np_ckpt = tmp_path / "HPS_v2.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "arr": np.zeros(3)}, np_ckpt)
    with pytest.raises(UnsafeCheckpointError, match="numpy"):
        convert("hpsv2", np_ckpt, tmp_path / "o", tokenizer="unused")
    raw = tmp_path / "raw.pth"
    raw.write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(UnsafeCheckpointError):
        read_checkpoint(raw)
    assert "pwned" not in capsys.readouterr().out
    ok = tmp_path / "ok.pth"
    torch.save(OrderedDict(w=torch.ones(2)), ok)
    assert torch.equal(read_checkpoint(ok)["w"], torch.ones(2))
    legacy = tmp_path / "legacy.pth"  # torch's pre-1.6 (non-zip) format
    torch.save({"state_dict": OrderedDict(w=torch.ones(2).half())}, legacy, _use_new_zipfile_serialization=False)
    assert read_checkpoint(legacy)["state_dict"]["w"].dtype == torch.float16
    plain = tmp_path / "plain.pth"  # not written by torch.save: passes the scan, refused by torch's loader
    plain.write_bytes(pickle.dumps(OrderedDict(a=1)))
    with pytest.raises(UnsafeCheckpointError, match="refused"):
        read_checkpoint(plain)
    # a STACK_GLOBAL whose operands are rearranged on the stack (POP) cannot be followed: refused
    sneaky = (b"\x80\x04\x8c\x02os\x8c\x06system\x8c\x0bcollections\x8c\x0bOrderedDict0\x93)R." )
    (tmp_path / "sneaky.pth").write_bytes(sneaky)
    with pytest.raises(UnsafeCheckpointError):
        read_checkpoint(tmp_path / "sneaky.pth")


def test_runtime_refuses_pickles_and_wrong_dirs(hps, tmp_path):
    from rewardkit.rewards.aesthetic import Aesthetic
    from rewardkit.rewards.hpsv2 import HPSv2

    src, out, _ = hps
    with pytest.raises(ValueError, match="rewardkit convert hpsv2"):
        HPSv2(model=str(src))
    with pytest.raises(ValueError, match="converted for reward 'hpsv2'"):
        Aesthetic(model=str(out))
    with pytest.raises(ValueError, match="needs model="):
        HPSv2()
    with pytest.raises(FileExistsError):
        from rewardkit.convert import convert

        convert("hpsv2", src, out, tokenizer="unused")


def test_convert_cli(hps, tmp_path):
    from rewardkit.cli import main

    src, _, tok = hps
    rc = main(["convert", "hpsv2", str(src), str(tmp_path / "cli"), "--tokenizer", str(tok), "--heads", "2,2"])
    assert rc == 0 and (tmp_path / "cli" / "model.safetensors").is_file()
    assert main(["convert", "hpsv2", str(tmp_path / "missing.pt"), str(tmp_path / "x"), "--tokenizer", str(tok)]) == 2
    with pytest.raises(SystemExit):
        main(["convert", "nope", str(src), str(tmp_path / "x")])


# ------------------------------------------------------------------ ImageReward: BLIP ViT + med BERT, by hand
def _ln(x, sd, name, eps):
    return nn.functional.layer_norm(x, x.shape[-1:], sd[name + ".weight"], sd[name + ".bias"], eps)


def _lin(x, sd, name):
    return x @ sd[name + ".weight"].T + sd[name + ".bias"]


def _mha(q, k, v, heads, add_mask=None):
    b, tq, d = q.shape
    hd = d // heads
    q, k, v = (t.reshape(b, -1, heads, hd).transpose(1, 2) for t in (q, k, v))
    att = q @ k.transpose(-1, -2) / hd ** 0.5
    if add_mask is not None:
        att = att + add_mask
    return (att.softmax(-1) @ v).transpose(1, 2).reshape(b, tq, d)


def _blip_vit(sd, x, heads):
    p = "blip.visual_encoder."
    w = sd[p + "patch_embed.proj.weight"]
    x = nn.functional.conv2d(x, w, sd[p + "patch_embed.proj.bias"], stride=w.shape[-1]).flatten(2).transpose(1, 2)
    x = torch.cat([sd[p + "cls_token"].expand(x.shape[0], 1, -1), x], 1) + sd[p + "pos_embed"]
    i = 0
    while f"{p}blocks.{i}.norm1.weight" in sd:
        b = f"{p}blocks.{i}."
        h = _ln(x, sd, b + "norm1", 1e-6)
        q, k, v = _lin(h, sd, b + "attn.qkv").chunk(3, -1)
        x = x + _lin(_mha(q, k, v, heads), sd, b + "attn.proj")
        x = x + _lin(nn.functional.gelu(_lin(_ln(x, sd, b + "norm2", 1e-6), sd, b + "mlp.fc1")), sd, b + "mlp.fc2")
        i += 1
    return _ln(x, sd, p + "norm", 1e-6)


def _med_bert(sd, ids, mask, img, heads):
    t = "blip.text_encoder."
    x = sd[t + "embeddings.word_embeddings.weight"][ids] + sd[t + "embeddings.position_embeddings.weight"][: ids.shape[1]]
    x = _ln(x, sd, t + "embeddings.LayerNorm", 1e-12)
    add = (1.0 - mask[:, None, None, :].float()) * -1e9  # padding keys masked, bidirectional
    i = 0
    while f"{t}encoder.layer.{i}.attention.self.query.weight" in sd:
        L = f"{t}encoder.layer.{i}."
        for att, kv, m in (("attention", None, add), ("crossattention", img, None)):
            src = x if kv is None else kv
            a = _mha(_lin(x, sd, L + att + ".self.query"), _lin(src, sd, L + att + ".self.key"),
                     _lin(src, sd, L + att + ".self.value"), heads, m)
            x = _ln(_lin(a, sd, L + att + ".output.dense") + x, sd, L + att + ".output.LayerNorm", 1e-12)
        h = nn.functional.gelu(_lin(x, sd, L + "intermediate.dense"))
        x = _ln(_lin(h, sd, L + "output.dense") + x, sd, L + "output.LayerNorm", 1e-12)
        i += 1
    return x


def test_imagereward_conversion_parity(tmp_path):
    from transformers import AutoTokenizer

    from rewardkit.convert import convert
    from rewardkit.convert.tiny import save_tiny_bert_tokenizer, write_tiny_imagereward
    from rewardkit.rewards.imagereward import ImageReward

    tok_dir = save_tiny_bert_tokenizer(tmp_path / "tok")
    src = write_tiny_imagereward(tmp_path / "ir" / "ImageReward.pt", tokenizer_dir=tok_dir, seed=6)
    out = convert("imagereward", src, tmp_path / "out", tokenizer=str(tok_dir), vision_heads=2,
                  med_config=tmp_path / "ir" / "med_config.json")
    sd = torch.load(src, weights_only=True)
    # BLIP's tokenizer: bert + [DEC] (bos) + [ENC]; ImageReward pads / truncates to 35 tokens
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    assert len(tok) == sd["blip.text_encoder.embeddings.word_embeddings.weight"].shape[0]
    # "" : ImageReward scores an empty prompt ([CLS] [SEP] + padding), and so does rewardkit
    prompts = ["a cat on a mat", "two birds on a branch " * 8, "a red car", "a dog", "", "a green bowl"]
    ims = random_images(len(SIZES), sizes=SIZES, seed=8)
    enc = tok(prompts, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert enc["input_ids"].shape == (6, 35) and (enc["input_ids"][:, 0] == tok.cls_token_id).all()
    with torch.no_grad():
        img = _blip_vit(sd, torch.stack([_openai_clip_reference(im, 32) for im in ims]), heads=2)
        x = _med_bert(sd, enc["input_ids"], enc["attention_mask"], img, heads=2)[:, 0]
        for k in (0, 2, 4, 6, 7):
            x = _lin(x, sd, f"mlp.layers.{k}")
    raw = x[:, 0]
    want = (raw - 0.16717362830052426) / 1.0333394966054072
    reward = ImageReward(model=str(out), device="cpu")
    got = reward(ims, prompts)
    torch.testing.assert_close(got.dimensions["raw"], raw, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.scores, want, atol=1e-5, rtol=1e-4)
    # the padding really is masked (bidirectional encoder): a prompt alone gives the same score as in a batch
    alone = reward([ims[0]], [prompts[0]])
    torch.testing.assert_close(alone.scores, got.scores[:1], atol=1e-5, rtol=1e-4)
    assert not ImageReward(model=str(out), device="cpu", normalize=False)(ims[:2], prompts[:2]).scores.allclose(got.scores[:2])
    with pytest.raises(ValueError, match="converted for reward 'imagereward'"):
        from rewardkit.rewards.hpsv2 import HPSv2

        HPSv2(model=str(out))


def test_hpsv2_real_size_mapping_on_meta():
    """The published ViT-H-14 shapes (meta tensors, no memory): config read off the shapes and the mapped
    names / shapes fit transformers' CLIPModel exactly."""
    from transformers import CLIPConfig, CLIPModel

    from rewardkit.convert.hpsv2 import check_against_class
    from rewardkit.convert.openclip import clip_config_from_openclip, openclip_to_hf

    def m(*shape):
        return torch.empty(*shape, device="meta")

    sd = {"positional_embedding": m(77, 1024), "text_projection": m(1024, 1024), "logit_scale": m(()),
          "token_embedding.weight": m(49408, 1024), "ln_final.weight": m(1024), "ln_final.bias": m(1024),
          "visual.class_embedding": m(1280), "visual.positional_embedding": m(257, 1280), "visual.proj": m(1280, 1024),
          "visual.conv1.weight": m(1280, 3, 14, 14)}
    for p in ("visual.ln_pre", "visual.ln_post"):
        sd[p + ".weight"], sd[p + ".bias"] = m(1280), m(1280)
    for prefix, n, w in (("visual.transformer.resblocks.", 32, 1280), ("transformer.resblocks.", 24, 1024)):
        for i in range(n):
            b = f"{prefix}{i}."
            sd.update({b + "ln_1.weight": m(w), b + "ln_1.bias": m(w), b + "ln_2.weight": m(w), b + "ln_2.bias": m(w),
                       b + "attn.in_proj_weight": m(3 * w, w), b + "attn.in_proj_bias": m(3 * w),
                       b + "attn.out_proj.weight": m(w, w), b + "attn.out_proj.bias": m(w),
                       b + "mlp.c_fc.weight": m(4 * w, w), b + "mlp.c_fc.bias": m(4 * w),
                       b + "mlp.c_proj.weight": m(w, 4 * w), b + "mlp.c_proj.bias": m(w)})
    cfg = clip_config_from_openclip(sd, eos_token_id=49407)
    assert (cfg["vision_config"]["num_attention_heads"], cfg["text_config"]["num_attention_heads"]) == (16, 16)
    assert cfg["vision_config"]["image_size"] == 224 and cfg["vision_config"]["patch_size"] == 14
    assert cfg["vision_config"]["hidden_act"] == cfg["text_config"]["hidden_act"] == "gelu"
    assert (cfg["vision_config"]["num_hidden_layers"], cfg["text_config"]["num_hidden_layers"]) == (32, 24)
    hf = openclip_to_hf(sd, cfg)
    check_against_class(CLIPModel, CLIPConfig(**cfg), hf)
    assert hf["visual_projection.weight"].shape == (1024, 1280)


def test_imagereward_real_size_mapping_on_meta():
    """ImageReward's published shapes (BLIP ViT-L/16 at 224, med BERT-base with 1024-wide cross-attention,
    vocab 30524) as meta tensors: renamed, configured, and fitting transformers' BLIP modules exactly."""
    import transformers

    from rewardkit.convert.hpsv2 import check_against_class
    from rewardkit.convert.imagereward import MED_CONFIG, _split, blip_configs

    def m(*shape):
        return torch.empty(*shape, device="meta")

    v, t = "blip.visual_encoder.", "blip.text_encoder."
    sd = {v + "cls_token": m(1, 1, 1024), v + "pos_embed": m(1, 197, 1024), v + "patch_embed.proj.weight": m(1024, 3, 16, 16),
          v + "patch_embed.proj.bias": m(1024), v + "norm.weight": m(1024), v + "norm.bias": m(1024),
          t + "embeddings.word_embeddings.weight": m(30524, 768), t + "embeddings.position_embeddings.weight": m(512, 768),
          t + "embeddings.LayerNorm.weight": m(768), t + "embeddings.LayerNorm.bias": m(768),
          t + "embeddings.position_ids": m(1, 512), "blip.vision_proj.weight": m(256, 1024), "blip.vision_proj.bias": m(256),
          "blip.text_proj.weight": m(256, 768), "blip.text_proj.bias": m(256)}
    for i in range(24):
        b = f"{v}blocks.{i}."
        for n in ("norm1", "norm2"):
            sd[b + n + ".weight"], sd[b + n + ".bias"] = m(1024), m(1024)
        for n, o, i_ in (("attn.qkv", 3072, 1024), ("attn.proj", 1024, 1024), ("mlp.fc1", 4096, 1024), ("mlp.fc2", 1024, 4096)):
            sd[b + n + ".weight"], sd[b + n + ".bias"] = m(o, i_), m(o)
    for i in range(12):
        b = f"{t}encoder.layer.{i}."
        for att, kv in (("attention", 768), ("crossattention", 1024)):
            for n, o, i_ in (("self.query", 768, 768), ("self.key", 768, kv), ("self.value", 768, kv), ("output.dense", 768, 768)):
                sd[f"{b}{att}.{n}.weight"], sd[f"{b}{att}.{n}.bias"] = m(o, i_), m(o)
            sd[f"{b}{att}.output.LayerNorm.weight"], sd[f"{b}{att}.output.LayerNorm.bias"] = m(768), m(768)
        for n, o, i_ in (("intermediate.dense", 3072, 768), ("output.dense", 768, 3072)):
            sd[b + n + ".weight"], sd[b + n + ".bias"] = m(o, i_), m(o)
        sd[b + "output.LayerNorm.weight"], sd[b + "output.LayerNorm.bias"] = m(768), m(768)
    for k, (o, i_) in zip((0, 2, 4, 6, 7), ((1024, 768), (128, 1024), (64, 128), (16, 64), (1, 16))):
        sd[f"mlp.layers.{k}.weight"], sd[f"mlp.layers.{k}.bias"] = m(o, i_), m(o)

    class Tok:  # bert-base-uncased + [DEC] + [ENC]
        pad_token_id, bos_token_id, sep_token_id = 0, 30522, 102

        def __len__(self):
            return 30524

    vision, text, head = _split(sd)
    assert sorted(head) == sorted(f"layers.{k}.{p}" for k in (0, 2, 4, 6, 7) for p in ("weight", "bias"))
    vcfg, tcfg = blip_configs(transformers, vision, text, MED_CONFIG, Tok())
    assert (vcfg.num_attention_heads, vcfg.image_size, vcfg.layer_norm_eps) == (16, 224, 1e-6)
    assert (tcfg.num_attention_heads, tcfg.encoder_hidden_size, tcfg.vocab_size) == (12, 1024, 30524)
    check_against_class(transformers.BlipVisionModel, vcfg, vision)
    check_against_class(lambda c: transformers.BlipTextModel(c, add_pooling_layer=False), tcfg, text)


def test_tiny_bert_tokenizer_vocabulary_is_written_out(tmp_path):
    """The tiny ImageReward tokenizer's vocabulary is a pure function of the corpus (a trained WordPiece
    vocabulary broke ties in a per-process random order, so the tiny model's scores changed from run to run):
    two builds agree, and ids follow the documented layout (specials, sorted characters, "##" + characters)."""
    import string

    from transformers import AutoTokenizer

    from rewardkit.convert.tiny import save_tiny_bert_tokenizer

    a = AutoTokenizer.from_pretrained(str(save_tiny_bert_tokenizer(tmp_path / "a")))
    b = AutoTokenizer.from_pretrained(str(save_tiny_bert_tokenizer(tmp_path / "b")))
    assert a.get_vocab() == b.get_vocab()
    v = a.get_vocab()
    assert [v[t] for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]] == [0, 1, 2, 3, 4]
    chars = sorted(t for t in v if len(t) == 1 and v[t] >= 5)
    assert set(string.ascii_lowercase + string.digits) <= set(chars)
    assert [v[c] for c in chars] == list(range(5, 5 + len(chars)))
    assert [v["##" + c] for c in chars] == list(range(5 + len(chars), 5 + 2 * len(chars)))
    assert a.tokenize("Zebra-42") == ["z", "##e", "##b", "##r", "##a", "-", "4", "##2"]


def _official_openclip_clean(text):
    """Transcribed from hpsv2 1.2.0 ``hpsv2/src/open_clip/tokenizer.py`` lines 60-69 (``basic_clean``,
    ``whitespace_clean``), applied at line 141 as ``whitespace_clean(basic_clean(text)).lower()`` (the same
    functions as mlfoundations/open_clip ``src/open_clip/tokenizer.py`` and openai/CLIP ``clip/simple_tokenizer.py``).
    The lower-casing is left out: the transformers CLIP tokenizer lower-cases too."""
    import html
    import re

    import ftfy

    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text))
    text = text.strip()
    text = re.sub(r"\s+", " ", text)
    return text.strip()


CLEANING_CASES = [  # (prompt, the cleaned text, worked out by hand)
    ("fish &amp;amp; chips", "fish & chips"),                       # unescaped twice
    ("rock &amp; roll &lt;neon&gt;", "rock & roll <neon>"),
    ("\u201ca dog\u201d in a \u2018hat\u2019", "\"a dog\" in a 'hat'"),  # ftfy straightens curly quotes
    ("cafÃ© au lait", "caf\u00e9 au lait"),                          # ftfy repairs mojibake
    ("  two \t spaces\nand a newline  ", "two spaces and a newline"),
    ("caf\u00e9 \u4e00\u53ea\u732b", "caf\u00e9 \u4e00\u53ea\u732b"),  # left alone
    # ftfy.fix_text unescapes HTML entities itself (repeatedly) unless the text holds a "<", so only such a text tells
    # one html.unescape pass from two: "&amp;amp;" -> "&amp;" -> "&" (bug caught: one pass gave "&amp; sign")
    ("a &lt;neon&gt; &amp;amp; sign <3", "a <neon> & sign <3"),
]


@pytest.mark.parametrize("prompt,cleaned", CLEANING_CASES)
def test_openclip_clean_matches_the_official_cleaning(prompt, cleaned):
    from rewardkit.models.clip import openclip_clean

    assert _official_openclip_clean(prompt) == cleaned
    assert openclip_clean(prompt) == cleaned


def test_hpsv2_cleans_prompts_as_its_official_tokenizer(hps):
    """HPSv2 scores a prompt as the official tokenizer sees it: the reference embeds the officially cleaned text
    (which differs in token ids from the raw one for every case below, checked), the reward gets the raw prompt."""
    from transformers import AutoTokenizer

    from rewardkit.rewards.hpsv2 import HPSv2

    src, out, tok_dir = hps
    sd = torch.load(src, weights_only=True)["state_dict"]
    ref = OpenCLIPRef(sd, heads=2).eval()
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    raw = [p for p, _ in CLEANING_CASES[:5]]
    cleaned = [_official_openclip_clean(p) for p in raw]
    for r, c in zip(raw, cleaned):
        assert tok(r)["input_ids"] != tok(c)["input_ids"], r
    ims = random_images(len(raw), sizes=SIZES[: len(raw)], seed=4)
    with torch.no_grad():
        img = nn.functional.normalize(ref.encode_image(torch.stack([_hpsv2_reference_pixels(i, 32) for i in ims])), dim=-1)
        ids = tok(cleaned, padding=True, return_tensors="pt")["input_ids"]
        txt = nn.functional.normalize(ref.encode_text(ids, tok.eos_token_id), dim=-1)
    got = HPSv2(model=str(out), device="cpu")(ims, raw)
    torch.testing.assert_close(got.scores, (img * txt).sum(-1), atol=1e-5, rtol=1e-4)


def test_token_rows_are_cached_and_equal_a_fresh_tokenizer_call(hps, tmp_path, monkeypatch):
    """Issue 41: HPSv2's (CLIP backbone's) and ImageReward's token rows, kept per text, are the rows one
    tokenizer call on the batch gives (cleaning included), on a first call and a repeated one, in any order and
    with repeats; an over-long prompt still counts as truncated; a caller changing the returned tensors does
    not change the next call's."""
    from rewardkit.models.clip import openclip_clean
    from rewardkit.rewards.hpsv2 import HPSv2
    from rewardkit.rewards.imagereward import ImageReward

    _, out, _ = hps
    bb = HPSv2(model=str(out), device="cpu").backbone
    long = " ".join(["a quiet village by the sea"] * 30)
    for texts in (["fish &amp;amp; chips", "a cat", long], ["a cat", "a cat"], ["a cat", "fish &amp;amp; chips", long]):
        for _ in range(2):
            ids, mask, truncated = bb.tokenize(texts)
            tok = bb.processor.tokenizer
            want = tok([openclip_clean(t) for t in texts], padding=True, truncation=True, max_length=bb.max_length,
                       return_tensors="pt")
            assert torch.equal(ids, want["input_ids"]) and torch.equal(mask, want["attention_mask"])
            assert truncated == (long in texts)
            ids.zero_()  # the caller's copy
    ir = ImageReward.tiny(str(tmp_path))
    prompts = ["a dog", long, "a dog", "", "CAFÉ au lait"]
    for _ in range(2):
        got = ir._token_rows(prompts)
        want = ir.tokenizer(prompts, padding="max_length", truncation=True, max_length=ir.max_length,
                            return_tensors="pt")
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(got["attention_mask"],
                                                                                 want["attention_mask"])
        got["input_ids"].zero_()
    monkeypatch.setattr("rewardkit.rewards.imagereward.TOKEN_ROWS_KEPT", 5)  # the cache starts over mid-call
    more = ["a new one", "a dog", "another", long]
    got = ir._token_rows(more)
    want = ir.tokenizer(more, padding="max_length", truncation=True, max_length=ir.max_length, return_tensors="pt")
    assert torch.equal(got["input_ids"], want["input_ids"])


def test_openai_clip_pixels_channel_stats_are_built_once_and_are_ordinary_tensors():
    """The mean / std operands are kept per (mean, std, dtype) instead of built on every call (issue 41): the same
    values, and ordinary tensors even when first built under inference mode (usable outside it, with autograd)."""
    from rewardkit.models import zoo

    ims = random_images(2, sizes=[(30, 20), (24, 24)], seed=3)
    zoo._CHANNEL_STATS.clear()
    with torch.inference_mode():
        a = zoo.openai_clip_pixels(ims, 24)
    m, s = zoo._CHANNEL_STATS[(zoo.CLIP_MEAN, zoo.CLIP_STD, torch.float32)]
    assert not m.is_inference() and not s.is_inference()
    assert torch.equal(zoo.openai_clip_pixels(ims, 24), a) and len(zoo._CHANNEL_STATS) == 1
    other = zoo.openai_clip_pixels(ims, 24, mean=(0.5, 0.5, 0.5), std=[0.5, 0.5, 0.5])  # a list is keyed too
    assert len(zoo._CHANNEL_STATS) == 2 and not torch.equal(other, a)
    assert torch.equal(zoo._CHANNEL_STATS[(zoo.CLIP_MEAN, zoo.CLIP_STD, torch.float32)][0], m)  # never written
