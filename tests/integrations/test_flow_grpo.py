"""The flow_grpo / DiffusionNFT drop-in as their training scripts use it.

References are transcriptions of the original code, NVlabs/DiffusionNFT @ 24af5554 (the same files as
yifan123/flow_grpo), cited by file and line:

- ``scripts/train_nft_sd3.py:529-530``: ``reward_fn = getattr(flow_grpo.rewards, "multi_score")(device,
  config.reward_fn)`` with ``config.reward_fn`` an ``ml_collections.ConfigDict`` (``config/nft.py:58``);
- ``scripts/train_nft_sd3.py:664,681-682``: ``executor.submit(reward_fn, images, prompts, prompt_metadata,
  only_strict=True)``, then ``{k: torch.as_tensor(v, device=device).float() for k, v in rewards.items()}``;
- ``flow_grpo/rewards.py`` and its scorer files for each reward's scale.
"""

from __future__ import annotations

import re
from concurrent import futures

import numpy as np
import pytest
import torch

from rewardkit.integrations.flow_grpo import FLOW_GRPO_CONVENTIONS, _named, multi_score
from rewardkit.judges import JudgeBackend

ml_collections = pytest.importorskip("ml_collections")

PROMPTS = ("a photo of a cat", "a red car on a road", "two birds on a branch", "a bowl of soup")


