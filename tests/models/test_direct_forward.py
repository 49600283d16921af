"""The direct forward of the CLIP family's vision tower and of ImageReward's BLIP towers
(rewardkit.models.direct_forward): ``torch.equal`` to transformers' stock ``BlipVisionModel`` / ``BlipTextModel``
forward and to the stock CLIP encoder layers; the pooled CLIP features and ImageReward's [CLS] text row, whose
last layer runs that one row, equal to the stock call's within float rounding (``_same``); the stock call
whenever the direct path would skip something (hooks, training mode, another size, a wrapped module)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rewardkit.models.direct_forward import blip_text_states, blip_vision_states, clip_image_features

transformers = pytest.importorskip("transformers")


def _clip(attn: str, act: str = "quick_gelu", layers: int = 2, seed: int = 0):
    vision = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=3,
                  image_size=56, patch_size=14, hidden_act=act)
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=16)
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=24)
    torch.manual_seed(seed)
    return transformers.CLIPModel._from_config(cfg, attn_implementation=attn).eval()


def _blip(seed: int = 0, layers: int = 2):
    cfg = transformers.BlipVisionConfig(hidden_size=48, intermediate_size=96, num_hidden_layers=layers,
                                        num_attention_heads=3, image_size=48, patch_size=16)
    torch.manual_seed(seed)
    return transformers.BlipVisionModel(cfg).eval()


def _stock_clip(model, px):
    out = model.get_image_features(pixel_values=px)
    return getattr(out, "pooler_output", out)


def _same(got: torch.Tensor, ref: torch.Tensor, rel: float = 2e-6) -> bool:
    """Equal within float32 rounding: the last layer's one row runs through other matmul / attention kernel
    blockings than the full rows (a few ulp per op; measured <= 4e-7 of the largest value on these towers)."""
    return got.shape == ref.shape and float((got - ref).abs().max()) <= rel * float(ref.abs().max())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("act", ["quick_gelu", "gelu"])
def test_clip_direct_features_equal_get_image_features(attn, act):
    model = _clip(attn, act)
    assert model.vision_model.config._attn_implementation == attn
    for b, seed in ((1, 0), (2, 1), (5, 2)):
        g = torch.Generator().manual_seed(seed)
        px = torch.randn(b, 3, 56, 56, generator=g) * 1.5  # normalised-pixel range
        with torch.inference_mode():
            assert _same(clip_image_features(model, px), _stock_clip(model, px))
        with torch.no_grad():
            assert _same(clip_image_features(model, px), _stock_clip(model, px))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_clip_direct_layers_equal_the_stock_layers_bit_for_bit(attn):
    """Every layer run whole is the stock ``CLIPEncoderLayer`` bit for bit (its hidden states, as transformers
    records them); the last one run for the [CLS] row alone gives that row within rounding."""
    from rewardkit.models.direct_forward import _clip_layer, _ln

    model = _clip(attn, layers=3)
    vm = model.vision_model
    px = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        states = vm(pixel_values=px, output_hidden_states=True).hidden_states  # after the pre-norm, each layer
        h = _ln(vm.embeddings(px), vm.pre_layrnorm)
        assert torch.equal(h, states[0])
        for i, layer in enumerate(vm.encoder.layers):
            assert _same(_clip_layer(layer, h, attn, first_only=True), states[i + 1][:, :1])
            h = _clip_layer(layer, h, attn)
            assert torch.equal(h, states[i + 1])


def test_clip_last_layer_runs_the_cls_row_only(monkeypatch):
    """The pooled features read the [CLS] row: the last layer's query, output projection and MLP run on that row
    (``[B, 1, W]``), its keys and values on every row; earlier layers on every row."""
    import rewardkit.models.direct_forward as df

    model = _clip("sdpa", layers=2)
    last = model.vision_model.encoder.layers[-1]
    rows = {}
    real = df._lin

    def lin(x, m):
        rows.setdefault(id(m), []).append(x.shape[1])
        return real(x, m)

    monkeypatch.setattr(df, "_lin", lin)
    with torch.inference_mode():
        clip_image_features(model, torch.randn(3, 3, 56, 56))
    tokens = 1 + (56 // 14) ** 2
    at, mlp = last.self_attn, last.mlp
    assert [rows[id(m)] for m in (at.q_proj, at.out_proj, mlp.fc1, mlp.fc2)] == [[1]] * 4
    assert rows[id(at.k_proj)] == rows[id(at.v_proj)] == [tokens]
    first = model.vision_model.encoder.layers[0]
    assert rows[id(first.mlp.fc1)] == rows[id(first.self_attn.q_proj)] == [tokens]


def test_clip_direct_gradients_equal_the_stock_call():
    model = _clip("sdpa").requires_grad_(False)
    grads = []
    for fn in (clip_image_features, _stock_clip):
        px = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
        fn(model, px).square().sum().backward()
        grads.append(px.grad)
    assert _same(grads[0], grads[1], rel=1e-5)


def test_blip_direct_states_equal_the_stock_forward_bit_for_bit():
    vision = _blip()
    for b, seed in ((1, 0), (3, 1)):
        px = torch.randn(b, 3, 48, 48, generator=torch.Generator().manual_seed(seed))
        with torch.inference_mode():
            got = blip_vision_states(vision, px)
            assert torch.equal(got, vision(pixel_values=px).last_hidden_state)
        assert got.shape == (b, 1 + 9, 48)


def _stock_counter(monkeypatch, cls, name):
    calls = []
    stock = getattr(cls, name)

    def counted(self, *a, **k):
        calls.append(1)
        return stock(self, *a, **k)

    monkeypatch.setattr(cls, name, counted)
    return calls


def test_clip_takes_the_stock_call_when_the_direct_path_would_skip_something(monkeypatch):
    model = _clip("sdpa")
    calls = _stock_counter(monkeypatch, transformers.CLIPModel, "get_image_features")
    px = torch.randn(1, 3, 56, 56)
    with torch.inference_mode():
        ref = _stock_clip(model, px)
        calls.clear()
        assert _same(clip_image_features(model, px), ref) and not calls  # the direct path

        seen = []  # a forward hook (a profiler, a feature extractor) still fires
        h = model.vision_model.encoder.layers[1].mlp.fc2.register_forward_hook(lambda *a: seen.append(1))
        assert _same(clip_image_features(model, px), ref) and calls and seen
        h.remove()
        calls.clear()

        model.train()  # dropout would apply: the stock call
        clip_image_features(model, px)
        assert calls
        model.eval()
        calls.clear()

        # a replaced (e.g. LoRA-wrapped) module is seen on the next call
        layer = model.vision_model.encoder.layers[0].self_attn
        layer.q_proj = nn.Sequential(layer.q_proj)
        assert _same(clip_image_features(model, px), ref) and calls
        layer.q_proj = layer.q_proj[0]
        calls.clear()
        assert _same(clip_image_features(model, px), ref) and not calls  # direct again

        with pytest.raises(ValueError, match="doesn't match model"):  # another size: the stock call's error
            clip_image_features(model, torch.randn(1, 3, 42, 42))


def test_clip_other_attention_kernels_take_the_stock_call(monkeypatch):
    model = _clip("sdpa")
    px = torch.randn(1, 3, 56, 56)
    monkeypatch.setattr(transformers.CLIPModel, "get_image_features", lambda self, **k: torch.zeros(1, 24))
    with torch.inference_mode():
        assert clip_image_features(model, px).abs().sum() > 0  # sdpa: the direct path (the stub is not asked)
        model.vision_model.config._attn_implementation = "flex_attention"  # as if loaded with it
        assert torch.equal(clip_image_features(model, px), torch.zeros(1, 24))  # the stock call answered


def test_blip_takes_the_stock_call_with_a_hook(monkeypatch):
    vision = _blip()
    calls = _stock_counter(monkeypatch, transformers.BlipVisionModel, "forward")
    px = torch.randn(2, 3, 48, 48)
    with torch.inference_mode():
        ref = vision(pixel_values=px).last_hidden_state
        calls.clear()
        assert torch.equal(blip_vision_states(vision, px), ref) and not calls
        h = vision.encoder.layers[0].register_forward_pre_hook(lambda *a: None)
        assert torch.equal(blip_vision_states(vision, px), ref) and calls
        h.remove()


def test_the_module_walk_is_modules_and_sees_every_hook_and_mode():
    from rewardkit.models.direct_forward import _walk

    model = _clip("sdpa")
    vm = model.vision_model
    assert _walk((vm, model.visual_projection)) == [*vm.modules(), model.visual_projection]
    for m in (vm, vm.encoder.layers[1].mlp.act if hasattr(vm.encoder.layers[1].mlp, "act")
              else vm.encoder.layers[1].mlp.activation_fn, vm.post_layernorm):
        h = m.register_forward_pre_hook(lambda *a: None)
        assert _walk((vm,)) is None
        h.remove()
        m.train()
        assert _walk((vm,)) is None
        m.eval()
    assert _walk((vm,)) == list(vm.modules())


def test_the_kept_plan_does_not_keep_the_model_alive():
    import gc
    import weakref

    text_inputs = _text_inputs((4, 12))
    for make, call in ((_blip, lambda m: blip_vision_states(m, torch.randn(1, 3, 48, 48))),
                       (lambda: _clip("sdpa"), lambda m: clip_image_features(m, torch.randn(1, 3, 56, 56))),
                       (_blip_text, lambda m: blip_text_states(m, *text_inputs))):
        model = make()
        with torch.inference_mode():
            call(model)
        ref = weakref.ref(model)
        del model
        gc.collect()
        assert ref() is None


def test_quick_gelu_in_place_only_for_the_stock_activation(monkeypatch):
    """Without a graph QuickGELU and the residual sums reuse their temporaries (the same values bit for bit, as
    the tests above check); an activation whose forward was replaced (a hub kernel) is called as a module."""
    import rewardkit.models.direct_forward as df

    model = _clip("sdpa", "quick_gelu")
    act = model.vision_model.encoder.layers[0].mlp.activation_fn
    assert df._stock_quick_gelu(act)
    px = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(5))
    calls = _stock_counter(monkeypatch, torch.Tensor, "sigmoid_")
    with torch.inference_mode():
        clip_image_features(model, px)
    assert len(calls) == 2  # the in-place form, once per layer
    calls.clear()
    with torch.inference_mode():
        clip_image_features(_clip("sdpa", "gelu"), px)
    assert not calls
    act.forward = lambda x: torch.zeros_like(x)  # as a kernel replacing the forward of this instance
    assert not df._stock_quick_gelu(act)
    with torch.inference_mode():
        assert _same(clip_image_features(model, px), _stock_clip(model, px))
    assert not df._stock_quick_gelu(model.vision_model.encoder.layers[0].mlp.fc1)


def test_an_instance_forward_takes_the_stock_call(monkeypatch):
    """accelerate's offloading (``add_hook_to_module``) and other tools replace a module's forward on the
    instance: the stock call runs it."""
    model = _clip("sdpa")
    px = torch.randn(1, 3, 56, 56)
    calls = _stock_counter(monkeypatch, transformers.CLIPModel, "get_image_features")
    fc1 = model.vision_model.encoder.layers[0].mlp.fc1
    seen = []
    stock_forward = fc1.forward
    fc1.forward = lambda x: seen.append(1) or stock_forward(x)
    with torch.inference_mode():
        clip_image_features(model, px)
    assert calls and seen
    del fc1.forward
    calls.clear()
    with torch.inference_mode():
        clip_image_features(model, px)
    assert not calls


# ---- BLIP text tower (ImageReward's BERT with cross-attention to the image tokens) ----------------------------------
def _blip_text(seed: int = 0, layers: int = 2, **over):
    kw = dict(vocab_size=60, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
              encoder_hidden_size=24, max_position_embeddings=20, is_decoder=True, bos_token_id=1, sep_token_id=2,
              eos_token_id=2)
    cfg = transformers.BlipTextConfig(**{**kw, **over})
    torch.manual_seed(seed)
    return transformers.BlipTextModel(cfg, add_pooling_layer=False).eval()


def _text_inputs(lengths, t: int = 12, seed: int = 0):
    """Token rows ``[B, t]`` of the given lengths (CLS ... SEP, then padding 0) and image states ``[B, 7, 24]``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), t, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, 60, (n,), generator=g)
        ids[i, 0], ids[i, n - 1] = 1, 2
        mask[i, :n] = 1
    return ids, mask, torch.randn(len(lengths), 7, 24, generator=g) * 2


