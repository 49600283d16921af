"""HPSv3 (``MizzenAI/HPSv3`` ``HPSv3.safetensors``, or the ``.pth``) -> a rewardkit preference-model directory.

HPSv3 is Qwen2-VL-7B-Instruct + a ``<|Reward|>`` special token + HPSv3's ``ranknet`` head on that token's
last hidden state. The checkpoint is a bare full-model state dict in transformers-4.45 key names
(``model.layers.*``, ``model.embed_tokens``, ``model.norm``, ``visual.*``, ``lm_head``, ``rm_head.{0,3,5}``),
with embeddings resized to the tokenizer's length (151658). Current transformers nests the text model:
``^visual`` -> ``model.visual``, ``^model.`` (not already nested) -> ``model.language_model.``. The config and
the processor come from the base model (``--base``, default ``Qwen/Qwen2-VL-7B-Instruct``); the vocabulary
is pinned to the tokenizer's length after adding ``<|Reward|>``.

Rotary positions: HPSv3's forward (``hpsv3/model/qwen2vl_trainer.py`` of the ``hpsv3==1.0.0`` wheel, lines
148-190) builds ``inputs_embeds`` itself and calls the language model with ``input_ids=None,
position_ids=None`` and no ``image_grid_thw``, so under its pinned transformers 4.45.2 every token gets the
plain 1-D position ``arange(T)`` on all three rope sections (``modeling_qwen2_vl.py:1204-1205``), not Qwen2-VL's
3-D multimodal positions. The converted directory records ``"positions": "sequential"`` (in
``preference_config.json`` and ``rewardkit.json``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .._imports import require
from ._io import check_dst, read_checkpoint, resolve_source, state_dict_from, write_converted
from .hpsv2 import check_against_class

__all__ = ["convert_hpsv3", "remap_legacy_qwen2_vl", "hpsv3_template", "official_positions", "REWARD_TOKEN",
           "PIXELS", "INSTRUCTION", "SUFFIX", "DEFAULT_BASE"]

DEFAULT_BASE = "Qwen/Qwen2-VL-7B-Instruct"
REWARD_TOKEN = "<|Reward|>"
PIXELS = 256 * 28 * 28  # HPSv3: min_pixels = max_pixels (256 merged image tokens)

# HPSv3's user text (hpsv3/dataset/data_collator_qwen.py): INSTRUCTION.format(text_prompt=p) + SUFFIX.
# Whitespace matters (trailing spaces, blank lines): the model was trained on these exact bytes.
INSTRUCTION = (
    "\nYou are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give a "
    "overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being the worst "
    "and 10 being the best. \n\n"
    "**Visual Quality:**  \n"
    "Evaluate the overall visual quality of the image. The following sub-dimensions should be considered:\n"
    "- **Reasonableness:** The image should not contain any significant biological or logical errors, such as "
    "abnormal body structures or nonsensical environmental setups.\n"
    "- **Clarity:** Evaluate the sharpness and visibility of the image. The image should be clear and easy to "
    "interpret, with no blurring or indistinct areas.\n"
    "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual "
    "elements (e.g., hair, clothing, shadows).\n"
    "- **Aesthetic and Creativity:** Assess the artistic aspects of the image, including the color scheme, "
    "composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense "
    "of harmony and balance.\n"
    "- **Safety:** The image should not contain harmful or inappropriate content, such as political, violent, "
    "or adult material. If such content is present, the image quality and satisfaction score should be the "
    "lowest possible. \n\n"
    "**Text Alignment:**  \n"
    "Assess how well the image matches the textual prompt across the following sub-dimensions:\n"
    "- **Subject Relevance** Evaluate how accurately the subject(s) in the image (e.g., person, animal, object) "
    "align with the textual description. The subject should match the description in terms of number, "
    "appearance, and behavior.\n"
    "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well "
    "the image adheres to this style.\n"
    "- **Contextual Consistency**: Assess whether the background, setting, and surrounding elements in the "
    "image logically fit the scenario described in the prompt. The environment should support and enhance the "
    "subject without contradictions.\n"
    "- **Attribute Fidelity**: Check if specific attributes mentioned in the prompt (e.g., colors, clothing, "
    "accessories, expressions, actions) are faithfully represented in the image. Minor deviations may be "
    "acceptable, but critical attributes should be preserved.\n"
    "- **Semantic Coherence**: Evaluate whether the overall meaning and intent of the prompt are captured in "
    "the image. The generated content should not introduce elements that conflict with or distort the original "
    "description.\n"
    "Textual prompt - {text_prompt}\n\n\n"
)
SUFFIX = "\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"


def hpsv3_template() -> dict[str, Any]:
    """HPSv3's input as a :class:`~rewardkit.models.preference.PreferenceTemplate` dict: [image, text] in one
    user turn, the reward token inside the text; no explicit system turn (Qwen2-VL's chat template adds its
    default "You are a helpful assistant.")."""
    text = INSTRUCTION.replace("{text_prompt}", "{prompt}") + SUFFIX
    return {"version": "hpsv3-1.0", "system": None, "t2i": text, "edit": text, "multi_ref": text,
            "reward_token": REWARD_TOKEN, "reward_token_in_text": True}


def official_positions(model_type: str | None) -> str:
    """The rotary positions the official HPSv3 / EditReward forward gives a backbone of ``model_type``.

    Qwen2-VL (HPSv3) and Qwen2.5-VL (EditReward, MiMo-VL): ``"sequential"``, the language model is called
    with ``inputs_embeds`` and ``position_ids=None`` (HPSv3 ``qwen2vl_trainer.py:179-190``, EditReward
    ``model/qwen2_5_vl_trainer.py:257-268``). Qwen3-VL (EditReward's ``qwen3_vl_trainer.py:171-180``) passes
    ``input_ids`` and ``image_grid_thw`` to the model, which then computes its own 3-D positions: ``"mrope"``.
    """
    return "mrope" if model_type == "qwen3_vl" else "sequential"


def remap_legacy_qwen2_vl(sd: dict[str, Any], head_prefix: str = "rm_head.", *,
                          require_head: bool = True) -> tuple[dict, dict]:
    """Split a legacy (transformers 4.45) Qwen2-VL reward-model state dict into (backbone in current names,
    head without its prefix). Already-current names pass through unchanged."""
    backbone, head = {}, {}
    for k, v in sd.items():
        if k.startswith(head_prefix):
            head[k[len(head_prefix):]] = v.float()
        elif k.startswith("visual."):
            backbone["model." + k] = v
        elif re.match(r"^model\.(?!(language_model|visual)\.)", k):
            backbone["model.language_model." + k[len("model."):]] = v
        else:
            backbone[k] = v
    if require_head and not head:
        raise ValueError(f"no {head_prefix}* tensors: not an HPSv3 checkpoint")
    return backbone, head


def _image_processor(transformers: Any, base: str, pixels: int) -> Any:
    ip = transformers.AutoImageProcessor.from_pretrained(base)
    if type(ip).__name__ != "Qwen2VLImageProcessorPil":  # the torchvision backend: use the PIL one
        ip = transformers.Qwen2VLImageProcessorPil(**{k: v for k, v in ip.to_dict().items()
                                                     if k not in ("image_processor_type", "processor_class")})
    from ..models.preference import set_pixel_budget

    class _P:  # set_pixel_budget takes a processor
        image_processor = ip

    set_pixel_budget(_P, pixels, pixels)
    return ip


_CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
            "qwen3_vl": "Qwen3VLForConditionalGeneration"}


def convert_qwen_reward(src: str | Path, dst: str | Path, *, reward: str, base: str, heads: dict[str, str],
                        templates: dict[str, dict[str, Any]], model_types: tuple[str, ...], pixels: int,
                        overwrite: bool = False, hub_files: tuple[str, ...] = (), **manifest: Any) -> Path:
    """Shared by ``hpsv3`` and ``editreward``: a Qwen-VL reward checkpoint (legacy or current key names) with
    ranknet head(s) -> a preference-model directory (backbone + ``head.safetensors`` for the first head and
    template) plus ``head_<name>.safetensors`` for further heads, their templates in ``rewardkit.json``.

    ``heads``: name -> key prefix in the checkpoint (first = the preference model's own head).
    """
    transformers = require("transformers", "hf", purpose=f"rewardkit convert {reward}")
    st = require("safetensors.torch", "hf")
    hub = require("huggingface_hub", "hf")
    from .._version import __version__
    from ..models.preference import CONFIG_NAME, FORMAT, FORMAT_VERSION, HEAD_NAME, RankNetHead

    check_dst(dst, overwrite)
    src = resolve_source(src, hub_files)
    sd = state_dict_from(read_checkpoint(src))
    head_states: dict[str, dict] = {}
    for name, prefix in heads.items():
        head_states[name] = {k[len(prefix):]: v.float() for k, v in sd.items() if k.startswith(prefix)}
        if not head_states[name]:
            raise ValueError(f"no {prefix}* tensors: not a {reward} checkpoint")
    rest = {k: v for k, v in sd.items() if not any(k.startswith(p) for p in heads.values())}
    backbone, _ = remap_legacy_qwen2_vl(rest, require_head=False)
    config = transformers.AutoConfig.from_pretrained(base)
    if config.model_type not in model_types:
        raise ValueError(f"--base {base!r} is a {config.model_type!r} model; {reward} is built on {model_types}")
    tok = transformers.AutoTokenizer.from_pretrained(base)
    if REWARD_TOKEN not in tok.get_vocab():
        tok.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]}, replace_extra_special_tokens=False)
    rid = int(tok.convert_tokens_to_ids(REWARD_TOKEN))
    rows = backbone["model.language_model.embed_tokens.weight"].shape[0]
    if rows != len(tok):
        raise ValueError(f"the checkpoint's embedding has {rows} rows but the tokenizer (+{REWARD_TOKEN}) has "
                         f"{len(tok)} tokens: wrong --base tokenizer")
    config.text_config.vocab_size = len(tok)  # pinned: the embeddings were resized to len(tokenizer)
    if hasattr(config, "vocab_size"):
        config.vocab_size = len(tok)
    check_against_class(getattr(transformers, _CLASSES[config.model_type]), config, backbone)
    hidden = int(config.text_config.hidden_size)
    hw = None
    for name, hs in head_states.items():
        hw = int(hs["0.weight"].shape[0]) if "0.weight" in hs else 1024
        want = {k: tuple(v.shape) for k, v in RankNetHead(hidden, hidden=hw).state_dict().items()}
        if {k: tuple(v.shape) for k, v in hs.items()} != want:
            raise ValueError(f"{heads[name]}* does not match the ranknet head: {sorted(hs)} vs {sorted(want)}")
    ip = _image_processor(transformers, base, pixels)
    first = next(iter(heads))
    pref_cfg = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "rewardkit_version": __version__,
        "head": {"type": "ranknet", "hidden": hw, "in_features": hidden},
        "reward_token": REWARD_TOKEN, "reward_token_id": rid, "template": templates[first], "weights": "full",
        "base_model": base, "backbone_class": _CLASSES[config.model_type], "model_type": config.model_type,
        "positions": official_positions(config.model_type),
    }

    def write(tmp: Path) -> dict[str, Any]:
        (tmp / "backbone").mkdir()
        config.save_pretrained(tmp / "backbone")
        hub.save_torch_state_dict({k: v.contiguous() for k, v in backbone.items()}, tmp / "backbone",
                                  max_shard_size="5GB")
        extra = {}
        for name, hs in head_states.items():
            fname = HEAD_NAME if name == first else f"head_{name}.safetensors"
            st.save_file({k: v.contiguous() for k, v in hs.items()}, str(tmp / fname), metadata={"format": FORMAT})
            extra[name] = {"file": fname, "template": templates[name]}
        (tmp / "processor").mkdir()
        tok.save_pretrained(tmp / "processor")
        ip.save_pretrained(tmp / "processor")
        (tmp / CONFIG_NAME).write_text(json.dumps(pref_cfg, indent=2), encoding="utf-8")
        return {"pixels": pixels, "reward_token": REWARD_TOKEN, "heads": extra, "positions": pref_cfg["positions"]}

    return write_converted(dst, reward, write, source=src, overwrite=overwrite, base=base, **manifest)


def convert_hpsv3(src: str | Path, dst: str | Path, *, base: str = DEFAULT_BASE, overwrite: bool = False,
                  pixels: int = PIXELS) -> Path:
    """Convert an HPSv3 checkpoint (a local file, or the hub id ``MizzenAI/HPSv3``, whose ``HPSv3.safetensors``
    is downloaded) to a preference-model directory loadable by ``load_reward("hpsv3", ...)``."""
    return convert_qwen_reward(src, dst, reward="hpsv3", base=base, heads={"mu": "rm_head."},
                               templates={"mu": hpsv3_template()}, model_types=("qwen2_vl",), pixels=pixels,
                               overwrite=overwrite, variant="HPSv3", hub_files=("HPSv3.safetensors",))
