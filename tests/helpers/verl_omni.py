"""verl-omni's ``MultiVisualRewardManager``, transcribed for the tests of docs/integrations.md's verl section.

Source: verl-project/verl-omni @ a1139bafffb5b9711f0a6b6edff8ecaa60bfff30,
``verl_omni/reward_loop/reward_manager/multi.py`` (Apache-2.0): ``_filter_kwargs`` (lines 35-46), the parsing of
``config.reward.reward_functions`` in ``__init__`` (lines 65-112) and the per-sample loop of ``run_single`` (lines
141-191); ``load_extern_object`` is verl's (``verl/utils/import_utils.py``: ``load_module`` then ``getattr``),
here for a file path only. Left out, as they play no part in the NaN policy: the DataProto unpacking and
``_validate_visual_response`` (lines 115-139; the tests pass the keyword arguments the manager builds at lines
142-148 directly), and the event loop: ``await self.loop.run_in_executor(None, lambda: f(**kw))`` (line 170) is a
direct call ``f(**kw)``, which raises and returns the same.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def load_extern_object(module_path: str, object_name: str) -> object:
    """verl's ``load_extern_object`` for a file path: import the file as a module, return the named object."""
    spec = importlib.util.spec_from_file_location(Path(module_path).stem, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, object_name):
        raise AttributeError(f"Object not found in module: {object_name=}, {module_path=}.")
    return getattr(module, object_name)


def _filter_kwargs(all_kwargs: dict, sig: inspect.Signature) -> dict:
    # multi.py:35-46
    params = sig.parameters
    for param in params.values():
        if param.kind == inspect.Parameter.VAR_KEYWORD:
            return all_kwargs
    return {k: v for k, v in all_kwargs.items() if k in params}


class MultiVisualRewardManager:
    """``reward_functions``: the ``config.reward.reward_functions`` mapping (``{key: {path, name, weight,
    required, **extra}}``)."""

    def __init__(self, reward_functions: dict[str, dict[str, Any]]) -> None:
        # multi.py:65-112
        if not reward_functions:
            raise ValueError("MultiVisualRewardManager requires non-empty reward.reward_functions config")
        self._sub_rewards = []
        total_weight = 0.0
        _reserved_keys = {"path", "name", "weight", "required"}
        for key, entry in reward_functions.items():
            path = entry["path"]
            name = entry["name"]
            weight = float(entry.get("weight", 1.0))
            required_value = entry.get("required", False)
            if isinstance(required_value, str):
                normalized = required_value.lower()
                if normalized not in {"true", "false"}:
                    raise ValueError(f"Invalid required value: {required_value!r}")
                required = normalized == "true"
            elif isinstance(required_value, bool):
                required = required_value
            else:
                raise TypeError(f"required must be a boolean, got {type(required_value).__name__}")
            total_weight += weight
            extra_args = {k: v for k, v in entry.items() if k not in _reserved_keys}
            fn = load_extern_object(path, name)
            sig = inspect.signature(fn)
            is_async = inspect.iscoroutinefunction(fn)
            self._sub_rewards.append({"key": key, "fn": fn, "weight": weight, "required": required, "sig": sig,
                                      "is_async": is_async, "extra_args": extra_args})
        if total_weight <= 0:
            raise ValueError(f"Total weight of reward functions must be > 0, got {total_weight}. "
                             f"Check reward.reward_functions config.")

    def run_single(self, data_source: Any, solution_image: Any, ground_truth: Any, extra_info: dict) -> dict:
        # multi.py:141-191 (sync sub-rewards only: an async one is awaited there)
        all_kwargs = {"data_source": data_source, "solution_image": solution_image, "ground_truth": ground_truth,
                      "extra_info": extra_info}
        combined_score = 0.0
        reward_extra_info = {}
        for sub in self._sub_rewards:
            key, fn, weight, required = sub["key"], sub["fn"], sub["weight"], sub["required"]
            sub_kwargs = {**all_kwargs, **sub["extra_args"]}
            filtered_kwargs = _filter_kwargs(sub_kwargs, sub["sig"])
            try:
                assert not sub["is_async"], "the transcription runs sync sub-rewards only"
                result = fn(**filtered_kwargs)
                if isinstance(result, dict):
                    score = float(result["score"])
                    for rk, rv in result.items():
                        if rk == "score":
                            continue
                        reward_extra_info[f"reward/{key}/{rk}"] = rv
                else:
                    score = float(result)
            except Exception as e:
                if required:
                    raise RuntimeError(f"Required sub-reward '{key}' failed: {e}") from e
                logger.error(f"Sub-reward '{key}' raised an exception: {e}. Contributing 0 to weighted sum.")
                score = 0.0
            reward_extra_info[f"reward/{key}"] = score
            combined_score += weight * score
        reward_extra_info["reward/combined"] = combined_score
        return {"reward_score": combined_score, "reward_extra_info": reward_extra_info}
