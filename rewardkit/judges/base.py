"""The judge backend protocol shared by every MLLM-as-judge reward.

A *conversation* is a chat in the Hugging Face messages format, with images embedded in order::

    [{"role": "system", "content": "You are a strict judge."},
     {"role": "user", "content": [{"type": "image", "image": <PIL.Image>},
                                  {"type": "text", "text": "Is there a green bowl? Answer Yes or No."}]}]

Backends receive *batches* of conversations. They are expected to exploit what the batch shares: a
backend sees the same image (by content) and the same leading messages across many conversations and
must encode each distinct image once per call and prefill a shared prefix once (transformers: KV-cache
reuse; vLLM: prefix caching; OpenAI-compatible servers: their own prefix cache).
"""

from __future__ import annotations

import abc
import math
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

Message = dict[str, Any]
Conversation = list[Message]

__all__ = ["Message", "Conversation", "JudgeBackend", "ChoiceError", "MAX_TEMPERATURE", "check_temperature",
           "check_choices", "continues_final_message", "DECIMAL"]

#: The one number rule of every judge answer parser: a plain non-negative decimal in ASCII digits ("4", "3.5").
#: Python's ``\d`` would also read "４" (fullwidth), "٣" (Arabic-Indic) or "४" (Devanagari) as digits, and
#: ``float()`` would turn them into a score; no sign, no exponent, no "nan" / "inf". Use it inside a regex.
DECIMAL = r"[0-9]+(?:\.[0-9]+)?"

#: The highest sampling temperature: vLLM refuses more (``SamplingParams._verify_args``: "temperature must be
#: in [0, 2]"), so every backend and every judge reward accepts the same range.
MAX_TEMPERATURE = 2.0


def check_temperature(temperature: Any, what: str = "temperature") -> float:
    """The one temperature rule for every judge backend and judge reward: a finite number in [0, 2]."""
    ok = isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
    if not ok or not math.isfinite(temperature) or not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"{what} must be a number in [0, {MAX_TEMPERATURE:g}] (the range vLLM accepts), "
                         f"got {temperature!r}")
    return float(temperature)


class ChoiceError(ValueError):
    """A label passed to ``choice_probs`` is not a single token for the backend's tokenizer."""


def check_choices(choices: Sequence[str]) -> None:
    """The same rule on every backend: choices are distinct, non-empty strings (:class:`ChoiceError`)."""
    if not choices or any(not isinstance(c, str) or not c for c in choices) or len(set(choices)) != len(choices):
        raise ChoiceError(f"choices must be distinct non-empty strings, got {list(choices)}")


def continues_final_message(conv: Conversation) -> bool:
    """A conversation ending in an assistant message is continued (its text is the start of the answer), on
    every backend: ``continue_final_message=True`` instead of a new generation prompt."""
    return bool(conv) and conv[-1].get("role") == "assistant"


class JudgeBackend(abc.ABC):
    """Two operations over batches of multimodal conversations (plus the optional :meth:`raw_choice_probs`)."""

    #: backend kind, e.g. "transformers", "vllm", "openai"
    kind: str = ""

    @abc.abstractmethod
    def generate(
        self,
        conversations: Sequence[Conversation],
        *,
        n: int = 1,
        temperature: float = 0.0,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> list[list[str]]:
        """``n`` completions per conversation -> ``B`` lists of ``n`` strings (assistant turn continuations)."""

    @abc.abstractmethod
    def choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str]):
        """Probabilities over single-token answers at the start of the assistant turn.

        Returns a float32 tensor ``[B, len(choices)]`` whose rows sum to 1 (next-token log-probabilities of
        the choice tokens, renormalised over the choices). Raises :class:`ChoiceError` when a choice is not
        exactly one token.
        """

    def raw_choice_probs(self, conversations: Sequence[Conversation], choices: Sequence[str], *,
                         reasons: list | None = None):
        """Full-vocabulary probabilities of single-token answers at the start of the assistant turn.

        Returns a float32 tensor ``[B, len(choices)]``: ``softmax(logits over the whole vocabulary)[choice
        token]`` at the first answer position, **not** renormalised over the choices (a row sums to at most 1).
        An entry the backend cannot know exactly is NaN, never a guess or a bound; with ``reasons`` (a list)
        it is filled with one entry per conversation, None or why that row holds a NaN. Raises
        :class:`ChoiceError` when a choice is not exactly one token. Backends without access to full-vocabulary
        log-probabilities raise ``NotImplementedError`` (the default).

        :meth:`choice_probs` is the renormalised form: ``choice_probs = raw / raw.sum(-1)`` where both exist.
        """
        raise NotImplementedError(f"the {self.kind or type(self).__name__} judge backend does not expose "
                                  "full-vocabulary choice probabilities (raw_choice_probs)")

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable identity of the backend (recorded in reward outputs' ``info``)."""
        return {"kind": self.kind}

    @contextmanager
    def session(self) -> Iterator["JudgeBackend"]:
        """Scope within which the backend may keep per-image work (encoded features) between calls.

        A reward wraps one ``__call__`` (several ``generate`` / ``choice_probs`` calls about the same images)
        in ``with judge.session():`` so each distinct image is encoded once per reward call. The default
        keeps nothing.
        """
        yield self
