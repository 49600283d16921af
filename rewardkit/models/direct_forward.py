"""The vision towers of the CLIP family (``aesthetic``, ``hpsv2``, ``geneval``'s CLIP) and ImageReward's BLIP
vision and text towers, run straight through their submodules' weights: the same operations, in the same order and
dtypes, as transformers' ``CLIPModel.get_image_features``, ``BlipVisionModel.forward`` and ``BlipTextModel.forward``
(bidirectional, cross-attending the image tokens), without the per-call wrappers around them (output-recording
decorators, keyword plumbing, mask building, one ``nn.Module.__call__`` per linear / norm / layer).

ImageReward's text tower (:func:`blip_text_states`) had the most of them: ~0.7 ms of wrappers per call on a
one-layer, 8-wide tower against ~0.33 ms direct; on the peers' tiny ImageReward (768 wide) the whole batch-1
call is ~3 % cheaper in CPU (A/B in one process, issue 41; ~0.5 % at batch 8, within the noise at batch 32).

On the tiny checkpoints those wrappers cost ~0.4-0.5 ms of a ~5 ms CLIP vision forward at batch 1 (issue 41); on
a real ViT-L they are noise. Every layer the path runs whole is ``torch.equal`` to the stock layer
(``tests/models/test_direct_forward.py`` compares them on several inputs and batch sizes, eager and SDPA).

**The last layer runs the one row that is read.** ``get_image_features`` pools the [CLS] row of the last layer,
and ImageReward reads the [CLS] row of its text tower: every other row of the last layer is computed and thrown
away by the stock call. Here the last layer takes its keys and values from every row (and, in the text tower,
the image tokens), and runs the query, attention, output projection and MLP for that row alone. The same maths;
the values differ from the stock call's by float rounding only (one row goes through other matmul / attention
kernel blockings than 257: measured <= 4e-7 of the largest feature; ``scripts/parity.sh`` max |diff| against the
official packages within its 1e-5 bound: aesthetic 6.56e-7 as before, imagereward 1.79e-7 (was 1.49e-7), hpsv2
1.2e-7 (was 8.2e-8)). What it saves is that layer's share less its keys and values: ~30 % of the peers' two-layer
tiny towers (issue 41); at batch 1, 2.9 % of ViT-L/14's vision forward (aesthetic; one layer of 24) and 1.8 % of
HPSv2's ViT-H/14 (one of 32), measured by ``benchmarks/direct_forward.py --depth``.
Without an autograd graph (inference mode, ``no_grad``, nothing requiring grad) the residual sums and QuickGELU
write into their own fresh temporaries instead of allocating new ones (``out.add_(h)`` for ``h + out``;
``sigmoid(1.702 t) * t`` in place): the same IEEE operations on the same operands, which commute, so the same
bits; one large temporary less per residual and two per QuickGELU (A/B in one process, tiny aesthetic tower:
1.5 % at batch 1, 0-27 % (noisy) at batch 8, 4-14 % at batch 32; ImageReward's BLIP 2 % at batch 1).

The stock call is used instead (same result, its own errors) whenever the direct path would not be the same
computation or would skip something a caller set up:

- a module of an unexpected class (a LoRA / PEFT-wrapped linear, a custom attention, another architecture; a
  BLIP text tower without cross-attention layers or with a chunked feed-forward);
- CLIP attention other than ``"eager"`` / ``"sdpa"`` (flash, flex, a registered kernel), BLIP text attention other
  than ``"eager"``; the model in training mode (dropout); pixels not of the model's ``image_size`` (the stock
  call's error or interpolation); token rows longer than the position table, masks of another shape;
- a forward hook or pre-hook on any module of the tower, or a global one (profilers, feature extractors), or a
  forward replaced on a module instance (accelerate's offloading hooks, a wrapper set by a tool);
- transformers' ``output_attentions`` / ``output_hidden_states`` set on the config.

The class checks run once per model (kept with it, without keeping it alive); the hook and mode checks run on
every call, in one walk over the tower's modules (:func:`_walk`, ~5 us on the tiny CLIP instead of ~20 us).

The q / k / v projections stay three linears, as transformers runs them. OpenAI CLIP's ``nn.MultiheadAttention``
(the official aesthetic / ImageReward code; OpenCLIP for HPSv2) runs one packed in-projection with a ``[3D, D]``
weight instead; measured in one process with the packed weight built once (issue 41, one torch thread, 2-core
host at load ~1.3): the same outputs bit for bit on this CPU, and no speed-up beyond the noise (forward time
separate / packed: 1.02 / 0.98 / 1.01 at batch 1 / 8 / 32 on the tiny aesthetic CLIP, 0.99 / 1.01 at batch 1 / 8
for a width-768 tower), while the packed copy would cost a second set of q / k / v weights (ViT-L/14's vision
tower: 24 x 3 x 1024 x 1024 fp32 = 302 MB; HPSv2's ViT-H/14: 629 MB) and a cache that no version counter can keep
correct (an edit through ``.data``, as PEFT's merge does, is invisible to ``_version``). The forward itself is
on par with the official one (torch profiler, 50 batch-1 calls of the tiny aesthetic tower: 226 ms here, 227 ms
for OpenAI CLIP's ``encode_image`` on the same weights; the same kernels, ``addmm`` / flash SDPA / conv).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as _nn_module

__all__ = ["clip_image_features", "blip_vision_states", "blip_text_states", "sequential_mlp"]

#: model -> (its modules when last checked, whether the direct path covers them)
_PLANS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _global_hooks() -> bool:
    return any(getattr(_nn_module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))


def _exact(obj: Any, cls: type) -> bool:
    return type(obj) is cls


def _walk(roots: tuple) -> list | None:
    """The modules under ``roots`` (each root and its descendants, depth first; a module reached twice is listed
    twice), or None as soon as one is in training mode, has a hook or an instance forward: ``nn.Module.modules()`` without its
    generator and name bookkeeping, and the per-call checks in the same pass (issue 41: ~20 us a call on the
    tiny CLIP, a third of it the generator)."""
    out: list = []
    stack = list(reversed(roots))
    pop, push, keep = stack.pop, stack.extend, out.append  # bound once; with no list per leaf, ~30 % less (issue 41)
    while stack:
        m = pop()
        if (m.training or m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks or "forward" in m.__dict__):
            return None
        keep(m)
        children = m._modules
        if children:  # a leaf (most modules: linears, norms) builds no list
            push(reversed([c for c in children.values() if c is not None]))
    return out


def _direct_ok(root: nn.Module, tops: tuple, check) -> bool:
    """True when the direct path is the stock computation for ``root`` now: the modules under ``tops`` pass
    ``check`` (run again whenever a module was added or replaced since), every one is in eval mode, and no hook
    is set (on them, or globally)."""
    if _global_hooks():
        return False
    mods = _walk(tops)
    if mods is None:
        return False
    if mods[0] is root:  # kept without the root: a value holding its weak key would keep the model alive
        mods = mods[1:]
    seen = _PLANS.get(root)
    if seen is None or seen[0] != mods:
        try:
            ok = bool(check(root))
        except (AttributeError, ImportError, TypeError):
            ok = False
        _PLANS[root] = seen = (mods, ok)
    return seen[1]


def _config_ok(config: Any) -> bool:
    return not getattr(config, "output_attentions", False) and not getattr(config, "output_hidden_states", False)


# ---------------------------------------------------------------------------------------------------- CLIP
def _clip_check(model: nn.Module) -> bool:
    from transformers.models.clip import modeling_clip as mc

    vm = getattr(model, "vision_model", None)
    if not (_exact(model, mc.CLIPModel) and _exact(vm, mc.CLIPVisionModel)
            and _exact(vm.embeddings, mc.CLIPVisionEmbeddings) and _exact(vm.encoder, mc.CLIPEncoder)
            and _exact(vm.pre_layrnorm, nn.LayerNorm) and _exact(vm.post_layernorm, nn.LayerNorm)
            and _exact(model.visual_projection, nn.Linear)):
        return False
    for layer in vm.encoder.layers:
        at, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not (_exact(layer, mc.CLIPEncoderLayer) and _exact(at, mc.CLIPAttention) and _exact(mlp, mc.CLIPMLP)
                and all(_exact(x, nn.Linear) for x in (at.q_proj, at.k_proj, at.v_proj, at.out_proj,
                                                       mlp.fc1, mlp.fc2))
                and _exact(layer.layer_norm1, nn.LayerNorm) and _exact(layer.layer_norm2, nn.LayerNorm)
                and not at.is_causal):
            return False
    return True


def _ln(x: torch.Tensor, m: nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)


def _lin(x: torch.Tensor, m: nn.Linear) -> torch.Tensor:
    return F.linear(x, m.weight, m.bias)


def _clip_attention(at: Any, x: torch.Tensor, impl: str,
                    first_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``CLIPAttention.forward`` without a mask (the vision tower's), for the ``eager`` / ``sdpa`` interfaces.
    ``first_only``: the output of the first ([CLS]) query row alone, ``[B, 1, W]`` (keys / values of every row)."""
    xq = x[:, :1] if first_only else x
    shape = xq.shape[:-1]
    q = _lin(xq, at.q_proj).view(*shape, -1, at.head_dim).transpose(1, 2)
    hidden = (*x.shape[:-1], -1, at.head_dim)
    k = _lin(x, at.k_proj).view(hidden).transpose(1, 2)
    v = _lin(x, at.v_proj).view(hidden).transpose(1, 2)
    dropout = 0.0 if not at.training else at.dropout
    if impl == "sdpa":  # transformers' sdpa_attention_forward: no mask, not causal
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=dropout, scale=at.scale,
                                             is_causal=False)
        out = out.reshape(out.shape[0], -1, q.shape[2], v.shape[-1]).transpose(1, 2).contiguous()
        w = None
    else:  # eager_attention_forward
        w = torch.matmul(q, k.transpose(-1, -2)) * at.scale
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        w = F.dropout(w, p=dropout, training=at.training)
        out = torch.matmul(w, v).transpose(1, 2).contiguous()
    return _lin(out.reshape(*shape, -1).contiguous(), at.out_proj), w


