"""MLLM-as-judge engine: one backend protocol, three backends, versioned prompt templates.

    >>> from rewardkit.judges import load_judge
    >>> judge = load_judge("transformers:Qwen/Qwen3-VL-8B-Instruct", device="cuda", dtype="bfloat16")
    >>> judge = load_judge("vllm:Qwen/Qwen3-VL-8B-Instruct", gpu_memory_utilization=0.5)
    >>> judge = load_judge("openai:http://127.0.0.1:8000/v1", model="Qwen/Qwen3-VL-8B-Instruct")
    >>> judge.choice_probs([[{"role": "user", "content": [{"type": "image", "image": img},
    ...                                                    {"type": "text", "text": "A cat? Yes or No."}]}]],
    ...                    ["Yes", "No"])          # tensor [1, 2], rows sum to 1

Backends are imported lazily: importing this package does not import transformers, vllm or httpx.
"""

from __future__ import annotations

import os
from typing import Any

from .base import MAX_TEMPERATURE, ChoiceError, Conversation, JudgeBackend, Message, check_temperature
from .policy import JUDGE_ERROR_POLICIES, JudgeError
from .templates import Template, load_template

__all__ = ["JudgeBackend", "Conversation", "Message", "ChoiceError", "JudgeError", "JUDGE_ERROR_POLICIES", "load_judge",
           "resolve_judge", "judge_spec", "Template", "load_template", "BACKENDS", "check_temperature",
           "MAX_TEMPERATURE"]

#: spec prefix -> "module:Class" (relative to this package)
BACKENDS = {
    "transformers": ".transformers_backend:TransformersJudge",
    "hf": ".transformers_backend:TransformersJudge",
    "vllm": ".vllm_backend:VLLMJudge",
    "openai": ".openai_backend:OpenAIJudge",
}


def judge_spec(spec: str, judge_kwargs: dict[str, Any] | None = None, *, device: Any = None,
               dtype: Any = None) -> tuple[str, dict[str, Any]]:
    """A reward's judge option -> ``(spec with its backend prefix, load_judge kwargs)``: a bare checkpoint means
    the transformers backend; ``device`` goes to local backends and ``dtype`` to local and vLLM ones, unless
    ``judge_kwargs`` already set them."""
    kind = spec.partition(":")[0]
    if kind not in BACKENDS:
        spec, kind = f"transformers:{spec}", "transformers"
    kw = dict(judge_kwargs or {})
    if device is not None and kind in ("transformers", "hf"):
        kw.setdefault("device", device)
    if dtype is not None and kind in ("transformers", "hf", "vllm"):
        kw.setdefault("dtype", dtype)
    return spec, kw


def _backend_class(kind: str) -> type:
    import importlib

    if kind not in BACKENDS:
        raise ValueError(f"unknown judge backend {kind!r}; choose from {sorted(set(BACKENDS))}")
    mod, _, cls = BACKENDS[kind].partition(":")
    return getattr(importlib.import_module(mod, __name__), cls)


def load_judge(spec: Any, **kwargs: Any) -> JudgeBackend:
    """Build a judge backend.

    ``spec`` is one of:

    - a :class:`JudgeBackend` instance (returned as is; ``kwargs`` must be empty);
    - ``"transformers:<checkpoint>"`` (local directory or hub id), kwargs ``device``, ``dtype``,
      ``max_rows``, ``max_prefixes``, ``trust_remote_code``;
    - ``"vllm:<checkpoint>"``, kwargs passed to ``vllm.LLM`` (``gpu_memory_utilization``, ``max_model_len``...);
    - ``"openai:<base_url>"`` (e.g. ``openai:http://127.0.0.1:8000/v1``), kwargs ``model`` (required),
      ``api_key`` (default ``$OPENAI_API_KEY``), ``concurrency``, ``timeout`` (whole request),
      ``max_retries``, ``max_response_bytes``;
    - a ``(model, processor)`` tuple of loaded transformers objects;
    - a bare local directory (transformers).
    """
    if isinstance(spec, JudgeBackend):
        if kwargs:
            raise ValueError(f"load_judge got a ready backend and extra arguments {sorted(kwargs)}")
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return _backend_class("transformers")(spec[0], spec[1], **kwargs)
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"judge spec must be a backend, a '(model, processor)' tuple or a string, got {spec!r}")
    kind, sep, target = spec.partition(":")
    if sep and kind in BACKENDS and target:
        return _backend_class(kind)(target, **kwargs)
    if os.path.isdir(spec):
        return _backend_class("transformers")(spec, **kwargs)
    raise ValueError(f"cannot read judge spec {spec!r}: use 'transformers:<path>', 'vllm:<path>' or "
                     "'openai:<base_url>'")


def resolve_judge(judge: Any, spec: Any = None, spec_kwargs: Any = None, *, owner: str) -> JudgeBackend:
    """The backend a judge-based reward uses: ``judge`` when it is an object (a backend or a
    ``(model, processor)`` tuple passed in Python), else the config's ``spec`` string with ``spec_kwargs``;
    a clear error naming the reward ``owner`` when there is neither."""
    if judge is not None and not isinstance(judge, str):
        return load_judge(judge)
    if spec:
        return load_judge(spec, **dict(spec_kwargs or {}))
    raise ValueError(f"{owner} needs a judge: load_reward({owner!r}, judge='transformers:<checkpoint>') "
                     "(or 'vllm:<checkpoint>', 'openai:<url>' with judge_kwargs={'model': ...}, or a backend)")
