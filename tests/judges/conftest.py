"""Fixtures shared by the judge tests."""

from __future__ import annotations

import sys
import types

import pytest

from tests.helpers.vllm_standin import StrictLLM


@pytest.fixture
def vllm_stub(monkeypatch):
    """A ``vllm`` module whose ``LLM(model=..., **kw)`` records its arguments and validates ``dtype`` the way
    vLLM's ModelConfig does."""
    from tests.helpers.vllm_standin import sampling_params_class

    stub = types.ModuleType("vllm")
    stub.SamplingParams = sampling_params_class()
    stub.created = []

    class LLM(StrictLLM):
        def __init__(self, model, **kw):
            if kw.get("dtype", "auto") not in ("auto", "half", "float16", "bfloat16", "float", "float32"):
                raise ValueError(f"Unknown dtype: {kw['dtype']}")
            from transformers import AutoTokenizer

            super().__init__(AutoTokenizer.from_pretrained(model), {"Yes": -1.0, "No": -2.0}, **kw)
            stub.created.append(self)

    stub.LLM = LLM
    monkeypatch.setitem(sys.modules, "vllm", stub)
    return stub
