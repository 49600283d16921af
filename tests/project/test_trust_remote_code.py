"""Security (README): ``trust_remote_code`` is off unless passed, on every loader that accepts it."""

from __future__ import annotations

import inspect


def test_trust_remote_code_is_off_by_default():
    """README / Security: trust_remote_code is off unless passed."""
    from rewardkit.judges.transformers_backend import TransformersJudge
    from rewardkit.models.clip import CLIPBackbone
    from rewardkit.models.vlm import load_processor

    for fn in (load_processor, CLIPBackbone.__init__, TransformersJudge.__init__):
        assert inspect.signature(fn).parameters["trust_remote_code"].default is False, fn
