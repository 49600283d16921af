"""Transcriptions of the RL hosts' own reward code, the references the host-name rewards are tested against.

Each function is a transcription (not a copy of the code path under test) with file and line cited:
- kvablack/ddpo-pytorch @ 1958463, ``ddpo_pytorch/rewards.py``;
- yifan123/flow_grpo @ ac4c86e, ``flow_grpo/rewards.py`` and ``flow_grpo/qwenvl.py``;
- NVlabs/DiffusionNFT @ 24af555, ``flow_grpo/rewards.py`` (the same jpeg formula, ``:8-30``).
"""

from __future__ import annotations

import io
import re

import numpy as np
import torch
from PIL import Image


def host_jpeg_incompressibility(images: torch.Tensor) -> np.ndarray:
    """ddpo_pytorch/rewards.py:7-19 (= flow_grpo/rewards.py:7-19): float NCHW [0, 1] -> uint8 by
    ``(x * 255).round().clamp(0, 255)`` (:10), NHWC (:11), PIL JPEG at quality 95 (:15), ``tell() / 1000`` (:16)."""
    arr = (images * 255).round().clamp(0, 255).to(torch.uint8).cpu().numpy().transpose(0, 2, 3, 1)
    sizes = []
    for a in arr:
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG", quality=95)
        sizes.append(buf.tell() / 1000)
    return np.array(sizes)


def ddpo_jpeg_compressibility(images: torch.Tensor) -> np.ndarray:
    """ddpo_pytorch/rewards.py:22-29: ``-rew`` (:26)."""
    return -host_jpeg_incompressibility(images)


def flow_grpo_jpeg_compressibility(images: torch.Tensor) -> np.ndarray:
    """flow_grpo/rewards.py:22-29: ``-rew/500`` (:27); DiffusionNFT flow_grpo/rewards.py:28 ``-rew / 500``."""
    return -host_jpeg_incompressibility(images) / 500


#: flow_grpo/qwenvl.py:40-58, ``self.task``: the triple-quoted string, opening and closing newline included
FLOW_GRPO_QWENVL_TASK = (
    "\n"
    "Your role is to evaluate the aesthetic quality score of given images.\n"
    "1. Bad: Extremely blurry, underexposed with significant noise, indiscernible\n"
    "subjects, and chaotic composition.\n"
    "2. Poor: Noticeable blur, poor lighting, washed-out colors, and awkward\n"
    "composition with cut-off subjects.\n"
    "3. Fair: In focus with adequate lighting, dull colors, decent composition but\n"
    "lacks creativity.\n"
    "4. Good: Sharp, good exposure, vibrant colors, thoughtful composition with\n"
    "a clear focal point.\n"
    "5. Excellent: Exceptional clarity, perfect exposure, rich colors, masterful\n"
    "composition with emotional impact.\n"
    "\n"
    "Please first provide a detailed analysis of the evaluation process, including the criteria for judging "
    "aesthetic quality, within the <Thought> tag. Then, give a final score from 1 to 5 within the <Score> tag.\n"
    "<Thought>\n"
    "[Analyze the evaluation process in detail here]\n"
    "</Thought>\n"
    "<Score>X</Score>\n"
)


def flow_grpo_qwenvl_messages(image) -> list:
    """flow_grpo/qwenvl.py:63-72: one user turn, the image then the task text."""
    return [{"role": "user", "content": [{"type": "image", "image": image},
                                         {"type": "text", "text": FLOW_GRPO_QWENVL_TASK}]}]


def flow_grpo_qwenvl_score(text: str) -> float:
    """flow_grpo/qwenvl.py:16-24 (extract_scores, one answer): first ``<Score>(\\d+)</Score>`` / 5, else 0."""
    m = re.search(r"<Score>(\d+)</Score>", text)
    return float(m.group(1)) / 5 if m else 0
