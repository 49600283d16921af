"""More examples of the RL page (api/rl.md): loaded by scripts/api_examples.py."""

EXAMPLES = [(
    "DiffusionNFT's advantages, optimality probability and updates, by hand",
    '''\
import torch
from rewardkit.rl.nft import (ema_update_, group_advantages, nft_loss, optimality_probability, soft_update_,
                              zero_std_group_ratio)
from rewardkit.rl.schedule import num_train_timesteps, old_policy_decay, train_timestep_indices

rewards = torch.tensor([1.0, 3.0, 2.0, 2.0])
groups = torch.tensor([0, 0, 1, 1])                  # two prompts, two images each
adv = group_advantages(rewards, groups, global_std=False)
print([round(a, 3) for a in adv.tolist()])           # (R - group mean) / (group std + 1e-4): +-1, and 0 for a tie
print(zero_std_group_ratio(rewards, groups))         # group 1 carries no signal
print(optimality_probability(torch.tensor([-10.0, -2.5, 0.0, 5.0]), clip_max=5.0).tolist())  # clip(A)/c/2 + 1/2
old, new = [torch.zeros(2)], [torch.ones(2)]
soft_update_(old, new, decay=0.75)                   # old <- 0.75 old + 0.25 new
print(old[0].tolist())
decay = ema_update_(old, new, step=0)               # decay min((1 + step) / (10 + step), 0.9) = 0.1
print(round(decay, 4), [round(v, 4) for v in old[0].tolist()])    # 0.1 * 0.25 + 0.9 * 1
print(num_train_timesteps(10, 0.99), old_policy_decay(0), old_policy_decay(1000))
idx = train_timestep_indices(2, 10, 3, generator=torch.Generator().manual_seed(0))
print(idx.shape, bool((idx < 10).all()), [len(set(row)) for row in idx.tolist()])  # distinct steps per sample
v = torch.zeros(2, 4, 8, 8)
loss, stats = nft_loss(v, v, None, v, v, torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0]))
print(loss.shape, bool(torch.isfinite(loss)), sorted(stats)[:3])
''',
    '''\
[-1.0, 1.0, 0.0, 0.0]
0.5
[0.0, 0.25, 0.5, 1.0]
[0.25, 0.25]
0.1 [0.925, 0.925]
9 0.0 0.5
torch.Size([2, 3]) True [3, 3]
torch.Size([]) True ['kl', 'old_deviation', 'policy_loss']
'''), (
    "The samplers end at the data point their velocity field leads to",
    '''\
import torch
from rewardkit.rl.schedule import flow_sigmas
from rewardkit.rl.solvers import ddim, dpm2, euler_ode, flow_sde, sample

x0 = torch.full((1, 1, 2, 2), 0.5)                  # the whole data distribution: one point
def velocity(x, sigma, step):                       # x = (1 - s) x0 + s eps  =>  v = eps - x0 = (x - x0) / s
    return (x - x0) / sigma

noise = torch.randn(1, 1, 2, 2, generator=torch.Generator().manual_seed(0))
sigmas = flow_sigmas(8, shift=3.0)
for name, x in [("euler", euler_ode(velocity, noise, sigmas)), ("dpm2", dpm2(velocity, noise, sigmas)),
                ("ddim", ddim(velocity, noise, sigmas)), ("sample", sample("euler", velocity, noise, sigmas))]:
    print(name, torch.allclose(x, x0, atol=1e-5))    # the deterministic ones land on x0
x = flow_sde(velocity, noise, sigmas, eta=0.7, generator=torch.Generator().manual_seed(1))  # stochastic (Flow-GRPO)
print("flow_sde", x.shape, bool(torch.isfinite(x).all()))
''',
    '''\
euler True
dpm2 True
ddim True
sample True
flow_sde torch.Size([1, 1, 2, 2]) True
'''), (
    "E²PO's exploration terms, by hand",
    '''\
import torch
from rewardkit.rl.exploration import (E2POConfig, anchor_band, anchor_loss, anchor_similarity, check_anchor_band,
                                      content_token_mask, diversity_loss, noise_aware_condition, noise_aware_gamma)

print([round(g, 2) for g in noise_aware_gamma(torch.tensor([1.0, 0.8, 0.6, 0.2]), rho=0.4).tolist()])
c = noise_aware_condition(torch.zeros(2), torch.ones(2), sigma=0.8, rho=0.4)   # gamma(0.8) = 0.5
print(c.tolist())
anchor = torch.tensor([1.0, 0.0])
variants = torch.tensor([[1.0, 0.0], [0.0, 1.0]])   # cos 1 and cos 0 to the anchor
print(anchor_similarity(variants, anchor).tolist())
print(round(anchor_loss(variants, anchor, mu=0.8, eps=0.01).item(), 4))        # (0.2 - 0.01) + (0.8 - 0.01)
print(diversity_loss(variants).item(), round(diversity_loss(torch.ones(2, 2)).item(), 4))  # mean pairwise cosine
ids = torch.tensor([[49406, 320, 1929, 49407, 49407]])                            # BOS a cat EOS pad
print(content_token_mask(ids, eos_token_id=49407, bos_token_id=49406).tolist())
cfg = E2POConfig()
print([round(b, 4) for b in anchor_band(cfg)], check_anchor_band(0.8, cfg))   # mu -+ (eps + warn_band)
''',
    '''\
[1.0, 0.5, 0.0, 0.0]
[0.5, 0.5]
[1.0, 0.0]
0.98
0.0 1.0
[[False, True, True, False, False]]
[0.69, 0.91] True
'''), (
    "The bundled trainer's configuration",
    '''\
from rewardkit.rl.config import LoraArgs, ModelArgs, SampleArgs, TrainArgs, preset

print(ModelArgs().pretrained, SampleArgs().solver, SampleArgs().num_steps, LoraArgs().r, TrainArgs().beta)
print(sorted(preset("pickscore"))[:4])            # a mapping for rewardkit.config.build_config
''',
    '''\
stabilityai/stable-diffusion-3.5-medium dpm2 10 32 1.0
['reward_kwargs', 'rewards']
'''), (
    "A DiffusionNFT run on a tiny SD3 pipeline",
    '''\
# needs about a minute of CPU (55 s measured) and the rl extra: too slow for the suite, whose tests run this recipe
# (tests/rl/test_trainer.py; the same as `rewardkit rl nft --config recipes/nft/tiny.yaml`, docs/rl.md)
import tempfile

from rewardkit.rl.trainer import NFTTrainer, train_nft   # train_nft builds an NFTTrainer, trains, closes it

summary = train_nft("recipes/nft/tiny.yaml", output_dir=tempfile.mkdtemp(), num_epochs=1, eval_every=0,
                    save_every=0, report_to=["none"])
print(summary["epoch"], summary["global_step"], sorted(summary))
''',
    ""),
]

