"""EVR judge workload: naive one-request-per-question vs rewardkit's transformers judge backend.

    python benchmarks/judge_efficiency.py                 # tiny Qwen2.5-VL, K=4, 5 dimensions, batch 8
    python benchmarks/judge_efficiency.py --model qwen3_vl --size small

Workload (the EVR paper's): B candidate edits sharing N=2 reference images; per candidate, 5 dimensions x K
hypotheses generated greedily (``max_new_tokens`` each), then one Yes/No verification question per
hypothesis. The prompts are EVR's own (``EVR._eval_conv`` / ``EVR._verify_conv`` from the versioned
template). A randomly initialised model never answers in the "Reason/Score" format, so the verification
claims are the raw hypotheses (EVR itself would mark them unparseable and skip verification). Greedy
hypotheses of one dimension are one text: the naive loop still sends its K requests, rewardkit decodes the
conversation once (EVR's default temperature 0.7 samples K different texts and gets no such shortcut). The
verification claims are made distinct (the k-th at score k + 1, ``--claims distinct``, the default) so that
rewardkit's answer-each-repeat-once shortcut does not apply there; ``--claims repeated`` shows it.

- naive: for every question, ``processor(text, images)`` then ``model.generate`` / ``model(...)``: the vision
  tower and the whole prompt run once per question.
- rewardkit: ``TransformersJudge.generate(n=K)`` and ``choice_probs`` inside one ``session()``: each distinct
  image through the vision tower once, each shared prefix prefilled once and its KV cache forked, the
  candidates' common stem (system message + reference images) prefilled once for all of them; the
  verification phase reuses the evaluation phase's prefix KV (system + images + context, EVR template v3).

Timing: the naive loop is warmed up on one candidate's questions (it then repeats the same shapes for every
candidate); rewardkit is warmed up by one untimed full run (its few large batched calls all have new
shapes). Then ``--rounds`` rounds each time the naive loop and rewardkit back to back (interleaved, so both
see the same machine load); each round's wall-time ratio is printed with their median, the wall time of
each phase (evaluation = the K hypotheses per dimension, verification = the Yes/No questions) and the
machine's load average. Both run on the same model, prompts and token budgets.
The header prints torch's thread count (``--threads``; default torch's own, 2 on the 2-core development
machine): the naive loop is mostly per-call Python and barely uses a second thread, rewardkit's few large
forwards do, so the ratio at one thread is lower (see benchmarks/README.md).

Checks that both produce identical greedy hypotheses and Yes/No probabilities (max abs diff printed), then
prints one line per figure: ``<figure>: naive X, rewardkit Y, ratio``. ``--profile N`` adds the top N functions
of one more rewardkit run under cProfile (where its own time goes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rewardkit.judges.transformers_backend import TransformersJudge, conversation_images  # noqa: E402
from rewardkit.rewards.evr import DIMENSIONS, EVR  # noqa: E402
from rewardkit.testing import random_images, tiny_qwen2_5_vl, tiny_qwen3_vl  # noqa: E402

SIZES = {"tiny": dict(hidden_size=32, num_layers=1), "small": dict(hidden_size=256, num_layers=4)}


class VisionCounter:
    """Counts images (not calls) passing through the vision tower, via a forward pre-hook."""

    def __init__(self, model):
        self.n = 0
        self.h = model.model.visual.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        self.n += int(grid.shape[0])

    def reset(self):
        self.n = 0


def build_workload(evr: EVR, cands, refs, instruction, k):
    evals = [evr._eval_conv(instruction, refs, c, {}, d) for c in cands for d in DIMENSIONS]
    return evals


def verify_convs(evr: EVR, cands, refs, instruction, hyps, k, claims="distinct"):
    """One Yes/No question per hypothesis. Greedy hypotheses of one dimension are one text, so with
    ``claims="repeated"`` (every claim at score 3) K - 1 of every K questions repeat one another and rewardkit
    answers each repeat once. EVR samples its K hypotheses (temperature 0.7), which differ: ``"distinct"`` (the
    default; K <= 5, the length of EVR's scale) gives the k-th claim the score k + 1, so no two questions are the
    same and that shortcut does not apply: the workload the paper runs."""
    D = len(DIMENSIONS)
    out = []
    for c_i, c in enumerate(cands):
        for d_i, d in enumerate(DIMENSIONS):
            for k_i, text in enumerate(hyps[c_i * D + d_i]):
                score = 3.0 if claims == "repeated" else float(k_i + 1)
                out.append(evr._verify_conv(instruction, refs, c, {}, d, score, text.strip() or "(empty)"))
    return out


def naive(model, proc, evals, k, max_new_tokens, verify_fn, yes_no, phases=None):
    prefill = 0
    hyps = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for conv in evals:
            texts = []
            for _ in range(k):  # K independent requests, as in the paper
                text = proc.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
                inp = proc(text=[text], images=conversation_images(conv), return_tensors="pt")
                prefill += inp["input_ids"].shape[1]
                g = model.generate(**inp, max_new_tokens=max_new_tokens, do_sample=False)
                texts.append(proc.tokenizer.decode(g[0, inp["input_ids"].shape[1]:], skip_special_tokens=True))
            hyps.append(texts)
        if phases is not None:
            phases["evaluation"] = time.perf_counter() - t0
            phases["evaluation_prefill"] = prefill
        t1 = time.perf_counter()
        probs = []
        for conv in verify_fn(hyps):
            text = proc.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            inp = proc(text=[text], images=conversation_images(conv), return_tensors="pt")
            prefill += inp["input_ids"].shape[1]
            logits = model(**inp).logits[0, -1].float()
            probs.append(torch.softmax(logits[yes_no], -1))
    if phases is not None:
        phases["verification"] = time.perf_counter() - t1
        phases["verification_prefill"] = prefill - phases["evaluation_prefill"]
    return hyps, torch.stack(probs), prefill


def stem_ab(judge, evals, verify_fn, args, want) -> None:
    """rewardkit with and without the candidates' shared stem (``TransformersJudge._shared_stem``), interleaved
    rounds in this process; the answers must not change."""
    cls = type(judge)
    own = cls._shared_stem
    times: dict[str, list[float]] = {"with": [], "without": []}
    prefill: dict[str, int] = {}
    try:
        for _ in range(max(1, args.rounds)):
            for name in ("with", "without"):
                cls._shared_stem = own if name == "with" else (lambda self, *args: None)
                judge.stats.clear()
                t = time.perf_counter()
                with torch.inference_mode(), judge.session():
                    hyps = judge.generate(evals, n=args.k, temperature=0.0, max_new_tokens=args.max_new_tokens)
                    probs = judge.choice_probs(verify_fn(hyps), ["Yes", "No"])
                times[name].append(time.perf_counter() - t)
                if hyps != want[0] or not torch.allclose(probs, want[1], atol=1e-5):
                    print(f"MISMATCH: rewardkit {name} the shared stem", file=sys.stderr)
                    sys.exit(1)
                prefill[name] = judge.stats["prefill_tokens"]
    finally:
        cls._shared_stem = own
    w, wo = statistics.median(times["with"]), statistics.median(times["without"])
    print(f"shared stem (median of {len(times['with'])} interleaved rounds): rewardkit {w:.3f} s with, {wo:.3f} s "
          f"without, {wo / w:.2f}x; prefill tokens {prefill['with']} vs {prefill['without']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["qwen2_5_vl", "qwen3_vl"], default="qwen2_5_vl")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved naive / rewardkit rounds (median ratio)")
    ap.add_argument("--claims", choices=["distinct", "repeated"], default="distinct",
                    help="verification claims: distinct per hypothesis (default; as EVR's sampled hypotheses are) "
                         "or repeated (greedy hypotheses at one score: rewardkit answers each repeat once)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads for both sides (0: torch's default, what the recorded figures use)")
    ap.add_argument("--ref-size", type=int, default=0, metavar="PX",
                    help="reference images of PX x PX and PX x 3PX/4 with the processor's pixel budget raised to "
                         "PX^2 (default: the tiny 56 / 40 px references): where the shared stem matters")
    ap.add_argument("--stem-ab", action="store_true",
                    help="also time rewardkit with and without the candidates' shared stem, interleaved")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the rounds, profile one more rewardkit run (cProfile) and print its top N functions")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.claims == "distinct" and args.k > 5:
        ap.error("--claims distinct gives the k-th claim the score k + 1 on EVR's 1-5 scale: --k 5 at most "
                 "(or --claims repeated)")
    torch.manual_seed(0)
    builder = tiny_qwen2_5_vl if args.model == "qwen2_5_vl" else tiny_qwen3_vl
    model, proc = builder(**SIZES[args.size])
    if args.ref_size:
        from rewardkit.models.preference import set_pixel_budget

        set_pixel_budget(proc, None, args.ref_size * args.ref_size)
    judge = TransformersJudge(model, proc)
    evr = EVR(judge=judge, k=args.k, temperature=0.0, max_new_tokens=args.max_new_tokens)
    cands = random_images(args.batch, sizes=[(56, 56), (48, 56), (56, 40)], seed=1)
    px = args.ref_size
    refs = random_images(2, sizes=[(px, px), (px, 3 * px // 4)] if px else [(56, 56), (40, 40)], seed=2)
    instruction = "Place the object from reference image 1 on the table in reference image 2."
    evals = build_workload(evr, cands, refs, instruction, args.k)
    yes_no = judge.choice_token_ids(["Yes", "No"])
    counter = VisionCounter(model)

    def verify_fn(hyps):
        return verify_convs(evr, cands, refs, instruction, hyps, args.k, args.claims)

    # warm-up of both paths (allocator, kernels) on one candidate's questions, then measure
    D = len(DIMENSIONS)
    naive(model, proc, evals[:D], 1, 2, lambda h: verify_fn(h + [[]] * (len(evals) - D))[:D], yes_no)
    # rewardkit runs the whole workload in a few large batched calls whose shapes are all new on the first
    # call (CPU kernels are selected per shape), while the naive loop repeats one candidate's shapes 8 times
    # and warms itself up: so rewardkit's warm-up is one untimed full run.
    with torch.inference_mode(), judge.session():
        h = judge.generate(evals, n=args.k, max_new_tokens=args.max_new_tokens)
        judge.choice_probs(verify_fn(h), ["Yes", "No"])
    load_before = os.getloadavg()
    naive_t, rk_t, naive_ph, rk_ph = [], [], [], []
    for _ in range(max(1, args.rounds)):
        counter.reset()
        ph: dict = {}
        t = time.perf_counter()
        n_hyps, n_probs, n_prefill = naive(model, proc, evals, args.k, args.max_new_tokens, verify_fn, yes_no, ph)
        naive_t.append(time.perf_counter() - t)
        naive_ph.append(ph)
        n_images = counter.n

        counter.reset()
        judge.stats.clear()
        t = time.perf_counter()
        with torch.inference_mode(), judge.session():
            r_hyps = judge.generate(evals, n=args.k, temperature=0.0, max_new_tokens=args.max_new_tokens)
            t_eval, pre_eval = time.perf_counter() - t, judge.stats["prefill_tokens"]
            t1 = time.perf_counter()
            r_probs = judge.choice_probs(verify_fn(r_hyps), ["Yes", "No"])
            t_ver = time.perf_counter() - t1
        rk_t.append(time.perf_counter() - t)
        rk_ph.append({"evaluation": t_eval, "verification": t_ver, "evaluation_prefill": pre_eval,
                      "verification_prefill": judge.stats["prefill_tokens"] - pre_eval})
        rk = (r_hyps, r_probs, counter.n, judge.stats["prefill_tokens"], judge.stats["prefix_reused_tokens"],
              judge.stats["prefix_hits"])
    load_after = os.getloadavg()
    r_hyps, r_probs, r_images, r_prefill, r_reused, r_hits = rk
    counter.h.remove()

    same = sum(a == b for x, y in zip(n_hyps, r_hyps) for a, b in zip(x, y))
    total = sum(len(x) for x in n_hyps)
    diff = (n_probs - r_probs).abs().max().item() if r_probs.shape == n_probs.shape else float("nan")
    cfg = model.config.text_config
    print(f"judge efficiency: {args.model} {args.size} (hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={args.batch}, N=2 references, "
          f"{len(DIMENSIONS)} dimensions x K={args.k}, {args.max_new_tokens} new tokens, "
          f"{len(n_probs)} verification questions ({args.claims} claims)")
    print(f"identical greedy hypotheses: {same}/{total}; Yes/No probabilities max abs diff {diff:.2e}")
    print(f"vision-encoder images: naive {n_images}, rewardkit {r_images}, {n_images / max(r_images, 1):.1f}x")
    print(f"prefill tokens: naive {n_prefill}, rewardkit {r_prefill}, {n_prefill / max(r_prefill, 1):.1f}x")
    print(f"prefix KV reused (the candidates' shared stem, and across the evaluation and verification phases): "
          f"{r_reused} tokens, {r_hits} exact prefix hits")
    ratios = [a / b for a, b in zip(naive_t, rk_t)]
    med = statistics.median

    def phase(name: str, rows: list[dict]) -> str:
        return f"{med(x[name] for x in rows):.2f} s ({med(x[name + '_prefill'] for x in rows):.0f} prefill tokens)"

    for name in ("evaluation", "verification"):
        print(f"{name} phase (median): naive {phase(name, naive_ph)}, rewardkit {phase(name, rk_ph)}, "
              f"{med(x[name] for x in naive_ph) / med(x[name] for x in rk_ph):.1f}x")
    print(f"wall time per round: naive {', '.join(f'{x:.2f}' for x in naive_t)} s; rewardkit "
          f"{', '.join(f'{x:.3f}' for x in rk_t)} s; ratios {', '.join(f'{r:.1f}x' for r in ratios)}")
    print(f"wall time (median of {len(ratios)} interleaved rounds): naive {med(naive_t):.2f} s, rewardkit "
          f"{med(rk_t):.3f} s, median ratio {med(ratios):.1f}x; load average {load_before[0]:.1f} -> "
          f"{load_after[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    if args.stem_ab:
        stem_ab(judge, evals, verify_fn, args, (r_hyps, r_probs))
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        with torch.inference_mode(), judge.session():
            prof.enable()
            judge.choice_probs(verify_fn(judge.generate(evals, n=args.k, max_new_tokens=args.max_new_tokens)),
                               ["Yes", "No"])
            prof.disable()
        print(f"rewardkit, one run under cProfile (top {args.profile} by own time):")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)
    if same != total or not diff < 1e-3:
        print("MISMATCH between naive and rewardkit answers", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