def k255_batch(n=4, size=32, seed=0):
    """Float NCHW in [0, 1] holding exact k/255 values (so flow_grpo's uint8 round trip is lossless)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g).float() / 255.0


# ------------------------------------------------------------------------------------ item 1: ConfigDict
def test_multi_score_takes_the_configdict_the_scripts_pass(tiny_clip_dir):
    # Bug caught: multi_score refused config.reward_fn ("score_dict must be a non-empty {name: weight} mapping")
    # because a ConfigDict is not a collections.abc.Mapping.
    config = ml_collections.ConfigDict()
    config.reward_fn = {"pickscore": 1.0, "clipscore": 0.5}          # config/nft.py:58
    assert not isinstance(config.reward_fn, dict)
    kw = {"model": str(tiny_clip_dir), "device": "cpu"}
    fn = multi_score(torch.device("cpu"), config.reward_fn, reward_kwargs={"pickscore": kw, "clipscore": kw})
    details, _ = fn(k255_batch(), PROMPTS, tuple({} for _ in PROMPTS), only_strict=True)
    assert set(details) == {"pickscore", "clipscore", "avg"}
    np.testing.assert_allclose(details["avg"], details["pickscore"] + 0.5 * details["clipscore"], atol=1e-6)
    with pytest.raises(ValueError, match="non-empty"):
        multi_score("cpu", ml_collections.ConfigDict())
    with pytest.raises(TypeError, match="mapping"):
        multi_score("cpu", ["pickscore"])



def test_weights_are_read_at_each_call_as_flow_grpo_does():
    """flow_grpo's ``_fn`` iterates ``score_dict.items()`` at every call (rewards.py:281), so a weight changed
    in ``config.reward_fn`` after ``multi_score`` was built (a schedule, a curriculum) applies to the next call.
    Before: the drop-in copied the weights once and kept using the old ones."""
    from rewardkit.testing import random_images

    prompts = ("a cat", "a dog")
    backend = Answers({"a cat": "4", "a dog": "2"})
    config = ml_collections.ConfigDict({"reward_fn": {"unifiedreward": 1.0}})
    fn = multi_score("cpu", config.reward_fn, reward_kwargs={"unifiedreward": {"judge": backend}})
    imgs = random_images(2, size=16, seed=2)
    assert fn(imgs, prompts, None)[0]["avg"].tolist() == pytest.approx([0.8, 0.4])
    config.reward_fn.unifiedreward = 3.0                      # rewards.py:293-300 with the new weight
    assert fn(imgs, prompts, None)[0]["avg"].tolist() == pytest.approx([2.4, 1.2])
    config.reward_fn.pickscore = 1.0                          # flow_grpo: KeyError in score_fns
    with pytest.raises(ValueError, match="pickscore.*built no scorer"):
        fn(imgs, prompts, None)

# ------------------------------------------------------------------------------------ item 2: scales
def _flow_grpo_pickscore(model_dir, images, prompts):
    """flow_grpo/rewards.py:86-90 (tensor -> uint8 NHWC -> PIL) and pickscore_scorer.py:20-51, transcribed."""
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    images = (images * 255).round().clamp(0, 255).to(torch.uint8).cpu().numpy()
    images = images.transpose(0, 2, 3, 1)
    images = [Image.fromarray(image) for image in images]
    with torch.no_grad():
        image_inputs = processor(images=images, padding=True, truncation=True, max_length=77, return_tensors="pt")
        text_inputs = processor(text=list(prompts), padding=True, truncation=True, max_length=77,
                                return_tensors="pt")
        image_embs = model.get_image_features(**image_inputs)
        image_embs = getattr(image_embs, "pooler_output", image_embs)   # transformers 5 returns an output object
        image_embs = image_embs / image_embs.norm(p=2, dim=-1, keepdim=True)
        text_embs = model.get_text_features(**text_inputs)
        text_embs = getattr(text_embs, "pooler_output", text_embs)
        text_embs = text_embs / text_embs.norm(p=2, dim=-1, keepdim=True)
        logit_scale = model.logit_scale.exp()
        scores = logit_scale * (text_embs @ image_embs.T)
        scores = scores.diag()
        scores = scores / 26
    return scores.numpy()


def _flow_grpo_clipscore(model_dir, pixels, prompts):
    """flow_grpo/clip_scorer.py:22-30 (the transform built from the processor) and :42-56, transcribed.

    torchvision is not installed here: the inputs are at the processor's size (32 = ``size.shortest_edge`` =
    ``crop_size``), where ``T.Resize`` and ``T.CenterCrop`` are identities, so only ``T.Normalize`` is written
    out (``(x - mean) / std`` per channel)."""
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(model_dir).eval()
    processor = CLIPProcessor.from_pretrained(model_dir)
    config = processor.image_processor.to_dict()
    assert pixels.shape[-2:] == (config["size"]["shortest_edge"],) * 2 == (config["crop_size"]["height"],) * 2
    mean = torch.tensor(processor.image_processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_processor.image_std).view(1, 3, 1, 1)
    with torch.no_grad():
        texts = processor(text=list(prompts), padding="max_length", truncation=True, return_tensors="pt")
        pixels = ((pixels - mean) / std if config.get("do_normalize") else pixels).to(dtype=pixels.dtype)
        outputs = model(pixel_values=pixels, **texts)
        return (outputs.logits_per_image.diagonal() / 100).numpy()


class Answers(JudgeBackend):
    """A judge that answers ``Final Score: <x>`` with x chosen per prompt (UnifiedReward's t2i format)."""

    kind = "answers"

    def __init__(self, by_prompt):
        self.by_prompt = by_prompt

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None,
                 row_errors=None):
        out = []
        for c in conversations:
            text = c[0]["content"][-1]["text"]
            x = next(v for k, v in self.by_prompt.items() if k in text)
            out.append([f"The image matches.\nFinal Score: {x}"])
            if row_errors is not None:
                row_errors.append(None)
        return out

    def choice_probs(self, conversations, choices):
        raise NotImplementedError


def _flow_grpo_unifiedreward(texts):
    """flow_grpo/rewards.py:193-205 (_extract_scores) and :249-250 (score / 5.0), transcribed."""
    scores = []
    pattern = r"Final Score:\s*([1-5](?:\.\d+)?)"
    for text in texts:
        match = re.search(pattern, text)
        if match:
            try:
                scores.append(float(match.group(1)))
            except ValueError:
                scores.append(0.0)
        else:
            scores.append(0.0)
    return [sc / 5.0 for sc in scores]


