"""rewardkit's side of the parity check (runs in rewardkit's environment, scripts/parity.sh).

``python compare.py NAME INPUTS OFFICIAL_JSON MODEL_DIR SUMMARY_TSV [key=value ...]`` scores every (image, prompt)
pair of INPUTS with ``load_reward(NAME, model=MODEL_DIR, device="cpu", key=value...)`` (a value containing
``{dir}`` gets MODEL_DIR substituted, and then ``model=`` is not passed), compares with the official scores,
prints one line, appends a row to SUMMARY_TSV and exits 1 when an input is out of tolerance.

Every input is scored twice: with the default ``input_policy="official"``, which must equal the official package on
every input the official call scores (RGB or not: EXIF, 16-bit, gray, palette, transparency), and with
``input_policy="corrected"``, whose largest difference per input kind is printed and written to
``deviation.json`` beside OFFICIAL_JSON (the deviation table of docs/zoo.md), not failed.

``python compare.py --summary SUMMARY_TSV SECONDS`` prints the table.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import key, read_inputs  # noqa: E402

#: |official - rewardkit| <= RTOL * max(scale, |official|) on RGB inputs, scale = the model's largest |official score|
RTOL = 1e-5
#: rewardkit's deliberate refusals (NaN + this reason) where the official code returns a number: reported
DOCUMENTED_REFUSALS = {"prompt is empty"}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def rank_agreement(pairs: list[tuple[float, float]]) -> tuple[int, int]:
    """(concordant, total) image pairs: both sides order the two the same way (a tie on both sides agrees)."""
    agree = total = 0
    for i in range(len(pairs)):
        for j in range(i + 1, len(pairs)):
            a = (pairs[i][0] > pairs[j][0]) - (pairs[i][0] < pairs[j][0])
            b = (pairs[i][1] > pairs[j][1]) - (pairs[i][1] < pairs[j][1])
            agree += a == b
            total += 1
    return agree, total


def run(name: str, inputs: str, official_json: str, model_dir: str, summary: str, opts: list[str]) -> int:
    from rewardkit import load_reward

    images, prompts = read_inputs(inputs)
    official = json.loads(Path(official_json).read_text())
    kwargs: dict = {"device": "cpu"}
    uses_dir = False
    for o in opts:
        k, _, v = o.partition("=")
        if "{dir}" in v:
            uses_dir, v = True, v.replace("{dir}", model_dir)
        kwargs[k] = json.loads(v) if v[:1] in "[{0123456789-" or v in ("true", "false") else v
    if not uses_dir:
        kwargs["model"] = model_dir
    pairs = [(im, j) for im in images for j in range(len(prompts))]

    def score(policy: str) -> dict:
        reward = load_reward(name, **kwargs, input_policy=policy)
        texts = [prompts[j] for _, j in pairs] if reward.uses_prompt else None
        out = reward([im["path"] for im, _ in pairs], texts, on_error="nan")
        return {key(im, j): (float(s) if bool(v) else (e or "invalid"))
                for (im, j), s, v, e in zip(pairs, out.scores.tolist(), out.valid.tolist(), out.errors)}

    ours = score("official")
    corrected = score("corrected")

    # the model's score scale: the largest official |score| on RGB inputs (tiny random models give small scores, e.g.
    # P(Yes) ~ 1 / vocabulary, so a fixed absolute bound would be loose)
    scale = max((abs(v) for im, j in pairs if im["rgb"]
                 for v in [_num(official["scores"].get(key(im, j)))] if v is not None), default=1.0)
    rgb_diff, non_rgb_diff, bad = 0.0, 0.0, []
    notes: dict[str, float | str] = {}  # what is reported, not failed
    per_prompt: dict[int, list] = {}
    crashes = {"official": 0, "rewardkit": 0}
    for im, j in pairs:
        k = key(im, j)
        a, b = _num(official["scores"].get(k)), _num(ours[k])
        if a is None or b is None:
            crashes["official"] += a is None
            crashes["rewardkit"] += b is None
            if a is None:  # the official call crashed on this input: nothing to compare
                notes.setdefault(f"official crashes on {im['file'].split('/')[-1]} ({im['mode']})",
                                 str(official["scores"].get(k))[:90])
            elif ours[k] in DOCUMENTED_REFUSALS:
                notes.setdefault(f"rewardkit refuses: {ours[k]} (prompt {j})", "NaN + reason")

            else:
                bad.append(f"{im['file']} prompt {j} {prompts[j][:30]!r}: only rewardkit failed ({ours[k]})")
            continue
        d = abs(a - b)
        if im["rgb"]:
            rgb_diff = max(rgb_diff, d)
            per_prompt.setdefault(j, []).append((a, b))
            if d > RTOL * max(scale, abs(a)):
                bad.append(f"{im['file']} prompt {j} {prompts[j][:30]!r}: official {a:.8g} rewardkit {b:.8g}")
        else:  # input_policy="official" must give the official number on these too
            non_rgb_diff = max(non_rgb_diff, d)
            if d > RTOL * max(scale, abs(a)):
                bad.append(f"{im['file']} ({im['mode']}) prompt {j}: official {a:.8g} rewardkit {b:.8g}")
    deviation: dict[str, float] = {}  # input_policy="corrected": largest |difference| to the official number per kind
    for im, j in pairs:
        a, c = _num(official["scores"].get(key(im, j))), _num(corrected[key(im, j)])
        if a is not None and c is not None:
            kind = im.get("kind", im["mode"])
            deviation[kind] = max(deviation.get(kind, 0.0), abs(a - c))
    Path(official_json).with_name("deviation.json").write_text(json.dumps(
        {"model": name, "scale": scale, "corrected_minus_official_max_abs": deviation}, indent=1))
    agree = total = 0
    for rows in per_prompt.values():
        a_, t_ = rank_agreement(rows)
        agree += a_
        total += t_
    rank = agree / total if total else float("nan")
    notes_txt = [f"{k}: up to {v:.2g}" if isinstance(v, float) else f"{k}: {v}" for k, v in sorted(notes.items())]
    version = official.get("version", "?")
    status = "FAIL" if bad else "PASS"
    n_rgb = sum(len(r) for r in per_prompt.values())
    print(f"{name:12s} {official.get('package', '?')} {version}: max|diff| {rgb_diff:.3g} "
          f"({rgb_diff / scale:.2g} of the score scale {scale:.3g}) on {n_rgb} RGB pairs, "
          f"rank agreement {rank:.4f}; non-RGB max|diff| {non_rgb_diff:.3g}; crashes official "
          f"{crashes['official']} / rewardkit {crashes['rewardkit']}  {status}")
    for n in notes_txt:
        print(f"    note: {n}")
    print("    input_policy='corrected' vs official, max |diff| per input kind: "
          + ", ".join(f"{k} {v:.3g}" for k, v in sorted(deviation.items())))
    for b in bad[:8]:
        print(f"    out of tolerance: {b}")
    if len(bad) > 8:
        print(f"    ... {len(bad) - 8} more")
    with open(summary, "a") as fh:
        fh.write("\t".join([name, f"{official.get('package', '?')} {version}",
                            f"{rgb_diff:.2g} ({rgb_diff / scale:.1g} rel.)", f"{rank:.4f}",
                            "; ".join(k.split(" (")[0] if not isinstance(v, float) else f"{k} ({v:.2g})"
                                      for k, v in sorted(notes.items())) + ("; " if notes else "")
                            + "corrected policy: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(deviation.items())),
                            status]) + "\n")
    return 1 if bad else 0


def print_summary(summary: str, seconds: str) -> int:
    rows = [line.rstrip("\n").split("\t") for line in open(summary) if line.strip()]
    head = ["model", "official version", "max |diff| (RGB)", "rank agreement", "non-RGB / notes", "result"]
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) if rows else len(head[i]) for i in range(5)]
    print(f"\nparity with the official packages (tolerance {RTOL:g} x the model's score scale, {seconds} s)")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  " + head[5])
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5])
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        sys.exit(print_summary(sys.argv[2], sys.argv[3]))
    sys.exit(run(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]))
