"""Judge backend on offline vLLM (``vllm.LLM``): multimodal chat prompts, ``n`` sampling, prefix caching.

vLLM hashes every image by content, so the same image in many prompts maps to the same multimodal id and
the prefix cache (``enable_prefix_caching=True``, forced on here) reuses the KV blocks of the shared
image + instruction prefix across the K samples and the verification questions. Images are passed as PIL
objects (``image_pil`` content parts), never re-encoded to files.

``choice_probs`` requests one token with the top ``logprobs`` alternatives (``max_logprobs`` of the engine,
20 by default) and renormalises the choice tokens' log-probabilities (raw, full-vocabulary log-softmax,
vLLM's default ``logprobs_mode``). These are the exact log-probs of every choice that ranks in the top
``logprobs``; a choice below it gets probability 0, and a row where no choice ranks is NaN. Raise
``logprobs`` (and the engine's ``max_logprobs``) if your choices are not the model's top candidates.

Sampling seeds are per request, derived from (seed, conversation content, sample) so that a
conversation's samples do not depend on the rest of the batch.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from .base import ChoiceError, Conversation, JudgeBackend

__all__ = ["VLLMJudge", "to_vllm_messages"]


def to_vllm_messages(conv: Conversation) -> tuple[list[dict[str, Any]], str]:
    """HF-style messages -> vLLM chat messages with ``image_pil`` parts, plus a content digest."""
    from ..media import _to_pil, image_hash

    h = hashlib.blake2b(digest_size=8)
    out = []
    for msg in conv:
        content = msg.get("content")
        if isinstance(content, str) or content is None:
            out.append({"role": msg["role"], "content": content or ""})
            h.update(f"{msg['role']}:{content}".encode())
            continue
        parts = []
        for c in content:
            if isinstance(c, dict) and (c.get("type") == "image" or "image" in c):
                pil = _to_pil(c["image"])
                parts.append({"type": "image_pil", "image_pil": pil})
                h.update(image_hash(pil).encode())
            else:
                parts.append({"type": "text", "text": c["text"]})
                h.update(c["text"].encode())
        out.append({"role": msg["role"], "content": parts})
    return out, h.hexdigest()


class VLLMJudge(JudgeBackend):
    """A judge on an offline ``vllm.LLM`` engine.

    Args:
        model: checkpoint path or hub id, or a ready ``vllm.LLM``.
        logprobs: alternatives read by ``choice_probs``.
        max_images: images per prompt the engine accepts (``limit_mm_per_prompt``).
        **engine_kwargs: passed to ``vllm.LLM`` (``gpu_memory_utilization``, ``max_model_len``, ``dtype``,
            ``tensor_parallel_size``, ...). ``trust_remote_code`` defaults to False.
    """

    kind = "vllm"

    def __init__(self, model: Any, *, logprobs: int = 20, max_images: int = 8, **engine_kwargs: Any) -> None:
        from .._imports import require

        vllm = require("vllm", "vllm")
        self._vllm = vllm
        if isinstance(model, str):
            self.model_id = model
            kw = {"trust_remote_code": False, "limit_mm_per_prompt": {"image": max_images},
                  "max_logprobs": max(20, logprobs), **engine_kwargs}
            kw["enable_prefix_caching"] = True
            self.llm = vllm.LLM(model=model, **kw)
        else:
            self.llm, self.model_id = model, getattr(model, "model_id", type(model).__name__)
        self.logprobs = int(logprobs)
        self.tokenizer = self.llm.get_tokenizer()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": str(self.model_id), "logprobs": self.logprobs}

    def _chat(self, msgs: list, params: list) -> list:
        cont = [bool(m) and m[-1]["role"] == "assistant" for m in msgs]
        if any(cont) and not all(cont):
            raise ValueError("mix of conversations ending with and without an assistant prefix in one batch")
        return self.llm.chat(msgs, params, use_tqdm=False, add_generation_prompt=not cont[0],
                             continue_final_message=cont[0])

    def generate(self, conversations: Sequence[Conversation], *, n: int = 1, temperature: float = 0.0,
                 max_new_tokens: int = 256, stop: Sequence[str] | None = None,
                 seed: int | None = None) -> list[list[str]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not conversations:
            return []
        conv = [to_vllm_messages(c) for c in conversations]
        params = []
        for _, digest in conv:
            s = None if seed is None else (seed * 1_000_003 + int(digest, 16)) % (2 ** 31)
            params.append(self._vllm.SamplingParams(n=n, temperature=temperature, max_tokens=max_new_tokens,
                                                    stop=list(stop) if stop else None, seed=s))
        outs = self._chat([m for m, _ in conv], params)
        return [[o.text for o in out.outputs] for out in outs]

    def choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str]):
        import torch

        ids = []
        for c in choices:
            t = self.tokenizer.encode(c, add_special_tokens=False)
            if len(t) != 1:
                raise ChoiceError(f"choice {c!r} is {len(t)} tokens for this tokenizer; choice_probs needs single tokens")
            ids.append(t[0])
        if not conversations:
            return torch.zeros(0, len(ids))
        msgs = [to_vllm_messages(c)[0] for c in conversations]
        params = self._vllm.SamplingParams(n=1, temperature=0.0, max_tokens=1, logprobs=self.logprobs)
        outs = self._chat(msgs, [params] * len(msgs))
        probs = torch.full((len(msgs), len(ids)), float("nan"))
        for i, out in enumerate(outs):
            table = out.outputs[0].logprobs[0]  # {token_id: Logprob}
            row = [table[t].logprob if t in table else None for t in ids]
            if all(x is None for x in row):
                continue
            lp = torch.tensor([x if x is not None else float("-inf") for x in row], dtype=torch.float64)
            probs[i] = torch.softmax(lp, 0).float()
        return probs
