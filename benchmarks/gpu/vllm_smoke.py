"""vLLM judge smoke test for the first GPU run: one GPU, a tiny Qwen2.5-VL checkpoint from rewardkit.testing,
well under 5 minutes. Prints one line per check and exits non-zero when one fails.

    python benchmarks/gpu/vllm_smoke.py              # on a GPU machine with `pip install rewardkit-vision[vllm]`
    python benchmarks/gpu/vllm_smoke.py --dry-run    # CPU: transformers stands in for vLLM (what CI runs)

Checks: (1) label probabilities of the vLLM judge equal the transformers judge's within --tol, on image and
text-only conversations; (2) they do not depend on the order of the batch; (3) seeded sampling is
reproducible and diverse; (4) greedy n > 1 works and its token ids equal transformers' greedy token ids
(ids, not text: vLLM's incremental detokeniser does not always flush tiny tokenizers identically);
(5) prefix caching is on.

In ``--dry-run`` the engine is a stand-in that runs the tiny model with transformers behind vLLM's
``LLM.generate`` interface, with vLLM's ``SamplingParams`` rules enforced (tests/vllm_standin.py): it checks
this script and rewardkit's glue, not vLLM.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from types import SimpleNamespace as NS

ROOT = Path(__file__).resolve().parents[2]


class TransformersAsVLLM:
    """The tiny model on transformers behind ``vllm.LLM``'s ``generate`` interface (dry runs only)."""

    def __init__(self, model_dir: str, **engine_kwargs):
        from rewardkit.models.vlm import load_vlm

        self.model, self.processor = load_vlm(model_dir, device="cpu")
        self.engine_kwargs = engine_kwargs
        self.enable_prefix_caching = bool(engine_kwargs.get("enable_prefix_caching"))

    def get_tokenizer(self):
        return self.processor.tokenizer

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None):
        import torch

        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        add_special = (tokenization_kwargs or {}).get("add_special_tokens", True)
        outs = []
        for p, sp in zip(prompts, params):
            sp.validate_logprobs(len(self.processor.tokenizer), self.max_logprobs)
            validate_prompt(p, self.limits)
            ims = (p.get("multi_modal_data") or {}).get("image") or None
            inputs = self.processor(text=[p["prompt"]], images=ims, return_tensors="pt",
                                    add_special_tokens=add_special)
            if sp.max_tokens == 1 and sp.logprob_token_ids:
                with torch.no_grad():
                    lp = torch.log_softmax(self.model(**inputs).logits[0, -1].double(), -1)
                top = int(lp.argmax())
                table = {t: NS(logprob=float(lp[t])) for t in [top, *sp.logprob_token_ids]}
                outs.append(NS(outputs=[NS(text="", token_ids=[top], logprobs=[table])]))
                continue
            n_in = inputs["input_ids"].shape[1]
            res = []
            for k in range(sp.n):
                with torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed((sp.seed or 0) * 1000 + k)
                    greedy = sp.temperature < 1e-5
                    ids = self.model.generate(**inputs, max_new_tokens=sp.max_tokens, do_sample=not greedy,
                                              temperature=None if greedy else sp.temperature, top_p=None,
                                              top_k=None)[0, n_in:].tolist()
                res.append(NS(text=self.processor.tokenizer.decode(ids, skip_special_tokens=True), token_ids=ids,
                              logprobs=None))
            outs.append(NS(outputs=res))
        return outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU: transformers stands in for vLLM")
    ap.add_argument("--tol", type=float, default=2e-3, help="label-probability tolerance vs transformers")
    args = ap.parse_args()
    t_start = time.time()

    import torch

    from rewardkit.judges import load_judge
    from rewardkit.testing import random_images, save_tiny_checkpoint

    workdir = tempfile.mkdtemp(prefix="rk-vllm-smoke-")
    model_dir = str(save_tiny_checkpoint("qwen2_5_vl", os.path.join(workdir, "tiny-qwen2_5_vl")))
    if args.dry_run:
        sys.path.insert(0, str(ROOT / "tests"))
        from vllm_standin import StrictSamplingParams

        stub = types.ModuleType("vllm")
        stub.SamplingParams = StrictSamplingParams
        stub.LLM = lambda model, **kw: TransformersAsVLLM(model, **kw)
        sys.modules["vllm"] = stub
        engine_kw = {}
    else:
        if not torch.cuda.is_available():
            print("FAIL setup: no CUDA device (use --dry-run on CPU)")
            return 2
        engine_kw = dict(gpu_memory_utilization=0.2, max_model_len=2048, enforce_eager=True, dtype="fp32", seed=0)

    vjudge = load_judge(f"vllm:{model_dir}", **engine_kw)
    tjudge = load_judge(f"transformers:{model_dir}", device="cpu")
    print(f"setup: vllm judge on {'transformers stand-in (dry run)' if args.dry_run else 'vLLM'}; "
          f"{time.time() - t_start:.1f} s")

    ims = random_images(3, sizes=[(56, 56), (40, 64), (64, 32)], seed=3)

    def conv(images, q):
        return [{"role": "user", "content": [*({"type": "image", "image": i} for i in images),
                                             {"type": "text", "text": q}]}]

    convs = [conv(ims[:2], "Is there a cat? Yes or No."), conv(ims[2:], "Yes or No?"),
             [{"role": "user", "content": "Is the sky green? Yes or No."}], conv(ims[:1], "Dog?")]
    failures = 0

    def report(name: str, ok: bool, detail: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")

    p = vjudge.choice_probs(convs, ["Yes", "No"])
    ref = tjudge.choice_probs(convs, ["Yes", "No"])
    diff = float((p - ref).abs().max()) if not torch.isnan(p).any() else float("nan")
    report("label-probs", diff <= args.tol, f"max |vllm - transformers| = {diff:.2e} over {len(convs)} "
           f"conversations (3 with images, 1 text-only); tol {args.tol:g}")

    rev = vjudge.choice_probs(convs[::-1], ["Yes", "No"]).flip(0)
    d2 = float((rev - p).abs().max())
    report("order-independence", d2 <= 1e-4, f"max change when the batch is reversed = {d2:.2e}")

    a = vjudge.generate(convs[:2], n=4, temperature=1.0, max_new_tokens=8, seed=7)
    b = vjudge.generate(convs[:2], n=4, temperature=1.0, max_new_tokens=8, seed=7)
    c = vjudge.generate(convs[1:2], n=4, temperature=1.0, max_new_tokens=8, seed=7)
    distinct = len(set(a[0]))
    report("seeded-sampling", a == b and c[0] == a[1] and distinct >= 2,
           f"same seed same samples: {a == b}; independent of batch: {c[0] == a[1]}; "
           f"{distinct} distinct of 4")

    greedy = vjudge.generate(convs[:2], n=3, temperature=0.0, max_new_tokens=6)
    outs = vjudge.llm.generate([pr for pr, _ in vjudge._prompts(convs[:2])],
                               vjudge._sampling(n=1, temperature=0.0, max_tokens=6),
                               use_tqdm=False, tokenization_kwargs={"add_special_tokens": False})
    vids = [list(o.outputs[0].token_ids) for o in outs]
    tids = []
    for cv in convs[:2]:
        from rewardkit.judges.transformers_backend import conversation_images

        inputs = tjudge.processor(text=[tjudge._render(cv)], images=conversation_images(cv) or None,
                                  return_tensors="pt")
        with torch.no_grad():
            gen = tjudge.model.generate(**inputs, max_new_tokens=6, do_sample=False)
        tids.append(gen[0, inputs["input_ids"].shape[1]:].tolist())
    report("greedy-n>1", all(len(g) == 3 and len(set(g)) == 1 for g in greedy) and vids == tids,
           f"3 identical answers per conversation; token ids equal transformers: {vids == tids}")

    if args.dry_run:
        on = vjudge.llm.enable_prefix_caching
    else:
        engine = vjudge.llm.llm_engine
        cfg = getattr(engine, "vllm_config", None) or getattr(engine, "cache_config", None)
        on = bool(getattr(getattr(cfg, "cache_config", cfg), "enable_prefix_caching", False))
    report("prefix-caching", on, f"enable_prefix_caching = {on}")
    print(f"{'all checks passed' if not failures else f'{failures} check(s) failed'} in {time.time() - t_start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