def _stock_quick_gelu(act: Any) -> bool:
    """Whether ``act`` is transformers' ``QuickGELUActivation`` with its own forward (not a hub kernel's)."""
    cls = type(act)
    return (cls.__name__ == "QuickGELUActivation" and cls.__module__ == "transformers.activations"
            and "forward" not in vars(act)
            and getattr(cls.forward, "__qualname__", None) == "QuickGELUActivation.forward")


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b``; into ``a`` (a fresh result of this path) when no graph is recorded through it. The same values
    bit for bit (one IEEE addition per element, which commutes): one large temporary less per residual."""
    return a + b if a.requires_grad else a.add_(b)


def _clip_layer(layer: Any, h: torch.Tensor, impl: str, first_only: bool = False) -> torch.Tensor:
    """``CLIPEncoderLayer.forward``; the attention weights (eager only) stay alive until it returns, as there.
    Without a graph the residual sums and QuickGELU reuse their fresh temporaries (the same values: see _add).
    ``first_only``: the layer's output at the [CLS] row alone, ``[B, 1, W]`` (see :func:`clip_image_features`)."""
    out, _weights = _clip_attention(layer.self_attn, _ln(h, layer.layer_norm1), impl, first_only)
    h = _add(out, h[:, :1] if first_only else h)  # h + out
    mlp = layer.mlp
    t = _lin(_ln(h, layer.layer_norm2), mlp.fc1)
    if t.requires_grad or not _stock_quick_gelu(mlp.activation_fn):
        a = mlp.activation_fn(t)
    else:  # QuickGELUActivation: t * sigmoid(1.702 * t)
        a = torch.mul(t, 1.702).sigmoid_().mul_(t)
    return _add(_lin(a, mlp.fc2), h)  # h + mlp(...)


