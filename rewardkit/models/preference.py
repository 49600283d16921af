"""Bradley–Terry preference models on the hidden state of a reward token of a vision-language backbone.

A :class:`PreferenceModel` is any Hugging Face image-text-to-text backbone (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
Qwen3.5, ...) plus a new special token, ``<|reward|>``, appended after the assistant prompt, and a head on that
token's final hidden state, computed in fp32. The head is ``linear`` (default), ``mlp``,
``uncertainty`` (mean and log-sigma) or ``ranknet`` (HPSv3's two-hidden-layer head, mean and log-sigma). The
language-model output layer is never computed: the backbone's inner model (``vlm.model``) gives the hidden
states.

Rotary positions (``positions``, saved in the config): ``"mrope"`` (default) gives the backbone its own
3-D multimodal positions (image tokens indexed by time / row / column), as in Qwen-VL pre-training; for
Qwen2-VL / Qwen2.5-VL / Qwen3-VL they are computed for the whole batch at once (:mod:`.rope`, equal to the
model's ``get_rope_index``), and the vision tower's layout tensors come from a cache per image grid;
``"sequential"`` gives every token, image tokens included, the plain 1-D index of its place among the sample's
non-padding tokens, the same on all three rope sections. That is what HPSv3 and EditReward (Qwen2-/2.5-VL)
were trained with: their forward builds ``inputs_embeds`` itself and calls the language model with
``position_ids=None`` and no ``image_grid_thw``. A config without the key means ``"mrope"`` (what every
rewardkit model saved before the option existed used).

Input template (versioned, saved with the model): one user turn holding the source image(s) first (edits),
then the candidate image, then the prompt text; then the assistant prefix and the reward token.

Saved layout (``save_pretrained`` / ``from_pretrained``, local directory or hub id)::

    preference_config.json   format version, head, reward token, template, weights kind, base model
    head.safetensors         the head (fp32)
    backbone/                full weights (config.json + *.safetensors)          -- weights == "full"
    adapter/                 LoRA adapter (adapter_config.json + safetensors)     -- weights == "lora"
    processor/               tokenizer (with the reward token) + image processor + chat template
    calibration.json         optional: mean / std / quantiles of raw scores on a calibration set

Everything is safetensors or JSON; nothing is unpickled. ``trust_remote_code`` is off unless asked for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from .._imports import require
from .preference_heads import HEADS, LinearHead, MLPHead, RankNetHead, UncertaintyHead, build_head  # noqa: F401
from .preference_inputs import REWARD_TOKEN, InputEncoder, PreferenceTemplate  # noqa: F401  (re-exported)
from ..calibration import apply_calibration, calibration_stats  # noqa: F401  (re-exported)
from .._version import __version__

__all__ = [
    "PreferenceModel", "PreferenceTemplate", "InputEncoder", "LinearHead", "MLPHead", "UncertaintyHead", "RankNetHead",
    "build_head",
    "calibration_stats", "apply_calibration", "REWARD_TOKEN", "FORMAT", "FORMAT_VERSION", "LM_LORA_TARGET",
    "POSITIONS", "sequential_position_ids",
]

FORMAT = "rewardkit-preference"
FORMAT_VERSION = 1
CONFIG_NAME = "preference_config.json"
HEAD_NAME = "head.safetensors"
CALIBRATION_NAME = "calibration.json"
#: rotary-position schemes of the backbone (see the module docstring)
POSITIONS = ("mrope", "sequential")

# LoRA targets: language-model projections only. A bare name list would also hit Qwen2.5-VL's vision MLP
# (it reuses gate/up/down_proj), so names are always turned into a regex scoped to the language model.
LM_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LM_LORA_TARGET = r".*language_model.*\.(" + "|".join(LM_PROJ) + r")"
VISION_PROJ = ("qkv", "proj", "fc1", "fc2", "gate_proj", "up_proj", "down_proj", "linear_fc1", "linear_fc2")


# ---------------------------------------------------------------------------------------------- helpers
def _build_tiny(spec: str):
    """``tiny:qwen2_5_vl`` / ``tiny:qwen3_vl`` -> (model, processor) from :mod:`rewardkit.testing`."""
    from .. import testing

    kind = spec.split(":", 1)[1]
    if kind not in ("qwen2_5_vl", "qwen3_vl"):
        raise ValueError(f"unknown tiny backbone {spec!r}; use tiny:qwen2_5_vl or tiny:qwen3_vl")
    return testing.TINY_KINDS[kind]()


def _load_backbone(spec: str, *, dtype: Any, trust_remote_code: bool, processor_dir: str | None = None):
    from .vlm import from_pretrained_safetensors, load_processor, resolve_dtype

    if spec.startswith("tiny:"):
        vlm, proc = _build_tiny(spec)
        vlm.to(resolve_dtype(dtype))
    else:
        transformers = require("transformers", "hf")
        vlm = from_pretrained_safetensors(transformers.AutoModelForImageTextToText, spec,
                                          dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code)
        proc = None
    if processor_dir is not None:
        proc = load_processor_from(processor_dir, vlm.config, trust_remote_code=trust_remote_code)
    elif proc is None:
        proc = load_processor(spec, trust_remote_code=trust_remote_code)
    return vlm, proc


def load_processor_from(path: str, model_config: Any, *, trust_remote_code: bool = False):
    """Processor from a saved ``processor/`` folder (which carries no model config.json)."""
    transformers = require("transformers", "hf")
    from .vlm import _processor_class_for, image_only_processor, refuse_pickled_side_files

    refuse_pickled_side_files(path)
    first_error: Exception | None = None
    try:
        proc = transformers.AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        if hasattr(proc, "image_processor") and hasattr(proc, "tokenizer"):
            return proc
    except (ImportError, AttributeError, OSError, ValueError, TypeError) as exc:
        first_error = exc
    try:
        proc_cls = _processor_class_for(model_config)
    except ValueError:
        if first_error is not None:
            raise first_error from None
        raise
    tok = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    ip = transformers.AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    if type(ip).__name__ == "Qwen2VLImageProcessor":  # torchvision backend: use the PIL one
        ip = transformers.Qwen2VLImageProcessorPil(**ip.to_dict())
    return image_only_processor(proc_cls)(image_processor=ip, tokenizer=tok,
                                          chat_template=getattr(tok, "chat_template", None))


def _embedding(vlm: nn.Module) -> nn.Embedding:
    return vlm.get_input_embeddings()


def add_reward_token(vlm: nn.Module, tokenizer: Any, token: str = REWARD_TOKEN) -> int:
    """Add ``token`` as a special token; grow the embeddings if needed; return its id.

    A newly added row is set to the mean of the rows before it (deterministic, so a LoRA model that stores
    only the row's trained delta reloads exactly).
    """
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == getattr(tokenizer, "unk_token_id", -1) or token not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [token]}, replace_extra_special_tokens=False)
        tid = tokenizer.convert_tokens_to_ids(token)
    emb = _embedding(vlm)
    if tid >= emb.num_embeddings:
        vlm.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        emb = _embedding(vlm)
    init_reward_row(vlm, tid)
    return int(tid)


@torch.no_grad()
def init_reward_row(vlm: nn.Module, tid: int) -> None:
    w = _embedding(vlm).weight
    w[tid] = w[:tid].float().mean(0).to(w.dtype)


def sequential_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[3, B, T]`` 1-D rotary positions: each token's index among its sample's non-padding tokens, the same
    on the three (temporal, height, width) sections; padding gets 1. Left and right padding give every sample
    the positions it has alone (``0 .. n-1``), which is what HPSv3's right-padded batches get from
    transformers 4.45's ``arange`` and EditReward's from 4.57's ``get_rope_index`` without image grids."""
    mask = attention_mask.long()
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return pos.unsqueeze(0).expand(3, -1, -1)


def check_positions(positions: str) -> str:
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
    return positions


def _inner_model(vlm: nn.Module) -> nn.Module:
    """The module that returns hidden states (``vlm.model``), through a peft wrapper if there is one."""
    base = vlm.get_base_model() if hasattr(vlm, "get_base_model") else vlm
    inner = getattr(base, "model", None)
    if inner is None:
        raise TypeError(f"{type(base).__name__} has no inner `.model`; expected an *ForConditionalGeneration class")
    return inner


def _is_peft(vlm: nn.Module) -> bool:
    return hasattr(vlm, "peft_config") and hasattr(vlm, "get_base_model")


def _atomic_dir_write(final: Path, writer) -> None:
    """Write a directory via ``writer(tmp_dir)`` then rename it into place (readers never see half a model)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        writer(tmp)
        if final.exists():
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False), encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- the model
class PreferenceModel(nn.Module):
    """Backbone + reward token + fp32 head. ``forward(**encoded) -> (rewards [B], log_sigma [B] | None)``.

    Build a new one with :meth:`from_backbone`, load a trained one with :meth:`from_pretrained`.
    """

    def __init__(self, vlm: nn.Module, processor: Any, *, head: str = "linear", head_hidden: int = 1024,
                 template: PreferenceTemplate | None = None, base_model: str = "", reward_token_id: int | None = None,
                 head_module: nn.Module | None = None, positions: str = "mrope",
                 patch_embed: str = "linear") -> None:
        super().__init__()
        #: rotary positions: "mrope" (the backbone's own 3-D positions) or "sequential" (HPSv3 / EditReward)
        self.positions = check_positions(positions)
        self.vlm = vlm
        self.processor = processor
        self.template = template or PreferenceTemplate()
        self.base_model = base_model
        self.head_type = head
        self.head_hidden = head_hidden
        self.reward_token_id = reward_token_id if reward_token_id is not None else \
            add_reward_token(vlm, processor.tokenizer, self.template.reward_token)
        hidden = self.hidden_size
        self.head = head_module if head_module is not None else build_head(head, hidden, head_hidden)
        self.calibration: dict[str, Any] | None = None
        #: pass the vision tower its layout tensors, cached per image grid (rewardkit.models.rope)
        self.vision_layout = True
        self.patch_embed = patch_embed
        self.vision_attention = "grouped"

    @property
    def vision_attention(self) -> str:
        """``"grouped"``: the vision tower's per-image (per-window) SDPA calls run as one call per distinct
        length, bit for bit the same (:mod:`rewardkit.models.vision_attention`); ``"sdpa"``: transformers' loop.
        A backbone loaded with another attention implementation keeps it (and reads ``"sdpa"`` here)."""
        return self.__dict__["_vision_attention"]

    @vision_attention.setter
    def vision_attention(self, mode: str) -> None:
        from .vision_attention import set_vision_attention

        grouped = set_vision_attention(self.vlm, mode)
        self.__dict__["_vision_attention"] = "grouped" if grouped else "sdpa"

    @property
    def patch_embed(self) -> str:
        """How the vision patch embedding runs: ``"linear"`` (one matrix product, transformers' own fused
        forward; within float rounding of the convolution) or ``"conv"`` (the stock Conv3d, bit for bit the
        original). See :mod:`rewardkit.models.patch_embed`. Settable; it switches the module in place."""
        return self.__dict__["_patch_embed"]

    @patch_embed.setter
    def patch_embed(self, mode: str) -> None:
        from .patch_embed import set_patch_embed

        set_patch_embed(self.vlm, mode)
        self.__dict__["_patch_embed"] = mode

    # ------------------------------------------------------------------ construction
    @property
    def hidden_size(self) -> int:
        cfg = self.vlm.config
        text = getattr(cfg, "text_config", None) or cfg
        return int(getattr(text, "hidden_size"))

    @classmethod
    def from_backbone(cls, backbone: str, *, head: str = "linear", head_hidden: int = 1024, dtype: Any = None,
                      trust_remote_code: bool = False, template: PreferenceTemplate | None = None,
                      min_pixels: int | None = None, max_pixels: int | None = None,
                      positions: str = "mrope", patch_embed: str = "linear") -> "PreferenceModel":
        """A new (untrained head) model on ``backbone``: a hub id, a local directory, or ``tiny:qwen2_5_vl`` /
        ``tiny:qwen3_vl`` (random tiny models for tests)."""
        vlm, proc = _load_backbone(backbone, dtype=dtype, trust_remote_code=trust_remote_code)
        set_pixel_budget(proc, min_pixels, max_pixels)
        return cls(vlm, proc, head=head, head_hidden=head_hidden, template=template, base_model=backbone,
                   positions=positions, patch_embed=patch_embed)

    @property
    def weights_kind(self) -> str:
        return "lora" if _is_peft(self.vlm) else "full"

    # ------------------------------------------------------------------ inputs
    def encode(self, images: Sequence[Any], prompts: Sequence[str],
               sources: Sequence[Sequence[Any]] | None = None) -> dict[str, torch.Tensor]:
        """Processor inputs for B samples (canonical RGB PIL images; ``sources[i]`` is a list, maybe empty).

        Returns the processor's tensors (``input_ids`` ``[B, T]``, ``attention_mask``, ``pixel_values``,
        ``image_grid_thw``, ...) on CPU.
        """
        return self._input_encoder().encode(images, prompts, sources)

    def encode_by_length(self, images: Sequence[Any], prompts: Sequence[str],
                         sources: Sequence[Sequence[Any]] | None = None
                         ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """:meth:`encode` with the samples put in order of sequence length on CPU (a stable sort), and that order
        (``order[i]``: the sample in row ``i``; None: rows as given), for :meth:`forward_grouped` ``(order=...,
        **enc)``, which returns the results in the samples' order. Its length groups are then runs of rows,
        which it passes on as views instead of copying each group's pixels (issue 41): the same inputs, in the
        same order within each group, so the same scores."""
        order = None if self.device.type != "cpu" else self._input_encoder().length_order(images, prompts, sources)
        if order is None:
            return self.encode(images, prompts, sources), None
        enc = self.encode([images[i] for i in order], [prompts[i] for i in order],
                          None if sources is None else [sources[i] for i in order])
        return enc, torch.tensor(order)

    def encode_tensor(self, images: torch.Tensor, prompts: Sequence[str]) -> dict[str, torch.Tensor] | None:
        """Text-to-image inputs from a float tensor ``[B, 3, H, W]`` in [0, 1], pre-processed in torch on its
        device (see :meth:`InputEncoder.encode_tensor`); None when the torch path does not apply."""
        return self._input_encoder().encode_tensor(images, prompts)

    def tensor_params(self):
        """Torch pre-processing parameters of this model's image processor, or None (processor path only)."""
        return self._input_encoder().tensor_params()

    def _input_encoder(self) -> "InputEncoder":
        enc = self.__dict__.get("_encoder")
        if enc is None or enc.processor is not self.processor or enc.template is not self.template:
            enc = self.__dict__["_encoder"] = InputEncoder(self.processor, self.template)
        return enc

    def input_encoder(self, *, private: bool = False) -> "InputEncoder":
        """The template + processor as a standalone encoder; ``private=True`` gives it its own copy of the
        processor, for use from another thread (HF fast tokenizers must not be shared across threads)."""
        import copy

        return InputEncoder(copy.deepcopy(self.processor) if private else self.processor, self.template)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **inputs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rewards ``[B]`` (fp32) and, for the uncertainty head, log-sigma ``[B]`` (else None)."""
        if self.positions == "sequential" and inputs.get("position_ids") is None:
            mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
            inputs["position_ids"] = sequential_position_ids(mask)
        elif inputs.get("position_ids") is None:  # the backbone's own 3-D positions, for the batch at once
            from .rope import batch_position_ids

            pos = batch_position_ids(_base(self.vlm).config, input_ids, attention_mask, inputs)
            if pos is not None:
                inputs["position_ids"] = pos
        if self.vision_layout:
            from .rope import vision_layout_kwargs

            inputs.update(vision_layout_kwargs(_base(self.vlm), inputs))
        out = _inner_model(self.vlm)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **inputs)
        h = out.last_hidden_state  # [B, T, H]
        is_rt = input_ids == self.reward_token_id  # [B, T]
        counts = is_rt.sum(1)
        if bool((counts == 0).any()):
            raise ValueError("an input has no reward token (truncated, or not built with PreferenceModel.encode)")
        t = is_rt.shape[1]
        # last occurrence: works with left or right padding
        pos = (t - 1) - is_rt.flip(1).to(torch.int8).argmax(1)
        pooled = h[torch.arange(h.shape[0], device=h.device), pos]  # [B, H]
        with torch.autocast(device_type=pooled.device.type, enabled=False):
            y = self.head(pooled.float())  # [B, out_dim], fp32 whatever the backbone dtype
        if y.shape[-1] == 2:
            return y[:, 0], y[:, 1]
        return y[:, 0], None

    def forward_grouped(self, order: torch.Tensor | None = None,
                        **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward` on an encoded batch, run on CPU as one forward per distinct sequence length (no
        padding within a forward; :func:`~rewardkit.models.preference_inputs.split_by_length`), the results put
        back in order. A batch of one length, or on another device, is one forward as before. Each group's
        scores are the ones that group gets scored alone (equal to one by one within the batched bound).
        ``order`` (from :meth:`encode_by_length`): row ``i`` of the inputs is sample ``order[i]``; the results
        are then in the samples' order."""
        if order is not None:
            r, l = self.forward_grouped(**inputs)
            order = order.to(r.device)
            return (r.new_empty(r.shape).index_copy(0, order, r),
                    None if l is None else l.new_empty(l.shape).index_copy(0, order, l))
        cfg = _base(self.vlm).config
        merge = getattr(getattr(cfg, "vision_config", None), "spatial_merge_size", None)
        ids = inputs.get("input_ids")
        groups = None
        if ids is not None and ids.device.type == "cpu" and merge and getattr(cfg, "image_token_id", None) is not None:
            from .preference_inputs import split_by_length

            groups = split_by_length(inputs, int(cfg.image_token_id), int(merge))
        if groups is None:
            return self(**inputs)
        n = ids.shape[0]
        r_all = l_all = None
        for idx, sub in groups:
            r, l = self(**sub)
            if r_all is None:
                r_all = r.new_empty(n)
                l_all = None if l is None else l.new_empty(n)
            r_all = r_all.index_copy(0, idx, r)  # out of place: keeps autograd through every group
            if l is not None:
                l_all = l_all.index_copy(0, idx, l)
        return r_all, l_all

    @torch.inference_mode()
    def score(self, images: Sequence[Any], prompts: Sequence[str], sources: Sequence[Sequence[Any]] | None = None,
              *, batch_size: int = 16) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Raw rewards ``[B]`` (and log-sigma ``[B]`` or None) for PIL images, in chunks of ``batch_size``."""
        dev = self.device
        rs, ls = [], []
        for s in range(0, len(images), batch_size):
            enc, order = self.encode_by_length(images[s:s + batch_size], prompts[s:s + batch_size],
                                               None if sources is None else sources[s:s + batch_size])
            r, l = self.forward_grouped(order, **{k: v.to(dev) for k, v in enc.items()})
            rs.append(r.float().cpu())
            if l is not None:
                ls.append(l.float().cpu())
        if not rs:
            return torch.zeros(0), None
        return torch.cat(rs), (torch.cat(ls) if ls else None)

    @property
    def device(self) -> torch.device:
        return next(self.head.parameters()).device

    # ------------------------------------------------------------------ trainable parameters
    def configure_trainable(self, *, lora: dict[str, Any] | None, train_vision: bool = False) -> None:
        """Full fine-tune (``lora=None``) or LoRA via peft; the head is always trainable.

        Full: the language model and the reward token train, the vision tower only if ``train_vision``; the
        unused LM output layer is frozen (unless tied to the embeddings). LoRA: ``lora`` holds ``r``, ``alpha``,
        ``dropout`` and ``target_modules`` (a regex string used as is, or a list of projection names scoped to
        the language model, plus the vision tower if ``train_vision``); the reward token's embedding row
        trains through peft's trainable tokens.
        """
        if lora is None:
            emb_w = _embedding(self.vlm).weight
            for name, p in self.vlm.named_parameters():
                is_vision = ".visual." in f".{name}" or name.startswith("visual.")
                p.requires_grad_(train_vision or not is_vision)
            out = self.vlm.get_output_embeddings()
            if out is not None and out.weight is not emb_w:
                out.weight.requires_grad_(False)
        else:
            peft = require("peft", "train")
            targets = lora.get("target_modules") or list(LM_PROJ)
            if not isinstance(targets, str):
                names = "|".join(targets)
                regex = r".*language_model.*\.(" + names + r")"
                if train_vision:
                    vnames = "|".join(sorted(set(targets) | set(VISION_PROJ)))
                    regex = r"(" + regex + r"|.*visual.*\.(" + vnames + r"))"
                targets = regex
            cfg = peft.LoraConfig(r=int(lora.get("r", 16)), lora_alpha=float(lora.get("alpha", 32)),
                                  lora_dropout=float(lora.get("dropout", 0.0)), target_modules=targets,
                                  trainable_token_indices={"embed_tokens": [self.reward_token_id]})
            self.vlm = peft.get_peft_model(self.vlm, cfg)
        for p in self.head.parameters():
            p.requires_grad_(True)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Name -> tensor of every trainable parameter (what a training checkpoint stores)."""
        return {n: p.detach() for n, p in self.named_parameters() if p.requires_grad}

    # ------------------------------------------------------------------ save / load
    def config_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "rewardkit_version": __version__,
            "head": {"type": self.head_type, "hidden": self.head_hidden, "in_features": self.hidden_size},
            "reward_token": self.template.reward_token, "reward_token_id": self.reward_token_id,
            "template": dataclasses.asdict(self.template), "weights": self.weights_kind,
            "positions": self.positions,
            "base_model": self.base_model, "backbone_class": type(_base(self.vlm)).__name__,
            "model_type": getattr(self.vlm.config, "model_type", None),
        }

    def save_pretrained(self, path: str | Path, *, merge_lora: bool = False) -> Path:
        """Write the model directory atomically (see the module docstring). ``merge_lora`` saves full weights."""
        safetensors_torch = require("safetensors.torch", "hf")

        def write(tmp: Path) -> None:
            cfg = self.config_dict()
            vlm = self.vlm
            if _is_peft(vlm) and merge_lora:
                import copy

                vlm = copy.deepcopy(vlm).merge_and_unload()
                cfg["weights"] = "full"
            if cfg["weights"] == "lora":
                vlm.save_pretrained(tmp / "adapter", safe_serialization=True, save_embedding_layers=False)
            else:
                vlm.save_pretrained(tmp / "backbone", safe_serialization=True)
            safetensors_torch.save_file({k: v.detach().float().contiguous().cpu() for k, v in self.head.state_dict().items()},
                                        str(tmp / HEAD_NAME), metadata={"format": FORMAT})
            save_processor(self.processor, tmp / "processor")
            if self.calibration is not None:
                _write_json(tmp / CALIBRATION_NAME, self.calibration)
            _write_json(tmp / CONFIG_NAME, cfg)

        _atomic_dir_write(Path(path), write)
        return Path(path)

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path, *, device: Any = None, dtype: Any = None,
                        trust_remote_code: bool = False, revision: str | None = None,
                        base_model: str | None = None, merge_lora: bool = True,
                        positions: str | None = None, patch_embed: str = "linear") -> "PreferenceModel":
        """Load a saved model directory or hub repository (``revision`` for the hub).

        ``base_model`` overrides where a LoRA model's base weights come from (e.g. a local copy). ``positions``
        overrides the saved rotary-position scheme (None: as saved; a config without the key: ``"mrope"``).
        ``patch_embed``: see :attr:`patch_embed` (not saved: how to compute, not what).
        """
        from .patch_embed import check_patch_embed
        from .vlm import require_safetensors, resolve_device

        root = resolve_model_dir(path_or_id, revision=revision)
        cfg_path = root / CONFIG_NAME
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{path_or_id}: not a rewardkit preference model (no {CONFIG_NAME})")
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        if cfg.get("format") != FORMAT or int(cfg.get("format_version", 0)) > FORMAT_VERSION:
            raise ValueError(f"{path_or_id}: unsupported format {cfg.get('format')!r} v{cfg.get('format_version')}")
        template = PreferenceTemplate.from_dict(cfg["template"])
        positions = check_positions(positions if positions is not None else cfg.get("positions", "mrope"))
        check_patch_embed(patch_embed)  # before any weights load
        rid = int(cfg["reward_token_id"])
        # safetensors only: check the head and the adapter before loading anything heavy
        head_file = require_safetensors(root, HEAD_NAME, "reward head")
        if cfg["weights"] != "full":
            # peft itself would fall back to torch.load(adapter_model.bin) when the safetensors file is missing
            require_safetensors(root / "adapter", "adapter_model.safetensors", "LoRA adapter")
        if cfg["weights"] == "full":
            vlm, proc = _load_backbone(str(root / "backbone"), dtype=dtype, trust_remote_code=trust_remote_code,
                                       processor_dir=str(root / "processor"))
        else:
            peft = require("peft", "train")
            base = base_model or cfg["base_model"]
            vlm, proc = _load_backbone(base, dtype=dtype, trust_remote_code=trust_remote_code,
                                       processor_dir=str(root / "processor"))
            if rid >= _embedding(vlm).num_embeddings:
                vlm.resize_token_embeddings(len(proc.tokenizer), mean_resizing=False)
            init_reward_row(vlm, rid)
            vlm = peft.PeftModel.from_pretrained(vlm, str(root / "adapter"), is_trainable=False)
            if merge_lora:
                vlm = vlm.merge_and_unload()
        if proc.tokenizer.convert_tokens_to_ids(template.reward_token) != rid:
            raise ValueError(f"{path_or_id}: tokenizer's id for {template.reward_token!r} does not match the config")
        hc = cfg["head"]
        head = build_head(hc["type"], int(hc["in_features"]), int(hc.get("hidden", 1024)))
        state = require("safetensors.torch", "hf").load_file(str(head_file))
        head.load_state_dict(state)
        model = cls(vlm, proc, head=hc["type"], head_hidden=int(hc.get("hidden", 1024)), template=template,
                    base_model=cfg.get("base_model", ""), reward_token_id=rid, head_module=head, positions=positions,
                    patch_embed=patch_embed)
        cal = root / CALIBRATION_NAME
        if cal.is_file():
            model.calibration = json.loads(cal.read_text(encoding="utf-8"))
        model.to(resolve_device(device))
        model.eval()
        return model

    def save_calibration(self, path: str | Path, stats: dict[str, Any]) -> None:
        """Write ``calibration.json`` into a saved model directory and keep it on this instance."""
        self.calibration = dict(stats)
        _write_json(Path(path) / CALIBRATION_NAME, self.calibration)