def _stock_text(text, ids, mask, img):
    return text(input_ids=ids, attention_mask=mask, encoder_hidden_states=img,
                encoder_attention_mask=torch.ones(img.shape[:2], dtype=torch.long), is_decoder=False).last_hidden_state


@pytest.mark.parametrize("lengths", [(5,), (12,), (3, 12), (12, 12), (2, 7, 12, 4, 9)])
def test_blip_text_states_equal_the_stock_forward_bit_for_bit(lengths):
    """Prompts of several lengths: padded (a mask added to the self-attention scores), unpadded (none: the
    stock call skips it), mixed; batch 1, 2 and 5; inference mode and no_grad."""
    text = _blip_text()
    ids, mask, img = _text_inputs(lengths, seed=len(lengths))
    for ctx in (torch.inference_mode, torch.no_grad):
        with ctx():
            got = blip_text_states(text, ids, mask, img)
            assert torch.equal(got, _stock_text(text, ids, mask, img))
    assert got.shape == (len(lengths), 12, 32)


def test_blip_text_gradients_equal_the_stock_call():
    """score_tensor differentiates through the cross-attention to the image states."""
    text = _blip_text().requires_grad_(False)
    ids, mask, img0 = _text_inputs((4, 12, 7), seed=3)
    grads = []
    for fn in (blip_text_states, _stock_text):
        img = img0.clone().requires_grad_(True)
        out = fn(text, ids, mask, img)
        out[:, 0].square().sum().backward()
        grads.append((out.detach(), img.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("lengths", [(5,), (12,), (3, 12), (2, 7, 12, 4, 9)])
def test_blip_text_cls_row_equals_the_stock_forward(lengths):
    """``first_only=True`` (ImageReward reads the [CLS] row): the last layer runs that row against every key,
    value and image token; the row equals the stock forward's within rounding, padded or not."""
    text = _blip_text(layers=3)
    ids, mask, img = _text_inputs(lengths, seed=len(lengths))
    with torch.inference_mode():
        got = blip_text_states(text, ids, mask, img, first_only=True)
        assert got.shape == (len(lengths), 1, 32)
        assert _same(got, _stock_text(text, ids, mask, img)[:, :1])
    single = _blip_text(layers=1)  # the only layer is the last
    with torch.inference_mode():
        assert _same(blip_text_states(single, ids, mask, img, first_only=True),
                     _stock_text(single, ids, mask, img)[:, :1])


def test_blip_text_cls_row_gradients_equal_the_stock_call():
    text = _blip_text().requires_grad_(False)
    ids, mask, img0 = _text_inputs((4, 12, 7), seed=3)
    # a random weighting: the row is layer-normed, so its sum of squares is nearly constant (a gradient of ~0)
    w = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    grads = []
    for fn in (lambda *a: blip_text_states(*a, first_only=True), lambda *a: _stock_text(*a)[:, :1]):
        img = img0.clone().requires_grad_(True)
        (fn(text, ids, mask, img)[:, 0] * w).sum().backward()
        grads.append(img.grad)
    assert _same(grads[0], grads[1], rel=1e-5)


def test_blip_text_cls_row_through_the_stock_call(monkeypatch):
    text = _blip_text()
    ids, mask, img = _text_inputs((5, 12), seed=4)
    calls = _stock_counter(monkeypatch, transformers.BlipTextModel, "forward")
    with torch.inference_mode():
        ref = _stock_text(text, ids, mask, img)[:, :1]
        calls.clear()
        h = text.encoder.layer[0].output.dense.register_forward_hook(lambda *a: None)
        assert torch.equal(blip_text_states(text, ids, mask, img, first_only=True), ref) and calls
        h.remove()


def test_blip_text_takes_the_stock_call_when_the_direct_path_would_skip_something(monkeypatch):
    text = _blip_text()
    calls = _stock_counter(monkeypatch, transformers.BlipTextModel, "forward")
    ids, mask, img = _text_inputs((5, 12), seed=4)
    with torch.inference_mode():
        ref = _stock_text(text, ids, mask, img)
        calls.clear()
        assert torch.equal(blip_text_states(text, ids, mask, img), ref) and not calls  # the direct path

        seen = []  # a forward hook still fires
        h = text.encoder.layer[1].crossattention.self.key.register_forward_hook(lambda *a: seen.append(1))
        assert torch.equal(blip_text_states(text, ids, mask, img), ref) and calls and seen
        h.remove()
        calls.clear()

        text.train()  # dropout would apply: the stock call
        blip_text_states(text, ids, mask, img)
        assert calls
        text.eval()
        calls.clear()

        at = text.encoder.layer[0].attention.self  # a LoRA-wrapped linear, seen on the next call
        at.query = nn.Sequential(at.query)
        assert torch.equal(blip_text_states(text, ids, mask, img), ref) and calls
        at.query = at.query[0]
        calls.clear()
        assert torch.equal(blip_text_states(text, ids, mask, img), ref) and not calls  # direct again

        text.config.output_attentions = True  # transformers' output flags: the stock call records them
        blip_text_states(text, ids, mask, img)
        assert calls
        text.config.output_attentions = False
        calls.clear()

        too_long = torch.ones(2, 21, dtype=torch.long)  # past the position table: the stock call's error
        with pytest.raises((IndexError, RuntimeError)):
            blip_text_states(text, too_long, too_long, img)
        assert calls


def test_blip_text_without_cross_attention_or_another_activation_takes_the_stock_call(monkeypatch):
    """An encoder-only config (no cross-attention layers) and a chunked feed-forward are not the computation
    the direct path runs; a GELU whose forward was replaced is called as the module."""
    ids, mask, img = _text_inputs((5, 12), seed=6)
    chunked = _blip_text(chunk_size_feed_forward=4)
    calls = _stock_counter(monkeypatch, transformers.BlipTextModel, "forward")
    with torch.inference_mode():
        assert torch.equal(blip_text_states(chunked, ids, mask, img), _stock_text(chunked, ids, mask, img))
        assert len(calls) == 2
        calls.clear()
        text = _blip_text()
        act = text.encoder.layer[0].intermediate.intermediate_act_fn
        act.forward = lambda x: torch.zeros_like(x)  # a kernel replacing this instance's forward: stock call
        assert torch.equal(blip_text_states(text, ids, mask, img), _stock_text(text, ids, mask, img))
        assert len(calls) == 2
    from rewardkit.models.direct_forward import _blip_text_check, _stock_gelu

    assert not _blip_text_check(_blip_text(is_decoder=False))
    assert _stock_gelu(_blip_text().encoder.layer[0].intermediate.intermediate_act_fn)
    assert not _stock_gelu(act)


# ---------------------------------------------------------------------------------------- rating MLP (head)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_rating_mlp_direct_equals_its_sequential_bit_for_bit(monkeypatch, activation):
    """RatingMLP (the aesthetic / ImageReward head) runs its Sequential as F.linear / F.relu: the values and the
    gradients of the stock ``layers(x)``, without a module call per layer."""
    from rewardkit.models.zoo import RatingMLP

    torch.manual_seed(0)
    head = RatingMLP(24, activation, dropout=0.2, widths=(32, 16, 8, 4)).eval()
    x = torch.randn(5, 24)
    ref = head.layers(x)
    calls = _stock_counter(monkeypatch, nn.Linear, "forward")
    assert torch.equal(head(x), ref) and not calls
    xg = x.clone().requires_grad_(True)
    head(xg).sum().backward()
    calls.clear()
    xs = x.clone().requires_grad_(True)
    head.layers(xs).sum().backward()
    assert calls and torch.equal(xg.grad, xs.grad)


def test_rating_mlp_takes_the_stock_call_when_the_direct_path_would_skip_something(monkeypatch):
    from rewardkit.models.zoo import RatingMLP

    torch.manual_seed(0)
    head = RatingMLP(24, None, dropout=0.5, widths=(32, 16, 8, 4)).eval()
    x = torch.randn(3, 24)
    ref = head.layers(x)
    calls = _stock_counter(monkeypatch, nn.Sequential, "forward")
    with torch.inference_mode():
        assert torch.equal(head(x), ref) and not calls

        seen = []  # a hook on one layer still fires
        h = head.layers[2].register_forward_hook(lambda *a: seen.append(1))
        assert torch.equal(head(x), ref) and calls and seen
        h.remove()
        calls.clear()

        head.train()  # dropout applies: the stock call
        head(x)
        assert calls
        head.eval()
        calls.clear()

        head.layers[1] = nn.GELU()  # in place of a dropout: a module of another class: the stock call, which applies it
        assert torch.equal(head(x), head.layers(x)) and calls
        calls.clear()

        g = torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: None)  # a global hook
        try:
            head(x)
            assert calls
        finally:
            g.remove()