def clip_image_features(model: Any, pixel_values: torch.Tensor) -> torch.Tensor:
    """``model.get_image_features(pixel_values=...)``'s projected features ``[B, P]`` (its ``pooler_output``),
    computed directly when the direct path is the same computation, else by the stock call. The direct path runs
    the last layer for the pooled [CLS] row only (the values within float rounding of the stock call's; see the
    module's docstring)."""
    vm = getattr(model, "vision_model", None)
    proj = getattr(model, "visual_projection", None)
    if not (isinstance(vm, nn.Module) and isinstance(proj, nn.Module) and _config_ok(vm.config)
            and getattr(vm.config, "_attn_implementation", None) in ("eager", "sdpa")
            and _direct_ok(model, (vm, proj), _clip_check)
            and pixel_values.shape[-2:] == (vm.embeddings.image_size,) * 2):
        feats = model.get_image_features(pixel_values=pixel_values)
        return getattr(feats, "pooler_output", feats)  # transformers 5 returns an output object
    impl = vm.config._attn_implementation
    h = vm.embeddings(pixel_values)  # patch conv + class token + positions (one module: its size check)
    h = _ln(h, vm.pre_layrnorm)
    layers = vm.encoder.layers
    last = len(layers) - 1
    for i, layer in enumerate(layers):  # the pooled output reads the [CLS] row only: the last layer runs that row
        h = _clip_layer(layer, h, impl, first_only=i == last)
    pooled = _ln(h[:, 0, :], vm.post_layernorm)
    return _lin(pooled, model.visual_projection)


