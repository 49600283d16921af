"""The GPU smoke scripts run unchanged on a device machine; their CPU dry-run modes, the checks they make and
the tiny checkpoint they load are tested here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))


@pytest.mark.slow
def test_vllm_smoke_dry_run():
    pytest.importorskip("transformers")
    pytest.importorskip("httpx")
    from tests.helpers.forked import run_forked

    # `python benchmarks/gpu/vllm_smoke.py --dry-run --skip-cpu-tests` in a process forked from this one (its
    # stand-in `vllm` module stays there; no fresh Python importing torch); its `vllm serve` stand-in a real process
    res = run_forked([ROOT / "benchmarks" / "gpu" / "vllm_smoke.py", "--dry-run", "--skip-cpu-tests"],
                     env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, cwd=ROOT, timeout=600)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("PASS", "FAIL", "SKIP"))]
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert [ln.split()[1].rstrip(":") for ln in lines] == [
        "label-probs", "order-independence", "seeded-sampling", "greedy-n>1", "prefix-cache-hit", "serve",
        "cpu-tests"]
    assert all(ln.startswith("PASS") for ln in lines[:-1]) and lines[-1].startswith("SKIP cpu-tests")
    serve = next(ln for ln in lines if " serve:" in ln)
    assert "server detected as 'vllm'" in serve  # the OpenAI backend scored through the (stand-in) server
    hit = next(ln for ln in lines if "prefix-cache-hit" in ln)
    assert int(re.search(r"sent again: (\d+) tokens", hit).group(1)) >= 16


def test_vllm_smoke_checks_what_the_gpu_run_needs():
    """The GPU run's settings, read without a GPU: the engine and `vllm serve` use float16 (every attention
    backend takes it), bind to loopback, keep log-probs for label scoring and neutral sampling defaults, and
    the CPU tests it reruns exist."""
    import vllm_smoke

    assert vllm_smoke.CHECKS == ("label-probs", "order-independence", "seeded-sampling", "greedy-n>1",
                                 "prefix-cache-hit", "serve", "cpu-tests")
    assert vllm_smoke.ENGINE_KW["dtype"] in ("float16", "bfloat16") and vllm_smoke.ENGINE_KW["enforce_eager"]
    cmd = vllm_smoke.serve_command("/m", 8123)
    assert cmd[1:3] == ["serve", "/m"]
    opt = {cmd[i]: cmd[i + 1] for i in range(3, len(cmd) - 1) if cmd[i].startswith("--") and not cmd[i + 1].startswith("--")}
    assert opt["--host"] == "127.0.0.1" and opt["--port"] == "8123"
    assert opt["--dtype"] == vllm_smoke.ENGINE_KW["dtype"] and int(opt["--max-logprobs"]) >= 20
    assert opt["--generation-config"] == "vllm" and json.loads(opt["--limit-mm-per-prompt"]) == {"image": 8, "video": 0}
    assert "--enforce-eager" in cmd and "--enable-prefix-caching" in cmd
    assert all((ROOT / t).is_file() for t in vllm_smoke.CPU_TESTS)
    assert vllm_smoke.cpu_test_command()[1:3] == ["-m", "pytest"]


def test_greedy_comparison_accepts_only_near_ties():
    from vllm_smoke import greedy_match

    assert greedy_match([1, 2, 3], [1, 2, 3], [1.0, 1.0, 1.0], 0.05)[0]
    ok, why = greedy_match([1, 5, 6], [1, 2, 3], [1.0, 0.01, 1.0], 0.05)
    assert ok and "step 1" in why
    assert not greedy_match([1, 5, 6], [1, 2, 3], [1.0, 0.5, 1.0], 0.05)[0]
    assert not greedy_match([1, 2], [1, 2, 3], [1.0, 1.0, 1.0], 0.05)[0]  # stopped early at a clear margin


@pytest.mark.slow
def test_the_vllm_tiny_checkpoint_suits_every_attention_backend(tmp_path):
    """Head size >= 32 (Triton) and one FlashInfer / FlashAttention take (64), float16 weights (FlashAttention
    and FlashInfer need fp16 / bf16), and a complete processor config; the CPU fixtures are unchanged."""
    pytest.importorskip("transformers")
    from safetensors import safe_open

    from rewardkit.models.vlm import load_processor
    from rewardkit.testing import save_tiny_vllm_checkpoint, tiny_qwen2_5_vl

    d = save_tiny_vllm_checkpoint(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    assert cfg["dtype"] == "float16"
    text_head = text["hidden_size"] // text["num_attention_heads"]
    vision_head = vision["hidden_size"] // vision["num_heads"]
    assert text_head == vision_head == 64
    assert sum(text["rope_parameters"]["mrope_section"]) == text_head // 2
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"F16"}
    proc_cfg = json.loads((d / "processor_config.json").read_text())
    assert proc_cfg["processor_class"] == "Qwen2_5_VLProcessor"
    assert proc_cfg["video_processor"]["video_processor_type"] == "Qwen2VLVideoProcessor"
    assert proc_cfg["image_processor"]["patch_size"] == vision["patch_size"] == 14
    video = json.loads((d / "video_preprocessor_config.json").read_text())
    assert video == proc_cfg["video_processor"]
    proc = load_processor(str(d))  # rewardkit's loader reads it back (image-only without torchvision)
    assert (d / "chat_template.jinja").read_text() == proc.tokenizer.chat_template
    with pytest.raises(ValueError, match="float16"):
        save_tiny_vllm_checkpoint(tmp_path / "x", dtype="float32")
    model, _ = tiny_qwen2_5_vl()  # what tests/conftest.py's tiny_qwen2_5_vl_dir saves: unchanged
    assert model.config.text_config.hidden_size // model.config.text_config.num_attention_heads == 16
    assert model.dtype.is_floating_point and str(model.dtype) == "torch.float32"


@pytest.mark.slow
def test_serve_batching_gpu_script_dry_run():
    pytest.importorskip("uvicorn")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "serve_batching.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "ratio batching / no batching:" in res.stdout and "req/s" in res.stdout


@pytest.mark.slow
def test_serve_ray_gpu_script_dry_run(ray_cluster):
    """The dry run deploys on the session's Ray cluster (tests/conftest.py) instead of starting one: the same
    code path, one cluster start less."""
    pytest.importorskip("ray.serve")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "serve_ray.py"), "--dry-run",
                          "--ray-address", ray_cluster], capture_output=True, text=True, timeout=600, env=env,
                         cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "ratio to rewardkit serve" in res.stdout and "ray serve, 2 replica(s)" in res.stdout
