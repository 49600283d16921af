"""Sampling options of the official DiffusionNFT code in the bundled trainer: DDIM, classifier-free guidance, the
integer timestep of the official sampler, and starting from a LoRA or a full fine-tune.

References are transcriptions of NVlabs/DiffusionNFT @ 24af5554 (``flow_grpo/diffusers_patch/solver.py``,
``flow_grpo/diffusers_patch/pipeline_with_logprob.py``, ``scripts/train_nft_sd3.py``), cited by line, or the
model that wrote a LoRA (peft / diffusers) run directly.
"""

from __future__ import annotations

import math

import pytest
import torch

from rewardkit.rl import solvers

pytest.importorskip("diffusers")
pytest.importorskip("peft")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------ DDIM
def _official_ddim(v_fn, z, sigmas, eta, noises):
    """solver.py:159-185 (ddim_step), :263-272 (convert_model_output) and :275-295 (ddim_update), transcribed;
    the per-step noise passed in (ddim_update's ``noise`` argument) instead of torch.randn_like."""
    sigmas = torch.tensor(sigmas, dtype=torch.float32)
    for index in range(len(sigmas) - 1):
        model_output = v_fn(z, float(sigmas[index]))
        latents = z.float()
        model_output = latents - sigmas[index] * model_output            # convert_model_output
        sig = sigmas.to(torch.float64)
        t, s = sig[index + 1], sig[index]
        std_dev_t = eta * t
        dt_sqrt = torch.sqrt(1.0 - t ** 2 * (1 - s) ** 2 / (s ** 2 * (1 - t) ** 2))
        rho_t = std_dev_t * dt_sqrt
        noise_pred = (latents - (1 - s) * model_output) / s
        prev_mean = (1 - t) * model_output + torch.sqrt(t ** 2 - rho_t ** 2) * noise_pred
        z = prev_mean + rho_t * noises[index]
    return z


def test_ddim_by_hand_and_against_the_official_step():
    # hand: sigmas [1, 0.5, 0], v(x) = x, x = 2, eta = 0.5. Step 0 (s = 1, t = 0.5): x0 = 0, eps_hat = 2,
    # std = 0.25, dt_sqrt = 1, rho = 0.25 -> x' = sqrt(0.25 - 0.0625) * 2 + 0.25 z0. Step 1 (t = 0): x0 = x' / 2.
    x = torch.full((1, 1, 1, 1), 2.0)
    g = torch.Generator().manual_seed(0)
    out = solvers.sample("ddim_sde", lambda x, s, i: x, x, [1.0, 0.5, 0.0], eta=0.5, generator=g)
    z0 = float(torch.randn((1, 1, 1, 1), generator=torch.Generator().manual_seed(0)))
    assert float(out) == pytest.approx(0.5 * (math.sqrt(0.1875) * 2 + 0.25 * z0), rel=1e-6)

    # a nonlinear field over a real 10-step SD3 schedule, eta = 0.7, against the transcription
    from rewardkit.rl.schedule import flow_sigmas

    sig = [float(v) for v in flow_sigmas(10, 3.0)]
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    field = lambda x, s: torch.tanh(x @ w) * (1 + s)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(5)
    ours = solvers.sample("ddim_sde", lambda x, s, i: field(x, s), x, sig, eta=0.7, generator=g)
    g = torch.Generator().manual_seed(5)
    noises = [torch.randn(x.shape, generator=g) for _ in range(len(sig) - 2)] + [torch.zeros_like(x)]
    torch.testing.assert_close(ours, _official_ddim(field, x, sig, 0.7, noises).float(), rtol=1e-5, atol=1e-5)

    # eta = 0 ("ddim", the official deterministic=True) is exactly Euler: x + (t - s) v (hand-derived)
    det = solvers.sample("ddim", lambda x, s, i: field(x, s), x, sig)
    torch.testing.assert_close(det, solvers.euler_ode(lambda x, s, i: field(x, s), x, sig), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(det, _official_ddim(field, x, sig, 0.0, [torch.zeros_like(x)] * 10).float(),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="exceed"):
        solvers.ddim(lambda x, s, i: x, x, [1.0, 0.5, 0.0], eta=3.0)


def test_stochastic_solvers_take_one_generator_per_row():
    """A sequence of generators, one per row: each row's step noise comes from its own generator, so a sample gets
    the same trajectory alone as in any batch; a wrong count is refused."""
    from rewardkit.rl import solvers
    from rewardkit.rl.schedule import flow_sigmas

    sig = [float(v) for v in flow_sigmas(6, 3.0)]
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    field = lambda x, s, i: torch.tanh(x @ w) * (1 + s)  # noqa: E731
    x = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(2))
    for name in ("flow_sde", "ddim_sde"):
        gens = lambda: [torch.Generator().manual_seed(10 + i) for i in range(3)]  # noqa: E731
        batch = solvers.sample(name, field, x, sig, eta=0.7, generator=gens())
        alone = torch.cat([solvers.sample(name, field, x[i:i + 1], sig, eta=0.7, generator=[g])
                           for i, g in enumerate(gens())])
        torch.testing.assert_close(batch, alone, rtol=0, atol=0)
        # row i with generator i is the row alone with that one generator (the single-generator path)
        one = solvers.sample(name, field, x[1:2], sig, eta=0.7, generator=torch.Generator().manual_seed(11))
        torch.testing.assert_close(batch[1:2], one, rtol=0, atol=0)
        # one shared generator: the batch's noise is drawn as one tensor, so a row's depends on its batch
        shared = solvers.sample(name, field, x, sig, eta=0.7, generator=torch.Generator().manual_seed(10))
        assert float((shared[1:] - batch[1:]).abs().max()) > 1e-3
        with pytest.raises(ValueError, match="one generator per row"):
            solvers.sample(name, field, x, sig, eta=0.7, generator=gens()[:2])


