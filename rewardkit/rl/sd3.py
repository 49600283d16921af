"""The model side on diffusers: SD3 / SD3.5 transformer + VAE + text encoders, LoRA adapters via peft.

Our sampler calls the transformer directly (the pipeline's own loop cannot run DPM-Solver-2 or E²PO's
time-dependent condition). Two LoRA adapters live on the same transformer: ``"default"`` (trained) and
``"old"`` (the rollout policy, updated by soft copies); the reference policy is the base model
(adapters disabled). Switching adapters flips ``requires_grad`` inside peft, so every switch goes through a
context manager that restores the trained adapter and its ``requires_grad`` on exit.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Iterator

import torch

from .._imports import require
from .exploration import embedding_offset

__all__ = ["SD3Policy", "Cond"]

ENCODER_ATTR = {"clip_l": "text_encoder", "clip_g": "text_encoder_2"}


@dataclass
class Cond:
    """Transformer conditioning. embeds: ``[B, S, D]`` (CLIP-L|CLIP-G features then T5 tokens); pooled: ``[B, P]``."""

    embeds: torch.Tensor
    pooled: torch.Tensor

    def __getitem__(self, idx) -> "Cond":
        return Cond(self.embeds[idx], self.pooled[idx])

    def to(self, *args, **kwargs) -> "Cond":
        return Cond(self.embeds.to(*args, **kwargs), self.pooled.to(*args, **kwargs))

    @staticmethod
    def cat(conds: list["Cond"]) -> "Cond":
        return Cond(torch.cat([c.embeds for c in conds]), torch.cat([c.pooled for c in conds]))


class SD3Policy:
    """Loads a ``StableDiffusion3Pipeline`` directory (or hub id) and exposes encode / velocity / decode."""

    def __init__(self, pretrained: str, *, device: torch.device, text_dtype: torch.dtype = torch.float32,
                 max_sequence_length: int = 128, revision: str | None = None, trust_remote_code: bool = False,
                 transformer: str | None = None):
        diffusers = require("diffusers", "rl", purpose="the DiffusionNFT trainer")
        require("peft", "rl", purpose="LoRA adapters of the DiffusionNFT trainer")
        extra = {}
        if transformer is not None:   # a full fine-tune: a diffusers transformer folder replaces the pipeline's
            from pathlib import Path

            sub = "transformer" if (Path(transformer) / "transformer" / "config.json").is_file() else None
            extra["transformer"] = diffusers.SD3Transformer2DModel.from_pretrained(transformer, subfolder=sub)
        pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(pretrained, revision=revision, **extra)
        pipe.set_progress_bar_config(disable=True)
        self.pipe = pipe
        self.device = device
        self.max_sequence_length = max_sequence_length
        self.transformer = pipe.transformer.to(device, torch.float32)  # fp32 master weights; autocast does the rest
        self.vae = pipe.vae.to(device, torch.float32)        # fp32 VAE
        for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
            enc = getattr(pipe, name, None)
            if enc is not None:
                enc.to(device, text_dtype).requires_grad_(False).eval()
        self.vae.requires_grad_(False).eval()
        self.transformer.requires_grad_(False)
        self._quiet_logger = diffusers.utils.logging.get_logger("diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3")
        self.latent_channels = self.transformer.config.in_channels
        self.vae_scale = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self._negative: dict[str, Cond] = {}

    # ------------------------------------------------------------------ text
    def tokenize_clip(self, prompts: list[str], which: str = "clip_l") -> torch.Tensor:
        tok = self.pipe.tokenizer if which == "clip_l" else self.pipe.tokenizer_2
        return tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True,
                   return_tensors="pt").input_ids

    def encoder(self, which: str) -> torch.nn.Module:
        return getattr(self.pipe, ENCODER_ATTR[which])

    def clip_ids(self, which: str) -> tuple[int, int | None]:
        """(eos, bos) token ids of the CLIP tokenizer feeding ``which``."""
        tok = self.pipe.tokenizer if which == "clip_l" else self.pipe.tokenizer_2
        return tok.eos_token_id, tok.bos_token_id

    @torch.no_grad()
    def encode(self, prompts: list[str], offsets: dict[str, torch.Tensor] | None = None) -> Cond:
        """SD3's prompt encoding (the pipeline's own ``encode_prompt``, CFG-free), with optional token-embedding
        ``offsets`` ``{"clip_l": [B, 77, d], ...}`` added inside the named CLIP encoders (E²PO)."""
        offsets = offsets or {}
        level = self._quiet_logger.level
        self._quiet_logger.setLevel(40)  # the pipeline warns per call about truncated prompts: see truncated()
        with contextlib.ExitStack() as stack:
            stack.callback(self._quiet_logger.setLevel, level)
            for which, off in offsets.items():
                stack.enter_context(embedding_offset(self.encoder(which), off.to(self.device)))
            embeds, _, pooled, _ = self.pipe.encode_prompt(
                prompt=list(prompts), prompt_2=None, prompt_3=None, device=self.device,
                do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length)
        return Cond(embeds.float(), pooled.float())

    def truncated(self, prompts: list[str]) -> list[str]:
        """The prompts longer than the CLIP tokenizer's window (their tail does not reach CLIP)."""
        tok = self.pipe.tokenizer
        return [p for p in prompts if len(tok(p, truncation=False, verbose=False).input_ids) > tok.model_max_length]

    # ------------------------------------------------------------------ transformer
    def velocity(self, module: torch.nn.Module, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        """v = eps - x0 predicted at ``sigma`` ``[B]`` (fed as ``timestep = 1000 sigma``, a float)."""
        return module(hidden_states=x, timestep=sigma * 1000.0, encoder_hidden_states=cond.embeds,
                      pooled_projections=cond.pooled, return_dict=False)[0]

    def negative(self, prompt: str, batch: int) -> Cond:
        """The CFG unconditional condition: ``prompt`` (the official code uses "") encoded once, repeated."""
        if prompt not in self._negative:
            self._negative[prompt] = self.encode([prompt])
        c = self._negative[prompt]
        return Cond(c.embeds.expand(batch, -1, -1), c.pooled.expand(batch, -1))

    def sample_velocity(self, module: torch.nn.Module, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, *,
                        guidance_scale: float = 1.0, negative_prompt: str = "",
                        integer_timestep: bool = False) -> torch.Tensor:
        """The rollout velocity, as DiffusionNFT's sampler computes it
        (``flow_grpo/diffusers_patch/pipeline_with_logprob.py:209-226``): with ``guidance_scale > 1`` one forward
        on ``[uncond, cond]`` and ``v_u + g (v_c - v_u)``; ``integer_timestep`` feeds ``long(1000 sigma)``
        (``sigma`` float32, truncated) instead of the float ``1000 sigma``."""
        ts = sigma.float() * 1000.0
        if integer_timestep:
            ts = ts.long()
        if guidance_scale <= 1.0:
            return module(hidden_states=x, timestep=ts, encoder_hidden_states=cond.embeds,
                          pooled_projections=cond.pooled, return_dict=False)[0]
        neg = self.negative(negative_prompt, x.shape[0])
        out = module(hidden_states=torch.cat([x, x]), timestep=torch.cat([ts, ts]),
                     encoder_hidden_states=torch.cat([neg.embeds.to(cond.embeds.dtype), cond.embeds]),
                     pooled_projections=torch.cat([neg.pooled.to(cond.pooled.dtype), cond.pooled]),
                     return_dict=False)[0]
        v_uncond, v_cond = out.chunk(2)
        return v_uncond + guidance_scale * (v_cond - v_uncond)

    def latent_shape(self, batch: int, resolution: int) -> tuple[int, int, int, int]:
        side = resolution // self.vae_scale
        return batch, self.latent_channels, side, side

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Transformer-space latents ``[B, C, h, w]`` -> float32 images ``[B, 3, H, W]`` in [0, 1] (fp32 VAE)."""
        cfg = self.vae.config
        z = latents.float() / cfg.scaling_factor + (cfg.shift_factor or 0.0)
        with torch.autocast(self.device.type, enabled=False):
            img = self.vae.decode(z, return_dict=False)[0]
        return (img.float() / 2 + 0.5).clamp(0, 1)

    # ------------------------------------------------------------------ adapters
    def add_lora(self, r: int, alpha: float, target_modules: list[str], init: str = "gaussian",
                 init_lora: str | None = None) -> None:
        """Adapters ``"default"`` (trained) and ``"old"`` (rollouts), equal at the start. ``init_lora``: start from
        a saved LoRA (see :meth:`load_lora`) instead of a zero delta; its own rank / alpha / targets then apply
        and ``r`` / ``alpha`` / ``target_modules`` are not used."""
        peft = require("peft", "rl")
        if init_lora is not None:
            cfg = self.load_lora(init_lora, "default")
        else:
            cfg = peft.LoraConfig(r=r, lora_alpha=alpha, init_lora_weights=init, target_modules=list(target_modules))
            self.transformer.add_adapter(cfg, adapter_name="default")
        with warnings.catch_warnings():  # peft warns that a second adapter is being added: it is meant
            warnings.simplefilter("ignore", UserWarning)
            self.transformer.add_adapter(cfg, adapter_name="old")
        self.transformer.set_adapter("default")
        with torch.no_grad():
            for o, d in zip(self.adapter_params("old"), self.adapter_params("default"), strict=True):
                o.copy_(d)  # old == default at the start (a zero delta unless init_lora: gaussian init zeroes B)
        if not self.adapter_params("default"):
            raise ValueError(f"lora.target_modules {target_modules} match no module of the transformer")

    def load_lora(self, directory, name: str = "default"):
        """Load a saved LoRA into the transformer as adapter ``name``; returns its ``LoraConfig``.

        ``directory`` holds ``pytorch_lora_weights.safetensors`` (diffusers: ``save_lora_weights``, what this trainer
        writes; loaded with ``SD3Transformer2DModel.load_lora_adapter``) or ``adapter_config.json`` +
        ``adapter_model.safetensors`` (peft: ``save_pretrained``; loaded with ``peft.set_peft_model_state_dict``).
        Every LoRA tensor of the file must land in the model (a mismatch raises)."""
        from pathlib import Path

        peft = require("peft", "rl")
        st = require("safetensors.torch", "rl")
        d = Path(directory)
        if (d / "adapter_config.json").is_file():
            cfg = peft.LoraConfig.from_pretrained(str(d))
            cfg.inference_mode = False
            self.transformer.add_adapter(cfg, adapter_name=name)
            sd = st.load_file(str(d / "adapter_model.safetensors"))
            sd = {k.removeprefix("base_model.model."): v for k, v in sd.items()}
            res = peft.set_peft_model_state_dict(self.transformer, sd, adapter_name=name)
            missing = [k for k in getattr(res, "missing_keys", []) if "lora_" in k and f".{name}." in k]
            unexpected = list(getattr(res, "unexpected_keys", []))
            if missing or unexpected:
                raise ValueError(f"LoRA {d} does not fit the transformer: {len(missing)} adapter tensors missing "
                                 f"(e.g. {missing[:2]}), {len(unexpected)} unexpected (e.g. {unexpected[:2]})")
        elif (d / "pytorch_lora_weights.safetensors").is_file():
            # the pipeline writer (save_lora_weights) prefixes the transformer's keys with "transformer.", the
            # model writer (save_lora_adapter) does not
            keys = [k for k in st.load_file(str(d / "pytorch_lora_weights.safetensors")) if "lora_" in k]
            prefix = "transformer" if any(k.startswith("transformer.") for k in keys) else None
            others = sorted({k.split(".")[0] for k in keys if prefix is not None and not k.startswith("transformer.")})
            if others:  # e.g. text_encoder / text_encoder_2: without them the start is not the LoRA's model
                raise ValueError(f"LoRA {d} also adapts {others}; the trainer adapts the transformer only, so it "
                                 "would start from another model than this LoRA's: save the transformer's LoRA alone "
                                 "(save_lora_weights(transformer_lora_layers=...))")
            n_file = sum(1 for k in keys if prefix is None or k.startswith("transformer."))
            before = {n for n, _ in self.transformer.named_parameters()}
            self.transformer.load_lora_adapter(str(d), prefix=prefix, adapter_name=name,
                                               weight_name="pytorch_lora_weights.safetensors", use_safetensors=True)
            loaded = self.adapter_named_params(name)
            if not n_file or len(loaded) != n_file or any(n in before for n, _ in loaded):
                raise ValueError(f"LoRA {d}: {n_file} transformer LoRA tensors in the file, {len(loaded)} loaded")
            cfg = self.transformer.peft_config[name]
        else:
            raise FileNotFoundError(f"{d} holds neither pytorch_lora_weights.safetensors (diffusers) nor "
                                    "adapter_config.json + adapter_model.safetensors (peft)")
        for p in self.adapter_params(name):
            p.requires_grad_(True)
        return cfg

    def adapter_named_params(self, name: str) -> list[tuple[str, torch.nn.Parameter]]:
        tag = f".{name}."
        return [(n, p) for n, p in self.transformer.named_parameters() if "lora_" in n and tag in n]

    def adapter_params(self, name: str) -> list[torch.nn.Parameter]:
        return [p for _, p in self.adapter_named_params(name)]

    def _restore_default(self) -> None:
        self.transformer.enable_adapters()
        self.transformer.set_adapter("default")
        for p in self.adapter_params("default"):
            p.requires_grad_(True)
        for p in self.adapter_params("old"):
            p.requires_grad_(False)

    @contextlib.contextmanager
    def use_old(self) -> Iterator[None]:
        """The rollout policy: the ``"old"`` adapter (use under ``no_grad``)."""
        self.transformer.set_adapter("old")
        try:
            yield
        finally:
            self._restore_default()

    @contextlib.contextmanager
    def use_reference(self) -> Iterator[None]:
        """The base model: adapters disabled (use under ``no_grad``)."""
        self.transformer.disable_adapters()
        try:
            yield
        finally:
            self._restore_default()

    def lora_state_dict(self, name: str = "default") -> dict[str, torch.Tensor]:
        """The adapter in diffusers' LoRA format (``transformer.``-prefixed keys, no adapter name)."""
        peft_utils = require("peft.utils", "rl")
        sd = peft_utils.get_peft_model_state_dict(self.transformer, adapter_name=name)
        return {f"transformer.{k}": v.detach().float().cpu().contiguous() for k, v in sd.items()}

    def save_lora(self, directory, name: str = "default") -> None:
        """Write ``pytorch_lora_weights.safetensors`` that ``StableDiffusion3Pipeline.load_lora_weights`` reads, with
        the adapter's ``LoraConfig`` as metadata (so ``lora_alpha`` survives the round trip)."""
        diffusers = require("diffusers", "rl")
        sd = self.lora_state_dict(name)
        meta = self.transformer.peft_config[name].to_dict()
        meta = {k: (sorted(v) if isinstance(v, set) else v) for k, v in meta.items()}
        diffusers.StableDiffusion3Pipeline.save_lora_weights(
            str(directory), transformer_lora_layers={k[len("transformer."):]: v for k, v in sd.items()},
            safe_serialization=True, transformer_lora_adapter_metadata=meta)
