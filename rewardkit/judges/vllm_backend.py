"""Judge backend on offline vLLM (``vllm.LLM``): multimodal chat prompts, ``n`` sampling, prefix caching.

Prompts are rendered with the checkpoint's *processor* chat template, exactly as the transformers backend
renders them (``rewardkit.models.vlm.load_processor``), and passed to ``LLM.generate`` as
``{"prompt": text, "multi_modal_data": {"image": [PIL, ...]}}`` with ``add_special_tokens=False``: the
template already holds every special token, and vLLM would otherwise add a BOS a second time for
tokenizers that have one. vLLM hashes every
image under a stable id (``multi_modal_uuids``: rewardkit's content hash), so the same image in many prompts
maps to the same multimodal id and the prefix cache
(``enable_prefix_caching=True``, forced on here) reuses the KV blocks of the shared image + instruction
prefix across the K samples and the verification questions.

``choice_probs`` requests one token with ``logprob_token_ids`` set to the choice tokens (in vLLM since
0.30; the ``vllm`` extra pins 0.33.x): the engine returns the exact log-probability of every choice,
whatever its rank (raw full-vocabulary log-softmax, vLLM's default ``logprobs_mode``), and rewardkit
renormalises over the choices. A row where the engine returns no log-probability for a choice is NaN, never a guess.
``raw_choice_probs`` returns the same values un-renormalised (``exp`` of each choice's full-vocabulary
log-probability); it refuses an engine built with a ``logprobs_mode`` other than ``raw_logprobs``.

Sampling seeds are per request, derived from (seed, conversation content, sample) so that a
conversation's samples do not depend on the rest of the batch. Every sampling field is set explicitly
(``top_p=1``, ``top_k=0``, ``min_p=0``, no penalties) so nothing depends on library or checkpoint defaults.
vLLM refuses ``n > 1`` with greedy decoding (temperature 0): greedy requests ask for one completion and
replicate it ``n`` times, which is what greedy decoding would give.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from .base import ChoiceError, Conversation, JudgeBackend, check_choices, check_temperature, continues_final_message

__all__ = ["VLLMJudge", "normalize_dtype_name", "GREEDY_EPS"]

#: vLLM treats temperatures below this as greedy decoding (``vllm.sampling_params._SAMPLING_EPS``).
GREEDY_EPS = 1e-5

_DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float": "float32", "float16": "float16",
                "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16", "auto": "auto"}


def normalize_dtype_name(dtype: Any) -> str:
    """``"bf16"`` / ``"fp16"`` / ``torch.bfloat16`` / ... -> the dtype names vLLM accepts
    (``"bfloat16"``, ``"float16"``, ``"float32"``, ``"auto"``)."""
    key = str(dtype).lower().replace("torch.", "")
    if key not in _DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of float32, float16, bfloat16, auto "
                         "(aliases fp32, fp16, half, bf16)")
    return _DTYPE_NAMES[key]


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
        max_images: images per prompt the engine accepts (``limit_mm_per_prompt={"image": max_images,
            "video": 0}``).
        processor: the processor whose chat template renders prompts; default: loaded from ``model`` (for a
            ready engine: the engine's tokenizer's template).
        **engine_kwargs: passed to ``vllm.LLM`` (``gpu_memory_utilization``, ``max_model_len``, ``dtype``
            (aliases like ``bf16`` are normalised), ``tensor_parallel_size``, ...). ``trust_remote_code``
            defaults to False.
    """

    kind = "vllm"

    def __init__(self, model: Any, *, logprobs: int = 20, max_images: int = 8, processor: Any = None,
                 **engine_kwargs: Any) -> None:
        from .._imports import require

        vllm = require("vllm", "vllm")
        self._vllm = vllm
        if "dtype" in engine_kwargs and engine_kwargs["dtype"] is not None:
            engine_kwargs["dtype"] = normalize_dtype_name(engine_kwargs["dtype"])
        if isinstance(model, str):
            self.model_id = model
            # no videos: rewardkit never sends one, and the engine then reserves nothing for them
            kw = {"trust_remote_code": False, "limit_mm_per_prompt": {"image": max_images, "video": 0},
                  "max_logprobs": max(20, logprobs), **engine_kwargs}
            kw["enable_prefix_caching"] = True
            self.llm = vllm.LLM(model=model, **kw)
            if processor is None:
                from ..models.vlm import load_processor

                processor = load_processor(model, trust_remote_code=bool(kw["trust_remote_code"]))
        else:
            self.llm, self.model_id = model, getattr(model, "model_id", type(model).__name__)
        self.logprobs = int(logprobs)
        lp_mode = engine_kwargs.get("logprobs_mode")
        self._engine_logprobs_mode = None if lp_mode is None else str(getattr(lp_mode, "value", lp_mode))
        self.tokenizer = self.llm.get_tokenizer()
        # The template renderer: the processor's (what the transformers backend and vLLM's chat use).
        self.processor = processor if processor is not None else self.tokenizer

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": str(self.model_id), "logprobs": self.logprobs}

    def _prompts(self, conversations: Sequence[Conversation]) -> list[tuple[dict[str, Any], int]]:
        from ..media import _to_pil, image_hash
        from .transformers_backend import conversation_images

        out = []
        for conv in conversations:
            cont = continues_final_message(conv)
            text = self.processor.apply_chat_template(list(conv), tokenize=False, add_generation_prompt=not cont,
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

    def _sampling(self, **kw: Any):
        """``SamplingParams`` with every field that changes sampling set explicitly (neutral values)."""
        base = dict(top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                    frequency_penalty=0.0, skip_special_tokens=True)
        return self._vllm.SamplingParams(**{**base, **kw})

    def _generate(self, prompts: list[dict[str, Any]], params: Any):
        # The rendered template already holds the special tokens: never let vLLM add a BOS again.
        return self.llm.generate(prompts, params, use_tqdm=False,
                                 tokenization_kwargs={"add_special_tokens": False})

    def generate(self, conversations: Sequence[Conversation], *, n: int = 1, temperature: float = 0.0,
                 max_new_tokens: int = 256, stop: Sequence[str] | None = None,
                 seed: int | None = None) -> list[list[str]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        check_temperature(temperature)
        if not conversations:
            return []
        greedy = temperature < GREEDY_EPS
        prompts = self._prompts(conversations)
        params = []
        for _, digest in prompts:
            s = None if seed is None else (seed * 1_000_003 + digest) % (2 ** 31)
            params.append(self._sampling(n=1 if greedy else n, temperature=0.0 if greedy else temperature,
                                         max_tokens=max_new_tokens, stop=list(stop) if stop else None,
                                         seed=None if greedy else s))
        outs = self._generate([p for p, _ in prompts], params)
        texts = [[o.text for o in out.outputs] for out in outs]
        # greedy decoding gives one answer: vLLM refuses n > 1 at temperature 0, so replicate it
        return [t * n if greedy else t for t in texts]

    def _choice_logprobs(self, conversations: Sequence[Conversation], choices: Sequence[str]):
        """Each conversation's next-token log-probabilities of the choice tokens -> ``(ids, rows)``: a row is a
        list with one float per choice, or None where the engine reported no log-probability for a choice."""
        check_choices(choices)
        ids = []
        for c in choices:
            t = self.tokenizer.encode(c, add_special_tokens=False)
            if len(t) != 1:
                raise ChoiceError(f"choice {c!r} is {len(t)} tokens for this tokenizer; choice_probs needs single tokens")
            ids.append(t[0])
        if len(set(ids)) != len(ids):
            raise ChoiceError(f"choices {list(choices)} map to repeated token ids {ids}")
        if len(ids) > self.logprobs:
            raise ValueError(f"{len(ids)} choices but the engine returns at most {self.logprobs} log-probs; "
                             "build the judge with logprobs >= the number of choices")
        if not conversations:
            return ids, []
        prompts = [p for p, _ in self._prompts(conversations)]
        # exact label log-probs: logprobs must equal len(logprob_token_ids) when both are set (vLLM 0.33)
        params = self._sampling(n=1, temperature=0.0, max_tokens=1, logprobs=len(ids), logprob_token_ids=list(ids))
        outs = self._generate(prompts, params)
        rows = []
        for out in outs:
            table = out.outputs[0].logprobs[0]  # {token_id: Logprob}: the sampled token + every choice id
            row = [float(table[t].logprob) if t in table else None for t in ids]
            rows.append(None if any(x is None for x in row) else row)
        return ids, rows

    def choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str]):
        import torch

        ids, rows = self._choice_logprobs(conversations, choices)
        probs = torch.full((len(rows), len(ids)), float("nan"))
        for i, row in enumerate(rows):
            if row is None:
                continue  # the engine did not report a choice: NaN (the caller marks the sample invalid)
            probs[i] = torch.softmax(torch.tensor(row, dtype=torch.float64), 0).float()
        return probs

    def raw_choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str], *,
                         reasons: list | None = None):
        """Exact full-vocabulary probabilities (see :meth:`JudgeBackend.raw_choice_probs`): ``exp`` of the
        log-probability vLLM reports for each choice id through ``logprob_token_ids`` (whatever its rank), under
        the engine's default ``logprobs_mode="raw_logprobs"`` (log-softmax of the raw logits over the whole
        vocabulary, before penalties and temperature). An engine built with another ``logprobs_mode`` is refused.
        A choice the engine did not report, or a NaN / positive log-probability, is NaN + reason."""
        import torch

        mode = self._logprobs_mode()
        if mode not in (None, "raw_logprobs"):
            raise ValueError(f"raw_choice_probs needs an engine with logprobs_mode='raw_logprobs' (full-vocabulary "
                             f"log-probabilities of the raw logits); this one uses {mode!r}")
        ids, rows = self._choice_logprobs(conversations, choices)
        probs = torch.full((len(rows), len(ids)), float("nan"))
        why: list[str | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            if row is None:
                why[i] = "the engine reported no log-probability for a choice"
                continue
            bad = [c for c, x in zip(choices, row) if not (x <= 1e-4)]  # NaN or above 0: off-scale (NaN-safe test)
            if bad:
                why[i] = f"unusable log-probability for {bad}: {row}"
                continue
            probs[i] = torch.exp(torch.tensor(row, dtype=torch.float64).clamp(max=0.0)).float()
        if reasons is not None:
            reasons[:] = why
        return probs

    def _logprobs_mode(self) -> str | None:
        """The engine's ``logprobs_mode`` when it can be read (None: unknown, vLLM's default is raw_logprobs)."""
        if self._engine_logprobs_mode is not None:
            return self._engine_logprobs_mode
        for path in (("llm_engine", "model_config", "logprobs_mode"), ("llm_engine", "vllm_config", "model_config",
                                                                        "logprobs_mode")):
            obj: Any = self.llm
            for name in path:
                obj = getattr(obj, name, None)
                if obj is None:
                    break
            if isinstance(obj, str):
                return obj
            v = getattr(obj, "value", None)  # an enum
            if isinstance(v, str):
                return v
        return None
