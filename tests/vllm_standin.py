"""Stand-ins for vLLM that enforce vLLM's own rules (read from vLLM 0.33.0's ``vllm/sampling_params.py`` and
``LLM.generate``), so that a call the real engine refuses fails here too. When the real ``vllm`` is
importable its ``SamplingParams`` is used instead of :class:`StrictSamplingParams`.

Rules enforced (``SamplingParams.__post_init__`` / ``_verify_args`` / ``_verify_greedy_sampling`` and
``_validate_logprobs``): ``n`` an int >= 1; temperature finite in [0, 2]; greedy (temperature < 1e-5) needs
``n == 1``; ``top_p`` in (0, 1]; ``top_k`` an int >= -1; ``min_p`` in [0, 1]; presence / frequency penalties
in [-2, 2]; ``repetition_penalty`` finite and > 0; ``max_tokens`` >= 1; no empty stop string; ``logprobs``
>= 0 or -1; ``logprob_token_ids`` at most 128 ids inside the vocabulary, and ``logprobs`` equal to their
count when both are set.
"""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

SAMPLING_EPS = 1e-5
MAX_LOGPROB_TOKEN_IDS = 128


class VLLMValidationError(ValueError):
    pass


class StrictSamplingParams:
    FIELDS = dict(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=1.0,
                  top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=None, max_tokens=16, logprobs=None,
                  logprob_token_ids=None)

    def __init__(self, **kw):
        unknown = set(kw) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"SamplingParams got unexpected arguments {sorted(unknown)}")
        for k, v in {**self.FIELDS, **kw}.items():
            setattr(self, k, v)
        self.stop = [] if self.stop is None else ([self.stop] if isinstance(self.stop, str) else list(self.stop))
        if not isinstance(self.n, int) or self.n < 1:
            raise VLLMValidationError(f"n must be at least 1, got {self.n}.")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise VLLMValidationError(f"{name} must be in [-2, 2]")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise VLLMValidationError("repetition_penalty must be a finite number > 0")
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise VLLMValidationError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if any(not s for s in self.stop):
            raise VLLMValidationError("stop cannot contain an empty string.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise VLLMValidationError(f"logprobs must be non-negative or -1, got {self.logprobs}.")
        if self.temperature < SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")

    def verify(self, vocab_size: int) -> None:
        """What the engine checks against the model (``SamplingParams.verify`` -> ``_validate_logprobs``)."""
        ids = self.logprob_token_ids
        if ids is not None:
            if len(ids) > MAX_LOGPROB_TOKEN_IDS:
                raise VLLMValidationError("too many logprob_token_ids")
            if any(t < 0 or t >= vocab_size for t in ids):
                raise VLLMValidationError("out-of-vocab token ids in logprob_token_ids")
            if self.logprobs is not None and self.logprobs != len(ids):
                raise VLLMValidationError("When both logprobs and logprob_token_ids are set, logprobs must equal "
                                          "len(logprob_token_ids).")


def sampling_params_class():
    """The real ``vllm.SamplingParams`` when vLLM is installed, else the strict stand-in."""
    try:
        import vllm  # noqa: F401

        return vllm.SamplingParams
    except ImportError:
        return StrictSamplingParams


class StrictLLM:
    """A stand-in ``vllm.LLM`` over a tokenizer: ``generate`` has the real keyword-only signature, verifies
    every request's params, and tokenizes text prompts the way vLLM does (special tokens added unless
    ``tokenization_kwargs={"add_special_tokens": False}``), recording the token ids it would run.

    ``table`` maps token strings to log-probs for one-token log-prob requests; sampled requests answer
    ``"s{seed}-{k}"`` (or ``"greedy"`` at temperature 0)."""

    def __init__(self, tokenizer, table=None, **engine_kwargs):
        self.tok, self.table, self.calls, self.token_ids = tokenizer, dict(table or {}), [], []
        self.engine_kwargs = engine_kwargs

    def get_tokenizer(self):
        return self.tok

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        add_special = (tokenization_kwargs or {}).get("add_special_tokens", True)
        self.calls.append((prompts, params, tokenization_kwargs))
        outs = []
        for p, sp in zip(prompts, params):
            if hasattr(sp, "verify"):
                sp.verify(len(self.tok))
            self.token_ids.append(self.tok(p["prompt"], add_special_tokens=add_special)["input_ids"])
            if sp.max_tokens == 1 and sp.logprobs:
                full = {self.tok.convert_tokens_to_ids(t): v for t, v in self.table.items()}
                top = max(full, key=full.get)
                lp = {t: NS(logprob=full[t]) for t in [top, *sp.logprob_token_ids] if t in full}
                outs.append(NS(outputs=[NS(text="", logprobs=[lp])]))
            elif sp.temperature < SAMPLING_EPS:
                outs.append(NS(outputs=[NS(text="greedy", logprobs=None)]))
            else:
                outs.append(NS(outputs=[NS(text=f"s{sp.seed}-{k}", logprobs=None) for k in range(sp.n)]))
        return outs
