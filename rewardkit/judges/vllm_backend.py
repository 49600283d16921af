"""Judge backend on offline vLLM (``vllm.LLM``): multimodal chat prompts, ``n`` sampling, prefix caching.

Prompts are rendered with the checkpoint's own chat template (as the transformers backend does) and passed
to ``LLM.generate`` as ``{"prompt": text, "multi_modal_data": {"image": [PIL, ...]}}``. vLLM hashes every
image under a stable id (``multi_modal_uuids``: rewardkit's content hash), so the same image in many prompts
maps to the same multimodal id and the prefix cache
(``enable_prefix_caching=True``, forced on here) reuses the KV blocks of the shared image + instruction
prefix across the K samples and the verification questions.

``choice_probs`` requests one token with ``logprob_token_ids`` set to the choice tokens (vLLM >= 0.30, the
``vllm`` extra's floor): the engine returns the exact log-probability of every choice, whatever its rank
(raw full-vocabulary log-softmax, vLLM's default ``logprobs_mode``), and rewardkit renormalises over the
choices. A row where the engine returns no log-probability for a choice is NaN, never a guess.

Sampling seeds are per request, derived from (seed, conversation content, sample) so that a
conversation's samples do not depend on the rest of the batch.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from .base import ChoiceError, Conversation, JudgeBackend

__all__ = ["VLLMJudge"]


def _digest(text: str, image_keys: list[str]) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(text.encode())
    h.update("".join(image_keys).encode())
    return int.from_bytes(h.digest(), "little")


class VLLMJudge(JudgeBackend):
    """A judge on an offline ``vllm.LLM`` engine.

    Args:
        model: checkpoint path or hub id, or a ready ``vllm.LLM``.
        logprobs: the engine's ``max_logprobs`` (at least the number of choices given to ``choice_probs``).
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

    def _prompts(self, conversations: Sequence[Conversation]) -> list[tuple[dict[str, Any], int]]:
        from ..media import _to_pil, image_hash
        from .transformers_backend import conversation_images

        out = []
        for conv in conversations:
            cont = bool(conv) and conv[-1].get("role") == "assistant"
            text = self.tokenizer.apply_chat_template(list(conv), tokenize=False, add_generation_prompt=not cont,
                                                      continue_final_message=cont)
            ims = [_to_pil(im) for im in conversation_images(conv)]
            hashes = [image_hash(im) for im in ims]
            prompt: dict[str, Any] = {"prompt": text}
            if ims:
                # stable multimodal ids: our content hashes, so vLLM reuses cached work without rehashing
                prompt["multi_modal_data"] = {"image": ims}
                prompt["multi_modal_uuids"] = {"image": hashes}
            out.append((prompt, _digest(text, hashes)))
        return out

    def generate(self, conversations: Sequence[Conversation], *, n: int = 1, temperature: float = 0.0,
                 max_new_tokens: int = 256, stop: Sequence[str] | None = None,
                 seed: int | None = None) -> list[list[str]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not conversations:
            return []
        prompts = self._prompts(conversations)
        params = []
        for _, digest in prompts:
            s = None if seed is None else (seed * 1_000_003 + digest) % (2 ** 31)
            params.append(self._vllm.SamplingParams(n=n, temperature=temperature, max_tokens=max_new_tokens,
                                                    stop=list(stop) if stop else None, seed=s))
        outs = self.llm.generate([p for p, _ in prompts], params, use_tqdm=False)
        return [[o.text for o in out.outputs] for out in outs]

    def choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str]):
        import torch

        ids = []
        for c in choices:
            t = self.tokenizer.encode(c, add_special_tokens=False)
            if len(t) != 1:
                raise ChoiceError(f"choice {c!r} is {len(t)} tokens for this tokenizer; choice_probs needs single tokens")
            ids.append(t[0])
        if len(ids) > self.logprobs:
            raise ValueError(f"{len(ids)} choices but the engine returns at most {self.logprobs} log-probs; "
                             "build the judge with logprobs >= the number of choices")
        if not conversations:
            return torch.zeros(0, len(ids))
        prompts = [p for p, _ in self._prompts(conversations)]
        # exact label log-probs: logprobs must equal len(logprob_token_ids) when both are set (vLLM 0.32)
        params = self._vllm.SamplingParams(n=1, temperature=0.0, max_tokens=1, logprobs=len(ids),
                                           logprob_token_ids=list(ids))
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        probs = torch.full((len(prompts), len(ids)), float("nan"))
        for i, out in enumerate(outs):
            table = out.outputs[0].logprobs[0]  # {token_id: Logprob}: the sampled token + every choice id
            row = [table[t].logprob if t in table else None for t in ids]
            if any(x is None for x in row):
                continue  # the engine did not report a choice: NaN (the caller marks the sample invalid)
            probs[i] = torch.softmax(torch.tensor(row, dtype=torch.float64), 0).float()
        return probs
