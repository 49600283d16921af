"""Stand-ins for vLLM that enforce vLLM 0.33's own rules, so that a call the real engine refuses fails here too.

The stand-ins are used whether or not the real ``vllm`` is importable: on a GPU machine with the ``vllm`` extra
installed the CPU tests run against exactly the same stand-ins (the real engine is exercised by
``tests/judges/test_vllm_gpu.py`` and ``benchmarks/gpu/vllm_smoke.py``). Errors are :class:`VLLMValidationError`,
a ``ValueError`` like the real ``vllm.exceptions.VLLMValidationError``, or a plain ``ValueError`` where vLLM
raises one, so ``rewardkit``'s CLI maps either to exit 2.

Rules, read from vLLM's source (vllm-project/vllm, the 0.33 line):

``vllm/sampling_params.py``
  * ``_MAX_TEMP = 1e-2`` and ``SamplingParams.__post_init__``: ``0 < temperature < 0.01`` is raised to 0.01
    (with a warning); ``seed == -1`` means None; ``logprobs is True`` means 1; ``stop`` str -> [str].
  * ``_verify_num_sequences``: ``n`` an int, >= 1 and <= ``VLLM_MAX_N_SEQUENCES`` (``vllm/envs.py``,
    default 16384).
  * ``_verify_args``: presence / frequency penalty in [-2, 2]; repetition_penalty finite and > 0; temperature
    finite and in [0, 2]; top_p in (0, 1]; top_k an int >= -1; min_p in [0, 1]; max_tokens >= 1; no empty
    stop string; logprobs >= 0 or -1.
  * ``_verify_greedy_sampling`` (temperature < ``_SAMPLING_EPS`` = 1e-5): top_p/top_k/min_p reset, ``n == 1``.
  * ``verify(model_config, ...)`` -> ``_validate_logprobs``: ``logprobs`` (-1 = vocab size) <=
    ``model_config.max_logprobs`` (``LLM(max_logprobs=...)``, default 20; -1 = vocab size);
    ``logprob_token_ids`` at most ``MAX_LOGPROB_TOKEN_IDS`` = 128 ids, each in [0, vocab); ``logprobs`` equal to
    their count when both are set.

``vllm/multimodal/processing/context.py`` (``BaseProcessingInfo.validate_num_items``, a
``VLLMValidationError``) and ``vllm/config/multimodal.py`` (``MultiModalConfig.get_limit_per_prompt``): at most
``limit_mm_per_prompt[modality]`` items per prompt (999 when the modality is not named; Qwen2.5-VL supports any
number), else ``"At most {limit} {modality}(s) may be provided in one prompt."``

The renderer's ``_validate_mm_uuids`` (``vllm/renderers/``; ``vllm/v1/engine/processor.py`` before the renderer
split), a plain ``ValueError``: ``multi_modal_uuids[m]``, if given, has the same length as
``multi_modal_data[m]`` (a single item counts as one), and names no modality without data.

Outputs (``vllm/v1/engine/logprobs.py`` + the sampler's ``logprob_token_ids`` path): with
``logprob_token_ids`` set, the first position's table holds the sampled token and *every* requested id,
whatever its rank; ``n`` completions per request.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace as NS
from typing import Any

SAMPLING_EPS = 1e-5  # vllm/sampling_params.py: _SAMPLING_EPS
MAX_TEMP = 1e-2  # vllm/sampling_params.py: _MAX_TEMP (temperatures in (0, 0.01) are raised to it)
MAX_LOGPROB_TOKEN_IDS = 128  # vllm/sampling_params.py: MAX_LOGPROB_TOKEN_IDS
DEFAULT_MAX_LOGPROBS = 20  # vllm/config/model.py: ModelConfig.max_logprobs
DEFAULT_MM_LIMIT = 999  # vllm/config/multimodal.py: get_limit_per_prompt for an unnamed modality
DEFAULT_MAX_N = 16384  # vllm/envs.py: VLLM_MAX_N_SEQUENCES


class VLLMValidationError(ValueError):
    """``vllm.exceptions.VLLMValidationError`` (a ``ValueError``), with its ``parameter`` / ``value``."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value