def test_pickscore_and_clipscore_on_flow_grpos_scale(tiny_clip_dir):
    # Bug caught: the drop-in used rewardkit's scales (PickScore = logit_scale * cos ~ 20, CLIPScore =
    # 2.5 * max(cos, 0) on ViT-B/32), so {"pickscore": 1, "clipscore": 1} did not weigh them as flow_grpo does.
    imgs = k255_batch()
    kw = {"model": str(tiny_clip_dir), "device": "cpu"}
    details, _ = multi_score("cpu", ml_collections.ConfigDict({"pickscore": 1.0, "clipscore": 2.0}),
                             reward_kwargs={"pickscore": kw, "clipscore": kw})(imgs, PROMPTS, None)
    ref_pick = _flow_grpo_pickscore(str(tiny_clip_dir), imgs, PROMPTS)
    ref_clip = _flow_grpo_clipscore(str(tiny_clip_dir), imgs, PROMPTS)
    np.testing.assert_allclose(details["pickscore"], ref_pick, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(details["clipscore"], ref_clip, rtol=1e-5, atol=1e-6)
    # rewards.py:293-300: avg = sum of weight * score
    np.testing.assert_allclose(details["avg"], ref_pick + 2.0 * ref_clip, rtol=1e-5, atol=1e-6)
    # the model flow_grpo's CLIP scorer loads (clip_scorer.py:37) is the default under the drop-in
    assert _named("clipscore", None, "flow_grpo")[0]["model"] == "openai/clip-vit-large-patch14"
    # conventions="rewardkit" keeps rewardkit's own defaults (PickScore x26 of the above)
    own, _ = multi_score("cpu", {"pickscore": 1.0}, reward_kwargs={"pickscore": kw},
                         conventions="rewardkit")(imgs, PROMPTS, None)
    np.testing.assert_allclose(own["pickscore"], 26 * ref_pick, rtol=1e-5)


def test_unifiedreward_on_flow_grpos_scale():
    from rewardkit.testing import random_images

    prompts = ("a cat", "a dog", "a bird")
    backend = Answers({"a cat": "4", "a dog": "2.5", "a bird": "5"})
    fn = multi_score("cpu", ml_collections.ConfigDict({"unifiedreward": 1.0}),
                     reward_kwargs={"unifiedreward": {"judge": backend}})
    details, _ = fn(random_images(3, size=16, seed=1), prompts, None)
    answers = [f"The image matches.\nFinal Score: {x}" for x in ("4", "2.5", "5")]
    np.testing.assert_allclose(details["unifiedreward"], _flow_grpo_unifiedreward(answers), rtol=1e-7)
    assert details["unifiedreward"].tolist() == pytest.approx([0.8, 0.5, 1.0])


@pytest.mark.parametrize("name", ["hpsv2", "imagereward", "aesthetic"])
def test_names_whose_rewardkit_default_already_is_flow_grpos_scale(name):
    """HPSv2.1: flow_grpo's ``image_features @ text_features.T`` on open_clip's L2-normalised features
    (hpsv2_scorer.py:127-130) is the cosine rewardkit returns at scale 1; ImageReward: ``inference_rank``'s
    ``(mlp - mean) / std`` (imagereward_scorer.py:25) is rewardkit's normalize=True; aesthetic: the raw MLP
    output (aesthetic_scorer.py:47-50). The formulas themselves are checked against the original models in
    tests/rewards/test_zoo_clip.py (*_conversion_parity); here: the drop-in keeps them unscaled."""
    import dataclasses

    from rewardkit.registry import get_reward_class

    kwargs, factor = _named(name, None, "flow_grpo")
    assert factor == 1.0
    defaults = {f.name: f.default for f in dataclasses.fields(get_reward_class(name).Config)}
    assert all(defaults[k] == v for k, v in kwargs.items()), (kwargs, defaults)


def test_every_convention_names_real_options_of_its_reward():
    """Each row's options are fields of the reward's Config (a typo would only fail at a trainer's first step)."""
    import dataclasses

    from rewardkit.registry import get_reward_class

    from rewardkit.registry import list_rewards

    for name, conv in FLOW_GRPO_CONVENTIONS.items():
        if name == "geneval" and name not in list_rewards():
            continue  # the geneval reward lives on its own branch until merged; its row names no options
        fields = {f.name for f in dataclasses.fields(get_reward_class(name).Config)}
        assert set(conv.kwargs) <= fields, (name, set(conv.kwargs) - fields)
        assert conv.factor > 0 and conv.source


def _levenshtein(a, b):
    """Unit-cost Levenshtein distance (what ``Levenshtein.distance`` computes), the textbook DP written out
    here so that the reference does not share rewardkit's own edit_distance."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _flow_grpo_ocr(recognized_text, prompt):
    """flow_grpo/ocr.py:27 (target = first "..." span) and :44-58, transcribed (``Levenshtein.distance`` as
    :func:`_levenshtein`)."""
    distance = _levenshtein
    assert distance("kitten", "sitting") == 3 and distance("", "abc") == 3   # the classic values

    prompt = prompt.split('"')[1]
    recognized_text = recognized_text.replace(" ", "").lower()
    prompt = prompt.replace(" ", "").lower()
    if prompt in recognized_text:
        dist = 0
    else:
        dist = distance(recognized_text, prompt)
    if dist > len(prompt):
        dist = len(prompt)
    return 1 - dist / (len(prompt))


def test_ocr_scale_and_the_documented_rule_differences():
    from rewardkit.rewards.ocr import extract_quoted, normalize_text, ocr_similarity

    kwargs, factor = _named("ocr", None, "flow_grpo")
    assert factor == 1.0

    def ours(read, prompt):
        target = normalize_text(" ".join(extract_quoted(prompt)), whitespace=kwargs["whitespace"])
        return ocr_similarity(target, normalize_text(read), normalize_by=kwargs["normalize_by"])[0]

    prompt = 'A sign that says "Hello World"'
    for read in ("Hello World", "helo world", "HELLO  WORLD", "xyz", "", "Hello Wor1d"):
        assert ours(read, prompt) == pytest.approx(_flow_grpo_ocr(read, prompt)), read
    # documented differences (docs/integrations.md): flow_grpo gives 1.0 when the target is contained in more
    # text; rewardkit's match="full" charges the extra characters (7 extra for 10 target characters here)
    assert _flow_grpo_ocr("OPEN Hello World", prompt) == 1.0
    assert ours("OPEN Hello World", prompt) == pytest.approx(1 - 4 / 10)


@pytest.mark.skipif(__import__("shutil").which("tesseract") is None, reason="tesseract-ocr is not installed")
def test_ocr_drop_in_case_folds_as_flow_grpo():
    """docs/integrations.md: flow_grpo's OCR compares case-folded, space-free text (ocr.py:44-58); the drop-in's
    `ocr` must too. A rendered lower-case "hello world" against the prompt's upper-case "HELLO WORLD", scored through
    `multi_score` (the reward built from the convention table), equals the transcription on the same reading.
    Bug caught: the convention losing `case_sensitive: False` (10 of 10 letters differ in case: the score would fall
    to 0 while flow_grpo's stays at its case-blind value); the string-level test above never builds the reward."""
    from PIL import Image, ImageDraw, ImageFont

    from rewardkit.rewards.ocr import OCRReward

    im = Image.new("RGB", (384, 128), "white")
    ImageDraw.Draw(im).text((40, 42), "hello world", fill="black", font=ImageFont.load_default(size=44))
    prompt = 'A sign that says "HELLO WORLD"'
    raw = OCRReward(num_workers=1).read_text(im)  # the same engine's reading, raw
    assert any(c.islower() for c in raw), raw
    expected = _flow_grpo_ocr(raw, prompt)
    assert expected > 0.5  # the reading is close to the target once case is ignored
    x = torch.from_numpy(np.array(im)).permute(2, 0, 1)[None].float() / 255.0
    out, _ = multi_score("cpu", {"ocr": 1.0})(x, [prompt], [{}])
    assert float(out["ocr"][0]) == pytest.approx(expected)


#: every name in the multi_score tables of flow_grpo (ac4c86e, 54809b5, 94e23ee: rewards.py ``score_functions``)
#: and DiffusionNFT (24af555 rewards.py:257-267), plus DDPO's jpeg_incompressibility
HOST_NAMES = {"deqa", "ocr", "video_ocr", "hpsv2_score", "imagereward", "pickscore", "qwenvl", "aesthetic",
              "jpeg_compressibility", "unifiedreward", "geneval", "seedscore", "clipscore", "image_similarity",
              "hpsv2", "jpeg_incompressibility"}


def test_every_host_name_is_scored_or_refused_with_the_reason():
    from rewardkit.integrations.flow_grpo import _NOT_IN_REWARDKIT
    from rewardkit.registry import resolve_name

    for name in sorted(HOST_NAMES - set(_NOT_IN_REWARDKIT)):
        canon = resolve_name(name) if name != "geneval" else "geneval"   # hpsv2_score: a registry alias
        assert canon in FLOW_GRPO_CONVENTIONS, name
    with pytest.raises(ValueError, match="deqa.*trust_remote_code"):
        multi_score("cpu", {"deqa": 1.0})
    for name in ("video_ocr", "image_similarity", "seedscore"):
        with pytest.raises(ValueError, match=name):
            multi_score("cpu", {name: 1.0})
    with pytest.raises(ValueError, match="conventions must be one of"):
        multi_score("cpu", {"pickscore": 1.0}, conventions="other")
    assert set(_NOT_IN_REWARDKIT) == {"deqa", "video_ocr", "image_similarity", "seedscore"}


def test_jpeg_compressibility_on_flow_grpos_scale():
    from tests.helpers.host_rewards import flow_grpo_jpeg_compressibility, host_jpeg_incompressibility

    images = k255_batch(4, size=40, seed=3)
    details, _ = multi_score("cpu", {"jpeg_compressibility": 2.0, "jpeg_incompressibility": 1.0})(
        images, PROMPTS, ({},) * 4, only_strict=True)
    want = flow_grpo_jpeg_compressibility(images)
    np.testing.assert_array_equal(details["jpeg_compressibility"], want.astype(np.float32))
    np.testing.assert_array_equal(details["jpeg_incompressibility"], host_jpeg_incompressibility(images).astype(
        np.float32))
    np.testing.assert_allclose(details["avg"], 2.0 * want + host_jpeg_incompressibility(images), rtol=1e-6)


def test_qwenvl_and_hpsv2_score_names():
    from tests.helpers.host_rewards import flow_grpo_qwenvl_score

    class Tags(JudgeBackend):
        kind = "tags"

        def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
            return [["<Thought>x</Thought><Score>4</Score>"] for _ in conversations]

        def choice_probs(self, conversations, choices):
            raise NotImplementedError

    details, _ = multi_score("cpu", {"qwenvl": 1.0}, reward_kwargs={"qwenvl": {"judge": Tags()}})(
        k255_batch(2, size=16), PROMPTS[:2], None)
    assert details["qwenvl"].tolist() == pytest.approx([flow_grpo_qwenvl_score("<Score>4</Score>")] * 2)
    # flow_grpo @ 94e23ee names HPSv2 "hpsv2_score": the same scorer and scale as DiffusionNFT's "hpsv2"
    assert _named("hpsv2_score", None, "flow_grpo") == _named("hpsv2", None, "flow_grpo")


class FakeGenEval:
    """A stand-in ``geneval`` reward with the real reward's per-sample details (the official record fields plus
    reward-server's ``strict_correct`` and ``score``), its verdicts read from each metadata row's ``_verdict``.
    Built lazily as a Reward subclass so the module imports no reward machinery at collection."""

    @staticmethod
    def build():
        from rewardkit.reward import Reward, RewardOutput

        class _Fake(Reward):
            name = "fake-geneval"
            uses_prompt = False

            def __init__(self):
                super().__init__()
                self.seen = []

            def _score(self, batch):
                self.seen += list(batch.metadata)
                details = [{"correct": m["_verdict"][0], "strict_correct": m["_verdict"][1],
                            "score": m["_verdict"][2], "reason": "", "details": {}} for m in batch.metadata]
                return RewardOutput(scores=torch.tensor([d["score"] for d in details]), details=details)

        return _Fake()


GENEVAL_ROWS = (
    {"tag": "counting", "include": [{"class": "dog", "count": 2}], "prompt": "a photo of two dogs",
     "_verdict": (True, False, 0.5)},
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a photo of a red car",
     "_verdict": (True, True, 1.0)},
    {"tag": "position", "include": [{"class": "cup", "count": 1}, {"class": "bowl", "count": 1,
                                                                    "position": ["left of", 0]}],
     "prompt": "a photo of a bowl left of a cup", "_verdict": (False, False, 0.25)},
)


@pytest.mark.parametrize("only_strict", [True, False])
def test_geneval_returns_flow_grpos_shape_with_metadata_passed_through(only_strict):
    """The keys, their order and values equal flow_grpo's multi_score over reward-server's compute_geneval
    (transcribed in tests/helpers/host_rewards.py) for the same per-image verdicts; the metadata rows reach the
    reward unchanged."""
    from tests.helpers.host_rewards import flow_grpo_multi_score_geneval

    fake = FakeGenEval.build()
    details, info = multi_score("cpu", {"geneval": 1.0}, rewards={"geneval": fake})(
        k255_batch(3, size=16), tuple(r["prompt"] for r in GENEVAL_ROWS), GENEVAL_ROWS, only_strict=only_strict)
    assert fake.seen == list(GENEVAL_ROWS)
    server = [{"tag": r["tag"], "correct": r["_verdict"][0] and not only_strict, "strict_correct": r["_verdict"][1],
               "score": r["_verdict"][2]} for r in GENEVAL_ROWS]
    want = flow_grpo_multi_score_geneval(server)
    assert list(details) == list(want)
    for k in want:
        np.testing.assert_allclose(details[k], np.asarray(want[k], dtype=np.float32), err_msg=k)
    assert details["counting_strict_accuracy"].tolist() == [0.0, -10.0, -10.0]


def test_geneval_without_metadata_is_refused():
    with pytest.raises(ValueError, match="metadata row"):
        multi_score("cpu", {"geneval": 1.0}, rewards={"geneval": FakeGenEval.build()})(
            k255_batch(2, size=16), ("a", "b"), None)


def test_done_when_geneval_and_pickscore_from_a_flow_grpo_style_script(tmp_path, tiny_clip_dir):
    """Issue 37's done-when, ``multi_score(device, {"geneval": 1.0, "pickscore": 0.5})``, with the registered
    ``geneval`` reward's tiny instance (runs once the geneval reward is registered)."""
    from rewardkit.registry import get_reward_class, list_rewards

    if "geneval" not in list_rewards():
        pytest.skip("no reward registered as 'geneval' on this branch")
    rows = tuple({k: v for k, v in r.items() if k != "_verdict"} for r in GENEVAL_ROWS)
    config = ml_collections.ConfigDict({"reward_fn": {"geneval": 1.0, "pickscore": 0.5}})
    fn = multi_score(torch.device("cpu"), config.reward_fn,
                     rewards={"geneval": get_reward_class("geneval").tiny(str(tmp_path))},
                     reward_kwargs={"pickscore": {"model": str(tiny_clip_dir), "device": "cpu"}})
    with futures.ThreadPoolExecutor(8) as ex:
        details, _ = ex.submit(fn, k255_batch(3, size=32), tuple(r["prompt"] for r in rows), rows,
                               only_strict=True).result()
    rewards = {k: torch.as_tensor(v).float() for k, v in details.items()}
    for k in ("geneval", "pickscore", "avg", "accuracy", "strict_accuracy", "counting_strict_accuracy"):
        assert rewards[k].shape == (3,), k
    np.testing.assert_allclose(details["avg"], details["geneval"] + 0.5 * details["pickscore"], rtol=1e-5)


# ------------------------------------------------------------------------------------ item 3: done-when
def test_a_flow_grpo_style_script_trains_two_steps_with_the_documented_change(tiny_clip_dir):
    """A miniature of train_nft_sd3.py's reward path with the change docs/integrations.md documents: a real
    ConfigDict, the executor call shape, the host's tensor conversion, per-prompt advantages, two optimizer
    steps of a tiny 'generator' whose output images are scored by rewardkit at flow_grpo's scale."""
    from rewardkit.integrations import flow_grpo as rewardkit_rewards   # the documented import

    config = ml_collections.ConfigDict()
    config.reward_fn = {"pickscore": 1.0, "clipscore": 1.0}
    device = torch.device("cpu")
    kw = {"model": str(tiny_clip_dir), "device": "cpu"}
    # the two documented lines (train_nft_sd3.py:529-530), plus the tiny models' paths for this test
    reward_fn = getattr(rewardkit_rewards, "multi_score")(device, config.reward_fn,
                                                          reward_kwargs={"pickscore": kw, "clipscore": kw})
    eval_reward_fn = getattr(rewardkit_rewards, "multi_score")(device, config.reward_fn,
                                                               reward_kwargs={"pickscore": kw, "clipscore": kw})
    torch.manual_seed(0)
    generator = torch.nn.Sequential(torch.nn.Linear(8, 3 * 32 * 32), torch.nn.Sigmoid())
    opt = torch.optim.SGD(generator.parameters(), lr=0.1)
    executor = futures.ThreadPoolExecutor(max_workers=8)
    prompts = ("a cat", "a cat", "a dog", "a dog")
    prompt_metadata = tuple({} for _ in prompts)
    before = [p.detach().clone() for p in generator.parameters()]
    for step in range(2):
        z = torch.randn(4, 8)
        images = generator(z).view(4, 3, 32, 32)
        future = executor.submit(reward_fn, images.detach(), prompts, prompt_metadata, only_strict=True)
        rewards, reward_metadata = future.result()
        rewards = {k: torch.as_tensor(v, device=device).float() for k, v in rewards.items()}   # :682
        assert set(rewards) == {"pickscore", "clipscore", "avg"} and rewards["avg"].shape == (4,)
        avg = rewards["avg"]
        # flow_grpo/stat_tracking.py (global std): group mean per prompt, std over all, + 1e-4
        groups = {p: avg[[i for i, q in enumerate(prompts) if q == p]].mean() for p in set(prompts)}
        adv = torch.stack([avg[i] - groups[p] for i, p in enumerate(prompts)]) / (avg.std(unbiased=False) + 1e-4)
        loss = -(adv.detach() * images.mean(dim=(1, 2, 3))).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
    eval_rewards, _ = executor.submit(eval_reward_fn, images.detach(), prompts, prompt_metadata,
                                      only_strict=False).result()
    executor.shutdown()
    assert any(not torch.equal(a, b) for a, b in zip(before, generator.parameters()))
    ref = (_flow_grpo_pickscore(str(tiny_clip_dir), images.detach(), prompts)
           + _flow_grpo_clipscore(str(tiny_clip_dir), images.detach(), prompts))
    # images here are arbitrary floats: flow_grpo's PickScore path rounds to uint8 first, rewardkit's does not
    np.testing.assert_allclose(eval_rewards["avg"], ref, atol=2e-3)


def test_multi_reward_preset_is_on_flow_grpos_scales():
    # Bug caught: the multi_reward preset (config/nft.py:122-137: pickscore + hpsv2 + clipscore, weight 1 each)
    # used rewardkit's defaults, so PickScore (~20) outweighed HPSv2 (~0.3) and CLIPScore by ~60x.
    from rewardkit.config import build_config
    from rewardkit.rl.config import FLOW_GRPO_REWARD_KWARGS, NFTConfig, preset

    cfg = build_config(NFTConfig, preset("multi_reward"))
    assert cfg.rewards == {"pickscore": 1.0, "hpsv2": 1.0, "clipscore": 1.0}
    for name in cfg.rewards:
        assert {**cfg.reward_kwargs.get(name, {})} == dict(FLOW_GRPO_CONVENTIONS[name].kwargs) or \
            (name == "hpsv2" and not cfg.reward_kwargs.get(name))          # hpsv2: rewardkit's default scale
        assert FLOW_GRPO_CONVENTIONS[name].factor == 1.0                   # no factor the trainer cannot apply
    assert FLOW_GRPO_REWARD_KWARGS == {n: dict(FLOW_GRPO_CONVENTIONS[n].kwargs) for n in FLOW_GRPO_REWARD_KWARGS}
    assert cfg.reward_kwargs["pickscore"]["scale"] == pytest.approx(1 / 26)
    # a user's reward_kwargs (the converted HPSv2 weights) merge with the preset's, key by key
    from rewardkit.config import _merge

    user = build_config(NFTConfig, _merge(preset("multi_reward"), {"reward_kwargs": {"hpsv2": {"model": "d"},
                                                                                     "pickscore": {"dtype": "bfloat16"}}}))
    assert user.reward_kwargs["pickscore"] == {"scale": 1 / 26, "dtype": "bfloat16"}
    assert user.reward_kwargs["clipscore"]["convention"] == "logits100"