def _base(vlm: nn.Module) -> nn.Module:
    return vlm.get_base_model() if hasattr(vlm, "get_base_model") else vlm


def save_processor(processor: Any, path: Path) -> None:
    """Tokenizer (with chat template) + image processor; works for image-only processors too."""
    path.mkdir(parents=True, exist_ok=True)
    processor.tokenizer.save_pretrained(path)
    processor.image_processor.save_pretrained(path)


def set_pixel_budget(processor: Any, min_pixels: int | None, max_pixels: int | None) -> None:
    """Bound the image resolution of a Qwen-style image processor (``size`` shortest/longest edge in pixels)."""
    if min_pixels is None and max_pixels is None:
        return
    ip = processor.image_processor
    size = dict(getattr(ip, "size", None) or {})
    if min_pixels is not None:
        size["shortest_edge"] = int(min_pixels)
        if hasattr(ip, "min_pixels"):
            ip.min_pixels = int(min_pixels)
    if max_pixels is not None:
        size["longest_edge"] = int(max_pixels)
        if hasattr(ip, "max_pixels"):
            ip.max_pixels = int(max_pixels)
    ip.size = size


def resolve_model_dir(path_or_id: str | Path, *, revision: str | None = None) -> Path:
    """A local directory as is; otherwise download the hub repository (safetensors / json files only)."""
    p = Path(path_or_id)
    if p.is_dir():
        return p
    if p.exists() or str(path_or_id).startswith((".", "/", "~")):
        raise FileNotFoundError(f"model directory not found: {path_or_id}")
    hub = require("huggingface_hub", "hf")
    try:
        local = hub.snapshot_download(str(path_or_id), revision=revision,
                                      allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model",
                                                      "*.tiktoken"])
    except Exception as exc:  # offline, missing repo, bad revision: say both things we tried
        raise FileNotFoundError(f"{path_or_id!r} is not a local directory and could not be downloaded from the "
                                f"hub: {type(exc).__name__}: {exc}") from exc
    return Path(local)