def test_config_accepts_the_new_solvers_and_options():
    from rewardkit.config import build_config
    from rewardkit.rl.config import NFTConfig

    cfg = build_config(NFTConfig, {"sample": {"solver": "ddim", "eval_solver": "ddim_sde", "guidance_scale": 4.5,
                                              "negative_prompt": "blurry", "integer_timestep": True}})
    cfg.validate()
    d = NFTConfig()
    assert (d.sample.guidance_scale, d.sample.negative_prompt, d.sample.integer_timestep) == (1.0, "", False)
    assert (d.model.init_lora, d.model.transformer) == (None, None)
    for bad in ({"solver": "dance"}, {"guidance_scale": float("nan")}, {"eta": -1.0}):
        with pytest.raises(ValueError):
            build_config(NFTConfig, {"sample": bad}).validate()


# ------------------------------------------------------------------------------------------------ the model side
@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    from rewardkit.testing import save_tiny_checkpoint

    return str(save_tiny_checkpoint("sd3", tmp_path_factory.mktemp("sampling") / "sd3"))


@pytest.fixture(scope="module")
def policy(sd3_dir):
    from rewardkit.rl.sd3 import SD3Policy

    return SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16)


def _x(policy, b=2, seed=0):
    return torch.randn(policy.latent_shape(b, 32), generator=torch.Generator().manual_seed(seed))


def test_integer_timestep_is_the_official_samplers(policy):
    """pipeline_with_logprob.py:213: ``torch.full([B], sigma * 1000, device, dtype=torch.long)`` with sigma from
    ``scheduler.sigmas.float()`` (float32), i.e. 1000 sigma truncated; training keeps the float."""
    cond = policy.encode(["a cat", "a dog"])
    x = _x(policy)
    sigma = torch.tensor(0.9601, dtype=torch.float32)      # the second of the 10-step schedule
    sig = torch.full((2,), float(sigma))
    with torch.no_grad():
        ours = policy.sample_velocity(policy.transformer, x, sig, cond, integer_timestep=True)
        timesteps = torch.full([x.shape[0]], sigma * 1000, dtype=torch.long)
        assert timesteps.tolist() == [960, 960]
        ref = policy.transformer(hidden_states=x, timestep=timesteps, encoder_hidden_states=cond.embeds,
                                 pooled_projections=cond.pooled, return_dict=False)[0]
        flt = policy.sample_velocity(policy.transformer, x, sig, cond)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert float((flt - ours).abs().max()) > 0          # 960.1 vs 960: a different input


