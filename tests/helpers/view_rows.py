"""Score files as `rewardkit score` writes them, for the `rewardkit view` tests (data and browser)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "images"
XSS = ['a <script>window.__xss=1</script> cat', '"><img src=x onerror="window.__xss=2">', "{{JS}} {{DATA}}"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def score_rows(folder: Path) -> list[dict]:
    """Rows as `rewardkit score` writes them: a judge with dimensions, rationale and details; an invalid row."""
    for p in EXAMPLES.glob("*.png"):
        shutil.copy(p, folder / p.name)
    return [
        {"image": str(folder / "t2i_red_apple.png"), "prompt": XSS[0], "score": 0.8125, "valid": True, "error": None,
         "dimensions": {"alignment": 0.75, "quality": 4.0}, "rationale": "The apple is red.\nTable visible.",
         "details": {"dimensions": {"alignment": {"r": 0.75, "hypotheses": [
             {"score": 4, "rationale": "<b>red</b>", "verdict": 1.0, "raw": "Score: 4"},
             {"score": 2, "rationale": "blurry", "verdict": 0.0, "raw": "Score: 2"}]}}}},
        {"image": str(folder / "t2i_house_sunset.png"), "prompt": XSS[1], "score": None, "valid": False,
         "error": "alignment: 3/3 hypotheses unparseable; last answer: '</script><script>window.__xss=3</script>'",
         "dimensions": {"alignment": None, "quality": None}},
        {"image": str(folder / "t2i_open_sign.png"), "prompt": XSS[2], "score": -0.00002, "valid": True,
         "error": None, "dimensions": {"alignment": 0.25, "quality": 1.5}},
    ]
