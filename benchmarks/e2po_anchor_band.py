"""Where E²PO's achieved anchor cosine lands with the seed paper's weights, and which knob holds the band.

Random CLIP text towers (``CLIPTextModelWithProjection``, widths 64 and 256), K = 12, T_emb = 300, three prompts,
the paper's defaults and single-knob variations. Prints one JSON line per run: final mean / min anchor cosine,
mean pairwise cosine, and the trajectory every 100 steps.

    python benchmarks/e2po_anchor_band.py
"""

from __future__ import annotations

import json

import torch


def main() -> None:
    import transformers

    from rewardkit.rl.exploration import E2POConfig, anchor_band, content_token_mask, optimize_perturbations
    from rewardkit.testing import build_tiny_tokenizer

    torch.set_num_threads(1)
    tok = build_tiny_tokenizer(300, clip_style=True, extra_tokens=())
    tok.model_max_length = 77
    print(json.dumps({"warning_band": anchor_band(E2POConfig())}))
    for width, layers in ((64, 2), (256, 4)):
        cfg = transformers.CLIPTextConfig(vocab_size=len(tok), hidden_size=width, intermediate_size=4 * width,
                                          num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=77,
                                          projection_dim=width, bos_token_id=tok.bos_token_id,
                                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        enc = transformers.CLIPTextModelWithProjection(cfg).eval().requires_grad_(False)
        ids = tok(["a photo of a cat", "a red car and a blue bicycle", "three birds on a branch"],
                  padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        mask = content_token_mask(ids, tok.eos_token_id, tok.bos_token_id)
        for over in ({}, {"lambda_div": 5.0}, {"lambda_div": 1.0}, {"delta_max": 0.5}):
            e = E2POConfig(enabled=True, num_variants=12, **over)
            res = optimize_perturbations(enc, ids, mask, e, generator=torch.Generator().manual_seed(0),
                                         eos_token_id=tok.eos_token_id, log_every=100)
            print(json.dumps({"width": width, "layers": layers, **over,
                              "anchor_mean": round(float(res.anchor_sim.mean()), 4),
                              "anchor_min": round(float(res.anchor_sim.min()), 4),
                              "pairwise": round(float(res.pairwise_sim.mean()), 4),
                              "trajectory": [(h["step"], round(h["anchor_sim"], 3), round(h["pairwise_sim"], 3))
                                             for h in res.history]}), flush=True)


if __name__ == "__main__":
    main()