def test_classifier_free_guidance_is_the_official_samplers(policy):
    """pipeline_with_logprob.py:132-134 (embeds = cat[negative, prompt]) and :209-226 (one forward on cat[z, z],
    ``uncond + g (text - uncond)``), with the negative prompt "" encoded like the prompts (train_nft_sd3.py:497)."""
    cond = policy.encode(["a cat", "a dog"])
    neg = policy.encode([""])
    x = _x(policy, seed=1)
    sig = torch.full((2,), 0.7)
    with torch.no_grad():
        ours = policy.sample_velocity(policy.transformer, x, sig, cond, guidance_scale=4.5)
        prompt_embeds = torch.cat([neg.embeds.repeat(2, 1, 1), cond.embeds], dim=0)
        pooled_prompt_embeds = torch.cat([neg.pooled.repeat(2, 1), cond.pooled], dim=0)
        latent_model_input = torch.cat([x] * 2)
        timesteps = torch.full([latent_model_input.shape[0]], 0.7 * 1000)
        noise_pred = policy.transformer(hidden_states=latent_model_input, timestep=timesteps,
                                        encoder_hidden_states=prompt_embeds, pooled_projections=pooled_prompt_embeds,
                                        return_dict=False)[0]
        noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
        ref = noise_pred_uncond + 4.5 * (noise_pred_text - noise_pred_uncond)
        off = policy.sample_velocity(policy.transformer, x, sig, cond, guidance_scale=1.0)
        plain = policy.velocity(policy.transformer, x, sig, cond)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(off, plain, rtol=0, atol=0)          # <= 1: off, one conditional forward
    assert float((ours - plain).abs().max()) > 1e-3


def _randomise_lora_b(module, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in module.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def test_start_from_a_peft_lora(sd3_dir, tmp_path):
    """A LoRA written by peft (``PeftModel.save_pretrained``): the trained and the old adapter start as that
    LoRA (its own rank and alpha), the reference is the base model (official: ``PeftModel.from_pretrained(
    transformer, config.train.lora_path)``, train_nft_sd3.py:433-434, and ``disable_adapter()`` for the
    reference)."""
    import peft
    from diffusers import SD3Transformer2DModel

    from rewardkit.rl.sd3 import SD3Policy

    writer = peft.get_peft_model(SD3Transformer2DModel.from_pretrained(sd3_dir, subfolder="transformer"),
                                 peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian",
                                                 target_modules=["attn.to_q", "attn.to_v"]))
    _randomise_lora_b(writer)
    writer.save_pretrained(str(tmp_path / "peft_lora"))
    pol = SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16)
    pol.add_lora(32, 64.0, ["attn.to_k"], init_lora=str(tmp_path / "peft_lora"))
    cond, x, sig = pol.encode(["a cat", "a dog"]), _x(pol, seed=2), torch.full((2,), 0.6)
    with torch.no_grad():
        ref = writer(hidden_states=x, timestep=sig * 1000, encoder_hidden_states=cond.embeds,
                     pooled_projections=cond.pooled, return_dict=False)[0]
        with writer.disable_adapter():
            base = writer(hidden_states=x, timestep=sig * 1000, encoder_hidden_states=cond.embeds,
                          pooled_projections=cond.pooled, return_dict=False)[0]
        v = pol.velocity(pol.transformer, x, sig, cond)
        with pol.use_old():
            v_old = pol.velocity(pol.transformer, x, sig, cond)
        with pol.use_reference():
            v_ref = pol.velocity(pol.transformer, x, sig, cond)
    torch.testing.assert_close(v, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v_old, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v_ref, base, rtol=1e-5, atol=1e-6)
    assert float((ref - base).abs().max()) > 1e-3
    assert pol.transformer.peft_config["default"].r == 4 and all(p.requires_grad for p in pol.adapter_params("default"))
    assert not any(p.requires_grad for p in pol.adapter_params("old"))
    with pytest.raises(FileNotFoundError, match="neither"):
        SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16).add_lora(
            4, 8.0, ["attn.to_q"], init_lora=str(tmp_path))