# ------------------------------------------------------------------------------------------------ rating MLP
_MLP_PARTS = (nn.Linear, nn.Dropout, nn.ReLU)


def sequential_mlp(layers: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layers(x)`` for an ``nn.Sequential`` of ``Linear`` / ``Dropout`` / ``ReLU`` modules (the rating MLP of the
    aesthetic predictor and ImageReward), run as ``F.linear`` / ``F.relu`` on their weights, with each ``Dropout``
    (the identity in eval mode) skipped: the same operations in the same order, without one ``nn.Module.__call__``
    per layer (~20 us of the aesthetic head's ~110 us at batch 1; issue 41). The stock call instead whenever a
    module is of another class, in training mode, hooked or has an instance forward, or a global hook is set."""
    if _global_hooks() or type(layers) is not nn.Sequential:
        return layers(x)
    mods = _walk((layers,))
    if mods is None or not all(type(m) in _MLP_PARTS for m in mods[1:]):  # [1:]: the children, in order
        return layers(x)
    for m in mods[1:]:
        t = type(m)
        if t is nn.Linear:
            x = F.linear(x, m.weight, m.bias)
        elif t is nn.ReLU:
            x = F.relu(x, inplace=m.inplace)
    return x


# ---------------------------------------------------------------------------------------------------- BLIP
def _blip_check(vision: nn.Module) -> bool:
    from transformers.models.blip import modeling_blip as mb

    if not (_exact(vision, mb.BlipVisionModel) and _exact(vision.embeddings, mb.BlipVisionEmbeddings)
            and _exact(vision.encoder, mb.BlipEncoder) and _exact(vision.post_layernorm, nn.LayerNorm)):
        return False
    for layer in vision.encoder.layers:
        at, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not (_exact(layer, mb.BlipEncoderLayer) and _exact(at, mb.BlipAttention) and _exact(mlp, mb.BlipMLP)
                and all(_exact(x, nn.Linear) for x in (at.qkv, at.projection, mlp.fc1, mlp.fc2))
                and _exact(at.dropout, nn.Dropout)
                and _exact(layer.layer_norm1, nn.LayerNorm) and _exact(layer.layer_norm2, nn.LayerNorm)):
            return False
    return True


def blip_vision_states(vision: Any, pixel_values: torch.Tensor) -> torch.Tensor:
    """``vision(pixel_values=...).last_hidden_state`` ``[B, 1 + N, W]`` of a ``BlipVisionModel`` (the
    post-layer-normed token states), computed directly when the direct path is the same computation, else by
    the stock call."""
    if not (_config_ok(vision.config) and _direct_ok(vision, (vision,), _blip_check)
            and pixel_values.shape[-2:] == (vision.embeddings.image_size,) * 2):
        return vision(pixel_values=pixel_values).last_hidden_state
    h = vision.embeddings(pixel_values)
    for layer in vision.encoder.layers:  # BlipEncoderLayer.forward
        h = _blip_layer(layer, h)
    return _ln(h, vision.post_layernorm)


def _blip_layer(layer: Any, h: torch.Tensor) -> torch.Tensor:
    # the attention probabilities stay alive until the layer returns, as in the stock layer (which unpacks them
    # into a local): the same allocation pattern, which matters to CPU malloc's reuse of large blocks
    out, _probs = _blip_attention(layer.self_attn, _ln(h, layer.layer_norm1))
    h = _add(out, h)
    mlp = layer.mlp
    return _add(_lin(mlp.activation_fn(_lin(_ln(h, layer.layer_norm2), mlp.fc1)), mlp.fc2), h)


def _blip_attention(at: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``BlipAttention.forward`` (its own eager attention; dropout is the identity in eval mode). A function of
    its own, as the stock module is: its temporaries are freed when it returns, before the MLP allocates."""
    b, t, d = x.shape
    qkv = _lin(x, at.qkv).reshape(b, t, 3, at.num_heads, d // at.num_heads).permute(2, 0, 3, 1, 4)
    scores = torch.matmul(qkv[0], qkv[1].transpose(-1, -2)) * at.scale
    probs = F.softmax(scores, dim=-1)  # in the input dtype, as BlipAttention
    ctx = torch.matmul(probs, qkv[2]).permute(0, 2, 1, 3)
    return _lin(ctx.reshape(ctx.size()[:-2] + (at.embed_dim,)), at.projection), probs


# ----------------------------------------------------------------------------------------------- BLIP text
def _stock_gelu(act: Any) -> bool:
    """Whether ``act`` is transformers' ``GELUActivation`` with its own forward and ``F.gelu`` (not its Python
    formula, not a hub kernel's)."""
    cls = type(act)
    return (cls.__name__ == "GELUActivation" and cls.__module__ == "transformers.activations"
            and "forward" not in vars(act) and vars(act).get("act") is F.gelu
            and getattr(cls.forward, "__qualname__", None) == "GELUActivation.forward")


def _blip_text_check(text: nn.Module) -> bool:
    from transformers.models.blip import modeling_blip_text as mt

    e, enc = getattr(text, "embeddings", None), getattr(text, "encoder", None)
    if not (_exact(text, mt.BlipTextModel) and _exact(e, mt.BlipTextEmbeddings) and _exact(enc, mt.BlipTextEncoder)
            and _exact(e.word_embeddings, nn.Embedding) and _exact(e.position_embeddings, nn.Embedding)
            and _exact(e.LayerNorm, nn.LayerNorm) and _exact(e.dropout, nn.Dropout)):
        return False

    def attention(a: Any) -> bool:  # BlipTextAttention: BlipTextSelfAttention + BlipTextSelfOutput
        sa, out = getattr(a, "self", None), getattr(a, "output", None)
        return (_exact(a, mt.BlipTextAttention) and _exact(sa, mt.BlipTextSelfAttention)
                and _exact(out, mt.BlipTextSelfOutput)
                and all(_exact(x, nn.Linear) for x in (sa.query, sa.key, sa.value, out.dense))
                and _exact(sa.dropout, nn.Dropout) and _exact(out.LayerNorm, nn.LayerNorm)
                and _exact(out.dropout, nn.Dropout))

    for layer in enc.layer:  # cross-attention in every layer (a decoder config), no feed-forward chunking
        if not (_exact(layer, mt.BlipTextLayer) and layer.chunk_size_feed_forward == 0
                and attention(layer.attention) and attention(getattr(layer, "crossattention", None))
                and _exact(layer.intermediate, mt.BlipTextIntermediate)
                and _exact(layer.intermediate.dense, nn.Linear) and _exact(layer.output, mt.BlipTextOutput)
                and _exact(layer.output.dense, nn.Linear) and _exact(layer.output.LayerNorm, nn.LayerNorm)
                and _exact(layer.output.dropout, nn.Dropout)):
            return False
    return True


def blip_text_states(text: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     image_states: torch.Tensor, first_only: bool = False) -> torch.Tensor:
    """``text(input_ids=..., attention_mask=..., encoder_hidden_states=image_states, encoder_attention_mask=ones,
    is_decoder=False).last_hidden_state`` ``[B, T, W]`` of a ``BlipTextModel`` (BLIP's bidirectional
    "multimodal" mode: every image token attended), computed directly when the direct path is the same
    computation, else by that stock call.

    ``first_only=True``: the [CLS] row alone, ``[B, 1, W]`` (what ImageReward reads). The direct path then runs
    the last layer for that row only (its keys and values still from every row and image token), as
    :func:`clip_image_features` does; the values equal the full forward's row within float rounding."""
    cfg = getattr(text, "config", None)
    pos = getattr(getattr(text, "embeddings", None), "position_ids", None)
    if not (isinstance(text, nn.Module) and _config_ok(cfg) and getattr(cfg, "_attn_implementation", None) == "eager"
            and input_ids.ndim == 2 and attention_mask.shape == input_ids.shape and image_states.ndim == 3
            and image_states.shape[0] == input_ids.shape[0] and isinstance(pos, torch.Tensor)
            and input_ids.shape[1] <= pos.shape[-1] and _direct_ok(text, (text,), _blip_text_check)):
        ones = torch.ones(image_states.shape[:2], dtype=torch.long, device=image_states.device)
        out = text(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=image_states,
                   encoder_attention_mask=ones, is_decoder=False).last_hidden_state
        return out[:, :1] if first_only else out
    e = text.embeddings
    we, pe = e.word_embeddings, e.position_embeddings
    h = F.embedding(input_ids, we.weight, we.padding_idx, we.max_norm, we.norm_type, we.scale_grad_by_freq,
                    we.sparse)  # nn.Embedding.forward, then BlipTextEmbeddings' in-place position sum
    h += F.embedding(pos[:, :input_ids.shape[1]], pe.weight, pe.padding_idx, pe.max_norm, pe.norm_type,
                     pe.scale_grad_by_freq, pe.sparse)
    h = _ln(h, e.LayerNorm)
    # create_bidirectional_mask (eager): no mask when every token of the batch is attended, else 0 / dtype min
    # on the keys (one row per sequence, broadcast over the queries: the same sums as transformers' [B, 1, T, T])
    keep = attention_mask.to(device=h.device, dtype=torch.bool)
    mask = None if keep.all() else torch.where(keep[:, None, None, :], torch.zeros((), device=h.device, dtype=h.dtype),
                                               torch.finfo(h.dtype).min)
    layers = text.encoder.layer
    last = len(layers) - 1 if first_only else -1
    for i, layer in enumerate(layers):  # BlipTextLayer.forward
        h = _blip_text_attention(layer.attention, h, h, mask, first_only=i == last)
        h = _blip_text_attention(layer.crossattention, h, image_states, None)
        inter = layer.intermediate
        t = _lin(h, inter.dense)
        t = F.gelu(t) if _stock_gelu(inter.intermediate_act_fn) else inter.intermediate_act_fn(t)
        out = layer.output  # BlipTextOutput: LayerNorm(dense(t) + h)
        h = _ln(_add(_lin(t, out.dense), h), out.LayerNorm)
    return h


def _blip_text_attention(a: Any, h: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor | None,
                         first_only: bool = False) -> torch.Tensor:
    """``BlipTextAttention.forward`` (self-attention when ``kv`` is ``h``, else cross-attention to ``kv``) and its
    ``BlipTextSelfOutput``: ``LayerNorm(dense(context) + h)``. Dropout is the identity in eval mode.
    ``first_only``: the first query row alone, ``[B, 1, W]`` (the mask, one row per sequence, broadcasts)."""
    sa = a.self
    d = sa.attention_head_size
    if first_only:
        h = h[:, :1]
    q = _lin(h, sa.query).view(*h.shape[:-1], -1, d).transpose(1, 2)
    k = _lin(kv, sa.key).view(*kv.shape[:-1], -1, d).transpose(1, 2)
    v = _lin(kv, sa.value).view(*kv.shape[:-1], -1, d).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(-1, -2))
    scale = math.sqrt(d)
    scores = scores / scale if scores.requires_grad else scores.div_(scale)
    if mask is not None:
        scores = _add(scores, mask)
    probs = F.softmax(scores, dim=-1)
    ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
    ctx = ctx.view(ctx.size()[:-2] + (sa.all_head_size,))
    return _ln(_add(_lin(ctx, a.output.dense), h), a.output.LayerNorm)