class StrictSamplingParams:
    """``vllm.SamplingParams`` restricted to the fields rewardkit uses, with vLLM's validation."""

    FIELDS = dict(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=1.0,
                  top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=None, max_tokens=16, logprobs=None,
                  logprob_token_ids=None, skip_special_tokens=True)

    def __init__(self, **kw):
        unknown = set(kw) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"SamplingParams got unexpected arguments {sorted(unknown)}")
        for k, v in {**self.FIELDS, **kw}.items():
            setattr(self, k, v)
        # __post_init__
        if 0 < self.temperature < MAX_TEMP:
            self.temperature = MAX_TEMP
        if self.seed == -1:
            self.seed = None
        self.stop = [] if self.stop is None else ([self.stop] if isinstance(self.stop, str) else list(self.stop))
        if self.logprobs is True:
            self.logprobs = 1
        self._verify_args()
        if self.temperature < SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")

    def _verify_args(self) -> None:
        max_n = int(os.environ.get("VLLM_MAX_N_SEQUENCES", DEFAULT_MAX_N))
        if not isinstance(self.n, int) or isinstance(self.n, bool):
            raise VLLMValidationError(f"n must be an int, but is of type {type(self.n)}")
        if self.n < 1:
            raise VLLMValidationError(f"n must be at least 1, got {self.n}.")
        if self.n > max_n:
            raise VLLMValidationError(f"n must be at most {max_n}, got {self.n}. To increase this limit, set the "
                                      "VLLM_MAX_N_SEQUENCES environment variable.")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise VLLMValidationError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise VLLMValidationError("repetition_penalty must be a finite number greater than zero")
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {self.temperature}.",
                                      parameter="temperature", value=self.temperature)
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

    def validate_logprobs(self, vocab_size: int, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> None:
        """What the engine checks against the model (``SamplingParams._validate_logprobs(model_config)``)."""
        if max_logprobs == -1:
            max_logprobs = vocab_size
        if num := self.logprobs:
            num = vocab_size if num == -1 else num
            if num > max_logprobs:
                raise VLLMValidationError(f"Requested sample logprobs of {num}, which is greater than max "
                                          f"allowed: {max_logprobs}", parameter="logprobs", value=num)
        ids = self.logprob_token_ids
        if ids is not None:
            if len(ids) > MAX_LOGPROB_TOKEN_IDS:
                raise VLLMValidationError(f"Requested logprob_token_ids of length {len(ids)}, which is greater "
                                          f"than max allowed: {MAX_LOGPROB_TOKEN_IDS}")
            bad = [t for t in ids if t < 0 or t >= vocab_size]
            if bad:
                raise VLLMValidationError(f"token_id(s) {bad} in logprob_token_ids contain out-of-vocab token ids. "
                                          f"Vocabulary size: {vocab_size}")
            if self.logprobs is not None and self.logprobs != len(ids):
                raise VLLMValidationError("When both logprobs and logprob_token_ids are set, logprobs must equal "
                                          f"len(logprob_token_ids). Got logprobs={self.logprobs}, "
                                          f"len(logprob_token_ids)={len(ids)}.")


def sampling_params_class():
    """The stand-in ``SamplingParams`` (always: the CPU tests never depend on whether vLLM is installed)."""
    return StrictSamplingParams


def _count_items(data: Any) -> int:
    return len(data) if isinstance(data, (list, tuple)) else 1


def validate_prompt(prompt: Any, limits: dict[str, int]) -> None:
    """vLLM's checks of one ``{"prompt", "multi_modal_data", "multi_modal_uuids"}`` prompt (see module doc)."""
    if not isinstance(prompt, dict) or not isinstance(prompt.get("prompt"), str):
        raise TypeError(f"this stand-in takes text prompts ({{'prompt': str, ...}}), got {type(prompt).__name__}")
    data = prompt.get("multi_modal_data") or {}
    uuids = prompt.get("multi_modal_uuids") or {}
    for modality, items in data.items():
        limit = limits.get(modality, DEFAULT_MM_LIMIT)
        if _count_items(items) > limit:
            raise VLLMValidationError(f"At most {limit} {modality}(s) may be provided in one prompt. "
                                      "Set `--limit-mm-per-prompt` to increase this limit.", parameter=modality)
    for modality in set(data) | set(uuids):
        if modality not in data:
            raise ValueError(f"multi_modal_data[{modality!r}] is empty but multi_modal_uuids[{modality!r}] is "
                             "missing.")
        if modality in uuids:
            u = uuids[modality] if isinstance(uuids[modality], (list, tuple)) else [uuids[modality]]
            if len(u) != _count_items(data[modality]):
                raise ValueError(f"If given, multi_modal_uuids[{modality!r}] must have same length as "
                                 f"multi_modal_data[{modality!r}], but got {len(u)} vs {_count_items(data[modality])}.")
            if any(x is not None and not isinstance(x, str) for x in u):
                raise ValueError(f"multi_modal_uuids[{modality!r}] must hold strings (or None), got {u}")


class StrictLLM:
    """A stand-in ``vllm.LLM`` over a tokenizer: ``generate`` has the real keyword-only signature, applies the
    engine's checks to every request (sampling params against the vocabulary and ``max_logprobs``, multimodal
    items against ``limit_mm_per_prompt``, uuids against the items), and tokenizes text prompts the way vLLM
    does (special tokens added unless ``tokenization_kwargs={"add_special_tokens": False}``), recording the
    token ids it would run.

    ``table`` maps token strings to log-probs; every other id shares the remaining probability mass evenly, so
    a ``logprob_token_ids`` request gets a value for every requested id, as the real engine gives. ``omit``
    names tokens this engine is made *not* to report (a broken engine, to test the NaN path). Sampled requests
    answer ``"s{seed}-{k}"`` (``"greedy"`` below vLLM's greedy threshold)."""

    def __init__(self, tokenizer, table=None, *, omit=(), max_logprobs: int = DEFAULT_MAX_LOGPROBS,
                 limit_mm_per_prompt: dict[str, int] | None = None, **engine_kwargs):
        self.tok, self.table, self.omit = tokenizer, dict(table or {}), set(omit)
        self.calls, self.token_ids = [], []
        self.max_logprobs = int(max_logprobs)
        self.limit_mm_per_prompt = dict(limit_mm_per_prompt or {})
        self.engine_kwargs = {**engine_kwargs, "max_logprobs": self.max_logprobs,
                              "limit_mm_per_prompt": self.limit_mm_per_prompt}

    def get_tokenizer(self):
        return self.tok

    def _logprob(self, token_id: int, full: dict[int, float]) -> float:
        if token_id in full:
            return full[token_id]
        rest = 1.0 - sum(math.exp(v) for v in full.values() if math.isfinite(v) and v <= 0)
        n_rest = max(len(self.tok) - len(full), 1)
        return math.log(rest / n_rest) if rest > 0 else -math.inf

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None):
        if isinstance(prompts, dict):
            prompts = [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        add_special = (tokenization_kwargs or {}).get("add_special_tokens", True)
        vocab = len(self.tok)
        for p, sp in zip(prompts, params):  # the engine validates every request before running any
            if not isinstance(sp, StrictSamplingParams):
                raise TypeError(f"params must be SamplingParams, got {type(sp).__name__}")
            sp.validate_logprobs(vocab, self.max_logprobs)
            validate_prompt(p, self.limit_mm_per_prompt)
        self.calls.append((prompts, params, tokenization_kwargs))
        outs = []
        for p, sp in zip(prompts, params):
            self.token_ids.append(self.tok(p["prompt"], add_special_tokens=add_special)["input_ids"])
            if sp.logprobs or sp.logprob_token_ids:
                full = {self.tok.convert_tokens_to_ids(t): v for t, v in self.table.items()}
                top = max(full, key=full.get) if full else 0
                wanted = list(sp.logprob_token_ids or sorted(full, key=full.get, reverse=True)[:sp.logprobs])
                hidden = {self.tok.convert_tokens_to_ids(t) for t in self.omit}
                lp = {t: NS(logprob=self._logprob(t, full)) for t in [top, *wanted] if t not in hidden}
                outs.append(NS(outputs=[NS(text="", token_ids=[top], logprobs=[lp]) for _ in range(sp.n)]))
            elif sp.temperature < SAMPLING_EPS:
                outs.append(NS(outputs=[NS(text="greedy", token_ids=[0], logprobs=None)]))
            else:
                outs.append(NS(outputs=[NS(text=f"s{sp.seed}-{k}", token_ids=[k], logprobs=None)
                                        for k in range(sp.n)]))
        return outs