def test_start_from_a_diffusers_lora_and_alpha_survives_saving(sd3_dir, tmp_path):
    """A LoRA in diffusers' format, written by diffusers' own ``save_lora_adapter`` (alpha 8 != rank 4, so a
    loader that lost alpha would scale it wrong); and the trainer's save_lora round trip keeps alpha too."""
    import peft
    from diffusers import SD3Transformer2DModel

    from rewardkit.rl.sd3 import SD3Policy

    tr = SD3Transformer2DModel.from_pretrained(sd3_dir, subfolder="transformer")
    tr.add_adapter(peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian",
                                   target_modules=["attn.to_q", "attn.to_out.0"]), adapter_name="default")
    _randomise_lora_b(tr, seed=3)
    tr.save_lora_adapter(str(tmp_path / "diffusers_lora"), adapter_name="default")
    pol = SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16)
    pol.add_lora(32, 64.0, ["attn.to_k"], init_lora=str(tmp_path / "diffusers_lora"))
    cond, x, sig = pol.encode(["a cat", "a dog"]), _x(pol, seed=3), torch.full((2,), 0.6)
    with torch.no_grad():
        ref = tr(hidden_states=x, timestep=sig * 1000, encoder_hidden_states=cond.embeds,
                 pooled_projections=cond.pooled, return_dict=False)[0]
        v = pol.velocity(pol.transformer, x, sig, cond)
    torch.testing.assert_close(v, ref, rtol=1e-5, atol=1e-6)
    pol.save_lora(tmp_path / "again", "default")
    pol2 = SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16)
    pol2.add_lora(32, 64.0, ["attn.to_k"], init_lora=str(tmp_path / "again"))
    # and as a user loads the trainer's LoRA for inference; bug caught: the file had no LoraConfig metadata, so
    # diffusers took alpha = rank (4) and applied the LoRA at half its trained strength (alpha 8 / rank 4)
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    pipe.load_lora_weights(str(tmp_path / "again"))
    with torch.no_grad():
        torch.testing.assert_close(pol2.velocity(pol2.transformer, x, sig, cond), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pipe.transformer(hidden_states=x, timestep=sig * 1000,
                                                    encoder_hidden_states=cond.embeds, pooled_projections=cond.pooled,
                                                    return_dict=False)[0], ref, rtol=1e-5, atol=1e-6)



def test_a_lora_that_also_adapts_the_text_encoders_is_refused(sd3_dir, tmp_path):
    """A diffusers LoRA file with text-encoder tensors too (``save_lora_weights(text_encoder_lora_layers=...)``).
    The trainer adapts the transformer only, so starting from such a file starts from another model than the
    LoRA's. Before: the text-encoder tensors were dropped without a word."""
    from safetensors.torch import load_file, save_file

    from rewardkit.rl.sd3 import SD3Policy

    pol = SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16)
    pol.add_lora(4, 8.0, ["attn.to_q"])
    pol.save_lora(tmp_path / "tr", "default")
    sd = load_file(str(tmp_path / "tr" / "pytorch_lora_weights.safetensors"))
    sd["text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight"] = torch.zeros(4, 8)
    (tmp_path / "both").mkdir()
    save_file(sd, str(tmp_path / "both" / "pytorch_lora_weights.safetensors"))
    fresh = SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16)
    with pytest.raises(ValueError, match="text_encoder.*transformer only"):
        fresh.add_lora(4, 8.0, ["attn.to_q"], init_lora=str(tmp_path / "both"))
    fresh.add_lora(4, 8.0, ["attn.to_q"], init_lora=str(tmp_path / "tr"))   # the transformer's part alone loads

