"""vLLM judge smoke test for the first GPU run: one GPU, a tiny Qwen2.5-VL checkpoint from rewardkit.testing,
under 5 minutes. Prints one line per check (PASS / FAIL / SKIP) and exits non-zero when one fails.

    python benchmarks/gpu/vllm_smoke.py              # on a GPU machine with `pip install rewardkit-vision[vllm]`
    python benchmarks/gpu/vllm_smoke.py --dry-run    # CPU: transformers stands in for vLLM (what CI runs)

The checkpoint is ``rewardkit.testing.save_tiny_vllm_checkpoint``: head size 64 in both towers and float16
weights, so every vLLM attention backend accepts it (FlashAttention / FlashInfer need fp16 or bf16, Triton a
head size >= 32; the CPU fixtures' fp32 head-size-16 model left only FlexAttention), with a complete processor
config (vLLM loads the processor instead of building one).

Checks: (1) ``label-probs``: the vLLM judge's label probabilities equal the transformers judge's (float32 on
the CPU, same float16 weights) within --tol, on image and text-only conversations; (2) ``order-independence``;
(3) ``seeded-sampling``: reproducible, independent of the batch, diverse; (4) ``greedy-n>1``: greedy ``n > 1``
works and its token ids equal transformers' greedy ids (ids, not text: vLLM's incremental detokeniser does not
always flush tiny tokenizers identically; a divergence is accepted only at a near-tie of transformers' top-2
logits, below --tie); (5) ``prefix-cache-hit``: the same prompt sent again reports cached prompt tokens
(``RequestOutput.num_cached_tokens``); (6) ``serve``: ``vllm serve`` on the same checkpoint starts, the OpenAI
backend scores through it (label probabilities equal the offline engine's within --tol, greedy ``n > 1``), and
it stops; (7) ``cpu-tests``: the vLLM backend's CPU tests (its stand-ins) pass with vLLM installed.

In ``--dry-run`` the engine is a stand-in that runs the tiny model with transformers behind vLLM's
``LLM.generate`` interface, with vLLM's rules enforced (tests/helpers/vllm_standin.py), and ``vllm serve`` is this
script's ``--fake-serve`` (the same stand-in behind an OpenAI-compatible HTTP server): it checks this script
and rewardkit's glue, not vLLM.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from types import SimpleNamespace as NS

ROOT = Path(__file__).resolve().parents[2]

#: the checks, in the order they are printed
CHECKS = ("label-probs", "order-independence", "seeded-sampling", "greedy-n>1", "prefix-cache-hit", "serve",
          "cpu-tests")
#: the offline engine's settings on the GPU (small: the served copy runs beside it)
ENGINE_KW = dict(gpu_memory_utilization=0.25, max_model_len=2048, enforce_eager=True, dtype="float16", seed=0)
#: the CPU tests of the vLLM backend (its stand-ins must not depend on vLLM being installed)
CPU_TESTS = ("tests/judges/test_vllm_glue.py", "tests/judges/test_vllm_rules.py", "tests/judges/test_choice_probs.py")
BLOCK = 16  # vLLM's default KV block size on GPU: prefix-cache hits come in whole blocks


def serve_command(model_dir: str, port: int) -> list[str]:
    """``vllm serve`` for the smoke checkpoint: loopback only, the same dtype and limits as the offline engine,
    log-probs for label scoring, neutral sampling defaults (``--generation-config vllm``)."""
    exe = Path(sys.executable).with_name("vllm")
    head = [str(exe)] if exe.exists() else ["vllm"]
    return [*head, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--dtype", ENGINE_KW["dtype"],
            "--max-model-len", str(ENGINE_KW["max_model_len"]), "--enforce-eager",
            "--gpu-memory-utilization", str(ENGINE_KW["gpu_memory_utilization"]), "--max-logprobs", "20",
            "--generation-config", "vllm", "--limit-mm-per-prompt", json.dumps({"image": 8, "video": 0}), "--seed", "0",
            "--enable-prefix-caching"]


def cpu_test_command() -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CPU_TESTS]


# ---------------------------------------------------------------------------------------------- dry-run engine
class TransformersAsVLLM:
    """The tiny model on transformers behind ``vllm.LLM``'s ``generate`` interface (dry runs only), with the
    engine's request checks (tests/helpers/vllm_standin.py) and a simulated prefix cache (whole blocks of a prompt's
    token ids + image ids seen before)."""

    def __init__(self, model_dir: str, **engine_kwargs):
        from rewardkit.models.vlm import load_vlm

        self.model, self.processor = load_vlm(model_dir, device="cpu", dtype="float32")
        self.engine_kwargs = engine_kwargs
        self.enable_prefix_caching = bool(engine_kwargs.get("enable_prefix_caching"))
        self.max_logprobs = int(engine_kwargs.get("max_logprobs", 20))
        self.limits = dict(engine_kwargs.get("limit_mm_per_prompt") or {})
        self._seen: list[tuple] = []

    def get_tokenizer(self):
        return self.processor.tokenizer

    def _cached(self, key: tuple) -> int:
        best = 0
        for old in self._seen:
            n = 0
            for a, b in zip(old, key):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._seen.append(key)
        return min(best, len(key) - 1) // BLOCK * BLOCK if self.enable_prefix_caching else 0

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None):
        import torch
        from vllm_standin import validate_prompt

        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        add_special = (tokenization_kwargs or {}).get("add_special_tokens", True)
        for p, sp in zip(prompts, params):
            sp.validate_logprobs(len(self.processor.tokenizer), self.max_logprobs)
            validate_prompt(p, self.limits)
        outs = []
        for p, sp in zip(prompts, params):
            ims = (p.get("multi_modal_data") or {}).get("image") or None
            inputs = self.processor(text=[p["prompt"]], images=ims, return_tensors="pt",
                                    add_special_tokens=add_special)
            prompt_ids = inputs["input_ids"][0].tolist()
            cached = self._cached((*prompt_ids, *(p.get("multi_modal_uuids") or {}).get("image", [])))
            meta = dict(prompt_token_ids=prompt_ids, num_cached_tokens=cached)
            if sp.max_tokens == 1 and sp.logprob_token_ids:
                with torch.no_grad():
                    lp = torch.log_softmax(self.model(**inputs).logits[0, -1].double(), -1)
                top = int(lp.argmax())
                table = {t: NS(logprob=float(lp[t])) for t in [top, *sp.logprob_token_ids]}
                outs.append(NS(outputs=[NS(text="", token_ids=[top], logprobs=[table])], **meta))
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
                res.append(NS(text=self.processor.tokenizer.decode(ids, skip_special_tokens=sp.skip_special_tokens),
                              token_ids=ids, logprobs=None))
            outs.append(NS(outputs=res, **meta))
        return outs


def _install_standin() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from vllm_standin import StrictSamplingParams

    stub = types.ModuleType("vllm")
    stub.SamplingParams = StrictSamplingParams
    stub.LLM = lambda model, **kw: TransformersAsVLLM(model, **kw)
    sys.modules["vllm"] = stub


def fake_serve(model_dir: str, port: int) -> None:
    """The dry run's ``vllm serve``: the transformers stand-in behind the endpoints rewardkit's OpenAI backend uses
    (``/health``, ``/version``, ``/tokenize``, ``/v1/chat/completions`` with ``logprob_token_ids``,
    ``return_tokens_as_token_ids``, ``continue_final_message``), on 127.0.0.1."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from PIL import Image

    _install_standin()
    from vllm_standin import StrictSamplingParams

    engine = TransformersAsVLLM(model_dir, enable_prefix_caching=True, max_logprobs=20,
                                limit_mm_per_prompt={"image": 8, "video": 0})
    tok, lock = engine.processor.tokenizer, threading.Lock()

    def to_conv(messages):
        conv = []
        for m in messages:
            content = m["content"]
            if isinstance(content, list):
                parts = []
                for c in content:
                    if c["type"] == "image_url":
                        raw = base64.b64decode(c["image_url"]["url"].split(",", 1)[1])
                        parts.append({"type": "image", "image": Image.open(io.BytesIO(raw)).convert("RGB")})
                    else:
                        parts.append({"type": "text", "text": c["text"]})
                content = parts
            conv.append({"role": m["role"], "content": content})
        return conv

    def complete(body):
        conv = to_conv(body["messages"])
        cont = bool(body.get("continue_final_message"))
        text = engine.processor.apply_chat_template(conv, tokenize=False, continue_final_message=cont,
                                                    add_generation_prompt=bool(body.get("add_generation_prompt", True)))
        ims = [c["image"] for m in conv if isinstance(m["content"], list) for c in m["content"] if c["type"] == "image"]
        prompt = {"prompt": text, **({"multi_modal_data": {"image": ims}} if ims else {})}
        ids = body.get("logprob_token_ids")
        sp = StrictSamplingParams(
            n=body.get("n", 1), temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
            top_k=body.get("top_k", 0), min_p=body.get("min_p", 0.0), seed=body.get("seed"),
            repetition_penalty=body.get("repetition_penalty", 1.0), max_tokens=body.get("max_tokens", 16),
            stop=body.get("stop"), logprob_token_ids=ids, logprobs=len(ids) if ids else None,
            skip_special_tokens=body.get("skip_special_tokens", True))
        with lock:
            out = engine.generate([prompt], sp, tokenization_kwargs={"add_special_tokens": False})[0]
        choices = []
        for i, o in enumerate(out.outputs):
            ch = {"index": i, "message": {"role": "assistant", "content": o.text}}
            if body.get("logprobs") and o.logprobs:
                by_id = body.get("return_tokens_as_token_ids")
                name = (lambda t: f"token_id:{t}") if by_id else tok.convert_ids_to_tokens
                alts = [{"token": name(t), "logprob": v.logprob} for t, v in o.logprobs[0].items()]
                ch["logprobs"] = {"content": [{"token": alts[0]["token"], "logprob": alts[0]["logprob"],
                                               "top_logprobs": alts}]}
            choices.append(ch)
        return {"choices": choices}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send(self, code, obj):
            raw = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path == "/health":
                return self.send(200, {})
            if self.path == "/version":
                return self.send(200, {"version": "dry-run"})
            self.send(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                if self.path == "/tokenize":
                    return self.send(200, {"tokens": tok.encode(body["prompt"], add_special_tokens=False)})
                if self.path == "/v1/chat/completions":
                    return self.send(200, complete(body))
            except ValueError as exc:  # vLLM answers a refused request with HTTP 400
                return self.send(400, {"error": str(exc)})
            self.send(404, {"error": "not found"})

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()


# ---------------------------------------------------------------------------------------------- helpers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> str | None:
    """None once ``GET url`` answers 200; else why not (the process exited, or the time ran out)."""
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return f"the server exited with code {proc.returncode}"
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    return f"not healthy after {timeout:.0f} s"


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own process group: the server and its engine process
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def greedy_match(vids: list[int], tids: list[int], margins: list[float], tie: float) -> tuple[bool, str]:
    """vLLM's greedy ids against transformers': equal, or diverging first at a step where transformers' top-2
    logits differ by less than ``tie`` (a near-tie that float16 vs float32 may break either way)."""
    if vids == tids:
        return True, "token ids equal transformers'"
    k = next((i for i, (a, b) in enumerate(zip(vids, tids)) if a != b), min(len(vids), len(tids)))
    m = margins[k] if k < len(margins) else float("inf")
    return m < tie, f"first divergence at step {k}, transformers' top-2 margin there {m:.3g} (near-tie below {tie:g})"


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU: transformers stands in for vLLM")
    ap.add_argument("--tol", type=float, default=5e-3,
                    help="label-probability tolerance (vLLM float16 vs transformers float32; served vs offline)")
    ap.add_argument("--tie", type=float, default=0.05, help="greedy: accept a divergence only below this margin")
    ap.add_argument("--skip-cpu-tests", action="store_true", help="do not run the vLLM backend's CPU tests")
    ap.add_argument("--fake-serve", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fake_serve:
        fake_serve(args.fake_serve, args.port)
        return 0
    t_start = time.time()

    import torch

    from rewardkit.judges import load_judge
    from rewardkit.judges.transformers_backend import conversation_images
    from rewardkit.testing import random_images, save_tiny_vllm_checkpoint

    workdir = tempfile.mkdtemp(prefix="rk-vllm-smoke-")
    model_dir = str(save_tiny_vllm_checkpoint(os.path.join(workdir, "tiny-qwen2_5_vl-vllm"), dtype="float16"))
    if args.dry_run:
        _install_standin()
        engine_kw: dict = {}
    else:
        if not torch.cuda.is_available():
            print("FAIL setup: no CUDA device (use --dry-run on CPU)")
            return 2
        engine_kw = dict(ENGINE_KW)

    vjudge = load_judge(f"vllm:{model_dir}", **engine_kw)
    tjudge = load_judge(f"transformers:{model_dir}", device="cpu", dtype="float32")
    print(f"setup: vllm judge on {'transformers stand-in (dry run)' if args.dry_run else 'vLLM'}, "
          f"float16 checkpoint, head size 64; {time.time() - t_start:.1f} s")

    ims = random_images(3, sizes=[(56, 56), (40, 64), (64, 32)], seed=3)

    def conv(images, q):
        return [{"role": "user", "content": [*({"type": "image", "image": i} for i in images),
                                             {"type": "text", "text": q}]}]

    convs = [conv(ims[:2], "Is there a cat? Yes or No."), conv(ims[2:], "Yes or No?"),
             [{"role": "user", "content": "Is the sky green? Yes or No."}], conv(ims[:1], "Dog?")]
    results: dict[str, str] = {}

    def report(name: str, ok: bool | None, detail: str) -> None:
        results[name] = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        print(f"{results[name]} {name}: {detail}", flush=True)

    p = vjudge.choice_probs(convs, ["Yes", "No"])
    ref = tjudge.choice_probs(convs, ["Yes", "No"])
    diff = float((p - ref).abs().max()) if not torch.isnan(p).any() else float("nan")
    report("label-probs", diff <= args.tol, f"max |vllm - transformers| = {diff:.2e} over {len(convs)} "
           f"conversations (3 with images, 1 text-only); tol {args.tol:g}")

    rev = vjudge.choice_probs(convs[::-1], ["Yes", "No"]).flip(0)
    d2 = float((rev - p).abs().max())
    report("order-independence", d2 <= args.tol, f"max change when the batch is reversed = {d2:.2e}; tol {args.tol:g}")

    a = vjudge.generate(convs[:2], n=4, temperature=1.0, max_new_tokens=8, seed=7)
    b = vjudge.generate(convs[:2], n=4, temperature=1.0, max_new_tokens=8, seed=7)
    c = vjudge.generate(convs[1:2], n=4, temperature=1.0, max_new_tokens=8, seed=7)
    distinct = len(set(a[0]))
    report("seeded-sampling", a == b and c[0] == a[1] and distinct >= 2,
           f"same seed same samples: {a == b}; independent of batch: {c[0] == a[1]}; {distinct} distinct of 4")

    greedy = vjudge.generate(convs[:2], n=3, temperature=0.0, max_new_tokens=6)
    outs = vjudge.llm.generate([pr for pr, _ in vjudge._prompts(convs[:2])],
                               vjudge._sampling(n=1, temperature=0.0, max_tokens=6),
                               use_tqdm=False, tokenization_kwargs={"add_special_tokens": False})
    verdicts = []
    for cv, o in zip(convs[:2], outs):
        inputs = tjudge.processor(text=[tjudge._render(cv)], images=conversation_images(cv) or None,
                                  return_tensors="pt")
        with torch.no_grad():
            gen = tjudge.model.generate(**inputs, max_new_tokens=6, do_sample=False, output_scores=True,
                                        return_dict_in_generate=True)
        tids = gen.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        margins = [float((lambda top: top[0] - top[1])(s[0].float().topk(2).values)) for s in gen.scores]
        verdicts.append(greedy_match(list(o.outputs[0].token_ids), tids, margins, args.tie))
    report("greedy-n>1", all(len(g) == 3 and len(set(g)) == 1 for g in greedy) and all(ok for ok, _ in verdicts),
           "3 identical answers per conversation; " + "; ".join(d for _, d in verdicts))

    long_q = "Look at both images carefully and describe the cat, the dog, the sky and the grass. " * 4
    (prompt, _), = vjudge._prompts([conv(ims[:2], long_q)])
    sp = vjudge._sampling(n=1, temperature=0.0, max_tokens=1)
    kw = dict(use_tqdm=False, tokenization_kwargs={"add_special_tokens": False})
    first = vjudge.llm.generate([prompt], sp, **kw)[0]
    second = vjudge.llm.generate([prompt], sp, **kw)[0]
    n_prompt, hit = len(second.prompt_token_ids), int(second.num_cached_tokens or 0)
    report("prefix-cache-hit", hit >= BLOCK,
           f"the same {n_prompt}-token prompt (2 images) sent again: {hit} tokens read from the prefix cache "
           f"(first time: {int(first.num_cached_tokens or 0)}); enable_prefix_caching forced on by the judge")

    port = _free_port()
    cmd = ([sys.executable, str(Path(__file__).resolve()), "--fake-serve", model_dir, "--port", str(port)]
           if args.dry_run else serve_command(model_dir, port))
    log_path = os.path.join(workdir, "serve.log")
    t_serve = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        try:
            why = _wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout=90 if args.dry_run else 240)
            if why is not None:
                tail = Path(log_path).read_text(errors="replace")[-1500:]
                report("serve", False, f"`{' '.join(cmd[:3])} ...` {why}; log tail:\n{tail}")
            else:
                ojudge = load_judge(f"openai:http://127.0.0.1:{port}/v1", model=model_dir, max_retries=2, timeout=120)
                ps = ojudge.choice_probs(convs, ["Yes", "No"])
                d3 = float((ps - p).abs().max()) if not torch.isnan(ps).any() else float("nan")
                og = ojudge.generate(convs[:1], n=2, temperature=0.0, max_new_tokens=4)
                kind = ojudge.describe()["server"]
                report("serve", d3 <= args.tol and kind == "vllm" and len(og[0]) == 2 and og[0][0] == og[0][1],
                       f"started in {time.time() - t_serve:.0f} s; server detected as {kind!r}; max |served - "
                       f"offline| label prob = {d3:.2e} (tol {args.tol:g}); greedy n=2 answers equal")
                ojudge.close()
        finally:
            _stop(proc)

    if args.skip_cpu_tests:
        report("cpu-tests", None, "skipped (--skip-cpu-tests)")
    else:
        res = subprocess.run(cpu_test_command(), cwd=ROOT, capture_output=True, text=True, timeout=600)
        last = (res.stdout.strip().splitlines() or ["(no output)"])[-1]
        report("cpu-tests", res.returncode == 0, f"{' '.join(CPU_TESTS)}: {last}")

    failures = sum(v == "FAIL" for v in results.values())
    print(f"{'all checks passed' if not failures else f'{failures} check(s) failed'} in {time.time() - t_start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