EXAMPLES += [(
    "E²PO on a tiny CLIP text encoder: K perturbed conditions per prompt",
    '''\
import torch
from rewardkit.rl.exploration import (E2POConfig, Perturbations, embedding_offset, optimize_perturbations,
                                      optimize_perturbations_loop, pooled_embeddings)
from rewardkit.testing import tiny_clip

model, processor = tiny_clip()
encoder = model.text_model                                  # any CLIP text model (SD3's clip_l / clip_g)
batch = processor.tokenizer(["a red cube", "two cats"], padding="max_length", max_length=16, truncation=True,
                            return_tensors="pt")
ids, mask = batch["input_ids"], batch["attention_mask"]
base = pooled_embeddings(model.text_model, ids)
offset = torch.zeros(2, 16, encoder.config.hidden_size)
offset[:, 1] = 0.5                                          # move the first content token's embedding
with embedding_offset(encoder, offset):
    moved = encoder(input_ids=ids).pooler_output
print(base.shape, not torch.allclose(moved, encoder(input_ids=ids).pooler_output))
cfg = E2POConfig(enabled=True, num_variants=3, steps=5, lr=1e-2)
out = optimize_perturbations(encoder, ids, mask, cfg, generator=torch.Generator().manual_seed(0))
print(isinstance(out, Perturbations), tuple(out.delta.shape), tuple(out.anchor_sim.shape))  # [P, K - 1, ...]
one = optimize_perturbations_loop(encoder, ids[:1], mask[:1], cfg, generator=torch.Generator().manual_seed(0))
print(tuple(one.delta.shape), bool(torch.isfinite(one.delta).all()))   # the paper's pseudocode, prompt by prompt
''',
    '''\
torch.Size([2, 32]) True
True (2, 2, 16, 32) (2, 2)
(1, 2, 16, 32) True
'''),
]