def test_start_from_a_full_fine_tune(sd3_dir, tmp_path):
    """``model.transformer``: a diffusers transformer folder replaces the pipeline's; LoRA trains on top and the
    reference (adapters off) is that transformer."""
    from diffusers import SD3Transformer2DModel

    from rewardkit.rl.sd3 import SD3Policy

    tuned = SD3Transformer2DModel.from_pretrained(sd3_dir, subfolder="transformer")
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    tuned.save_pretrained(str(tmp_path / "tuned"))
    pol = SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16, transformer=str(tmp_path / "tuned"))
    pol.add_lora(4, 8.0, ["attn.to_q"])
    cond, x, sig = pol.encode(["a cat", "a dog"]), _x(pol, seed=4), torch.full((2,), 0.5)
    base = SD3Transformer2DModel.from_pretrained(sd3_dir, subfolder="transformer")
    with torch.no_grad():
        ref = tuned(hidden_states=x, timestep=sig * 1000, encoder_hidden_states=cond.embeds,
                    pooled_projections=cond.pooled, return_dict=False)[0]
        orig = base(hidden_states=x, timestep=sig * 1000, encoder_hidden_states=cond.embeds,
                    pooled_projections=cond.pooled, return_dict=False)[0]
        with pol.use_reference():
            v_ref = pol.velocity(pol.transformer, x, sig, cond)
        v = pol.velocity(pol.transformer, x, sig, cond)
    torch.testing.assert_close(v_ref, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v, ref, rtol=1e-5, atol=1e-6)         # gaussian LoRA init: a zero delta
    assert float((ref - orig).abs().max()) > 1e-4
    # a whole fine-tuned pipeline folder works too (its transformer/ subfolder)
    (tmp_path / "pipe").mkdir()
    tuned.save_pretrained(str(tmp_path / "pipe" / "transformer"))
    pol2 = SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=16, transformer=str(tmp_path / "pipe"))
    with torch.no_grad():
        torch.testing.assert_close(pol2.velocity(pol2.transformer, x, sig, cond), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_trainer_runs_with_every_sampling_option(sd3_dir, tmp_path, tiny_clip_dir):
    """One tiny epoch with DDIM rollouts, CFG 2.0 with a negative prompt, the integer timestep, started from a
    LoRA, a one_only advantage: the wiring reaches the sampler (the rollouts differ from the defaults')."""
    from rewardkit.config import _merge, build_config
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.sd3 import SD3Policy
    from rewardkit.rl.trainer import NFTTrainer

    pol = SD3Policy(sd3_dir, device=torch.device("cpu"), max_sequence_length=8)
    pol.add_lora(4, 8.0, ["attn.to_q", "attn.to_v"])
    _randomise_lora_b(pol.transformer)
    pol.save_lora(tmp_path / "init", "default")
    base = {"output_dir": str(tmp_path / "run"), "seed": 3,
            "model": {"pretrained": sd3_dir, "max_sequence_length": 8},
            "lora": {"r": 4, "alpha": 8},
            "sample": {"num_steps": 2, "resolution": 32, "batch_size": 4, "num_groups": 1, "group_size": 4},
            "train": {"batch_size": 4, "lr": 1e-3},
            "rewards": {"pickscore": 1.0}, "reward_kwargs": {"pickscore": {"model": str(tiny_clip_dir), "device": "cpu"}},
            "reward_workers": 1, "num_epochs": 1, "mixed_precision": "no", "cpu": True, "save_every": 0,
            "eval_every": 0, "progress": False, "resume": "never"}
    opts = {"model": {"init_lora": str(tmp_path / "init")}, "train": {"adv_mode": "one_only"},
            "sample": {"solver": "ddim", "guidance_scale": 2.0, "negative_prompt": "blurry", "integer_timestep": True}}
    tr = NFTTrainer(build_config(NFTConfig, _merge(base, opts)))
    plain = NFTTrainer(build_config(NFTConfig, _merge(base, {"output_dir": str(tmp_path / "plain")})))
    noise = torch.randn(tr.policy.latent_shape(2, 32), generator=torch.Generator().manual_seed(0))
    cond = tr.policy.encode(["a cat", "a dog"])
    a = tr._rollout(cond, cond, noise, torch.Generator().manual_seed(1))
    b = plain._rollout(cond, cond, noise, torch.Generator().manual_seed(1))
    assert float((a - b).abs().max()) > 1e-3
    before = [p.detach().clone() for p in tr.trainable]
    rec = tr.run_epoch()
    assert rec["global_step"] == 1 and math.isfinite(rec["total_loss"])
    assert any(not torch.equal(a, p) for a, p in zip(before, tr.trainable))


@pytest.mark.slow
def test_evaluation_has_its_own_guidance_scale(sd3_dir, tmp_path, tiny_clip_dir):
    """`sample.eval_guidance_scale` is evaluation's CFG scale (null: the rollouts' `sample.guidance_scale`, as the
    official script): the value reaches the sampler's velocity call during evaluation, and only there."""
    from rewardkit.config import build_config
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.trainer import NFTTrainer

    prompts = tmp_path / "eval.txt"
    prompts.write_text("a red cube\na blue ball\n")
    cfg = {"output_dir": str(tmp_path / "run"), "seed": 3, "model": {"pretrained": sd3_dir, "max_sequence_length": 8},
           "lora": {"r": 4, "alpha": 8},
           "sample": {"num_steps": 2, "resolution": 32, "batch_size": 2, "num_groups": 1, "group_size": 2,
                      "eval_num_steps": 2, "guidance_scale": 2.0, "eval_guidance_scale": 3.5},
           "train": {"batch_size": 2}, "rewards": {"pickscore": 1.0},
           "reward_kwargs": {"pickscore": {"model": str(tiny_clip_dir), "device": "cpu"}}, "eval_prompts": str(prompts),
           "reward_workers": 1, "num_epochs": 1, "mixed_precision": "no", "cpu": True, "save_every": 0,
           "eval_every": 1, "progress": False, "resume": "never"}
    tr = NFTTrainer(build_config(NFTConfig, cfg))
    seen = []
    real = tr.policy.sample_velocity

    def spy(*args, guidance_scale=1.0, **kw):
        seen.append(guidance_scale)
        return real(*args, guidance_scale=guidance_scale, **kw)

    tr.policy.sample_velocity = spy
    (tmp_path / "run").mkdir()
    tr.evaluate()
    assert seen and set(seen) == {3.5}
    seen.clear()
    noise = torch.randn(tr.policy.latent_shape(1, 32), generator=torch.Generator().manual_seed(0))
    cond = tr.policy.encode(["a cat"])
    tr._rollout(cond, cond, noise, torch.Generator().manual_seed(1))
    assert set(seen) == {2.0}
    for bad in ("x", float("inf")):
        with pytest.raises(ValueError, match="eval_guidance_scale"):
            build_config(NFTConfig, {**cfg, "sample": {**cfg["sample"], "eval_guidance_scale": bad}}).validate()


@pytest.mark.slow
def test_evaluation_with_an_sde_solver_is_the_same_whatever_the_batch_size(sd3_dir, tmp_path, tiny_clip_dir):
    """Evaluation draws each prompt's starting noise and an SDE solver's step noise from that prompt's own
    generators: batch sizes 1 and 3 (the same split as one process vs three) give the same images and means."""
    from rewardkit.config import build_config
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.evaluation import evaluate
    from rewardkit.rl.trainer import NFTTrainer

    prompts = tmp_path / "eval.txt"
    prompts.write_text("a red cube\na blue ball\na green cone\n")
    cfg = {"output_dir": str(tmp_path / "run"), "seed": 3,
           "model": {"pretrained": sd3_dir, "max_sequence_length": 8}, "lora": {"r": 4, "alpha": 8},
           "sample": {"num_steps": 2, "resolution": 32, "batch_size": 3, "num_groups": 1, "group_size": 3,
                      "eval_num_steps": 3, "eval_solver": "flow_sde", "eta": 0.9},
           "train": {"batch_size": 3}, "rewards": {"pickscore": 1.0},
           "reward_kwargs": {"pickscore": {"model": str(tiny_clip_dir), "device": "cpu"}},
           "eval_prompts": str(prompts), "eval_grid": 3, "reward_workers": 1, "num_epochs": 1,
           "mixed_precision": "no", "cpu": True, "save_every": 0, "eval_every": 1, "progress": False,
           "resume": "never"}
    tr = NFTTrainer(build_config(NFTConfig, cfg))
    out = []
    for bs in (1, 3):  # evaluation reads sample.batch_size when it runs
        tr.cfg.sample.batch_size = bs
        out.append(evaluate(tr))
    (m1, g1, _), (m3, g3, _) = out
    torch.testing.assert_close(g1, g3, rtol=0, atol=1e-6)
    assert m1.keys() == m3.keys() and all(m1[k] == pytest.approx(m3[k], rel=1e-5) for k in m1)
    assert float(g1.std()) > 0
