"""Inputs and file formats shared by the parity modules (scripts/parity.sh).

Runs in every virtual environment (the official packages' and ours): standard library, numpy and Pillow only.

``python scripts/parity/common.py inputs DIR`` writes DIR/images/* and DIR/inputs.json:
``{"images": [{"file", "mode", "size", "kind", "rgb"}], "prompts": [...]}``. ``rgb`` is False for inputs whose
colour mode is not RGB (gray, 16-bit gray, palette, transparent palette, RGBA, LA) and for EXIF-rotated photos.
rewardkit scores every input twice: with ``input_policy="official"`` (the default), which must equal the official
package on every input where the official call does not crash, and with ``input_policy="corrected"``, whose
difference per input kind is reported, not failed (docs/zoo.md, "Input policy").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: 20 prompts: plain, curly quotes, HTML entities (once and twice escaped), accents, mojibake that ftfy
#: repairs, CJK, emoji, odd whitespace, upper case, an over-long one (past every model's text window), empty
PROMPTS = [
    "a photo of a cat sitting on a mat",
    "A RED SPORTS CAR ON A MOUNTAIN ROAD",
    "\u201ca dog\u201d wearing a \u2018tiny\u2019 hat",
    "rock &amp; roll poster, &lt;neon&gt; letters",
    "fish &amp;amp; chips on a plate",
    "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e on a wooden table",
    "cafÃ© au lait in a blue cup",
    "\u4e00\u53ea\u732b\u5750\u5728\u57ab\u5b50\u4e0a",
    "\u5bcc\u58eb\u5c71\u306e\u5915\u713c\u3051\u3001\u6d6e\u4e16\u7d75\u98a8",
    "\U0001f431 cat and \U0001f436 dog, friends",
    "  multiple   spaces\tand\nnewlines  ",
    "Stra\u00dfe in M\u00fcnchen at night, rain",
    "an astronaut riding a horse, 4k, highly detailed, trending on artstation",
    "3 apples and 2 oranges",
    "don't stop: it's the end! (or isn't it?)",
    "a bowl of ramen \u2014 steam rising \u2026",
    "\u0627\u0644\u0642\u0637 \u0639\u0644\u0649 \u0627\u0644\u0633\u062c\u0627\u062f\u0629",
    " ".join(["a very long prompt about a quiet village by the sea at dawn with fishing boats"] * 12),
    "a",
    "",
]


def _pattern(w: int, h: int, seed: int):
    """A smooth, seeded RGB picture with structure at several scales (uint8 [h, w, 3])."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        fx, fy, ph = rng.uniform(0.5, 6.0), rng.uniform(0.5, 6.0), rng.uniform(0, 6.28)
        img[..., c] = 127.5 + 80 * np.sin(2 * np.pi * (fx * x / w + fy * y / h) + ph)
    img += rng.normal(0, 20, size=img.shape)
    cx, cy, r = rng.uniform(0.2, 0.8) * w, rng.uniform(0.2, 0.8) * h, rng.uniform(0.1, 0.4) * min(w, h)
    img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, size=3)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_inputs(out: Path) -> dict:
    import numpy as np
    from PIL import Image

    imgdir = out / "images"
    imgdir.mkdir(parents=True, exist_ok=True)
    specs = [  # name, size, mode, format
        ("rgb_224x224.png", (224, 224), "RGB", "PNG"),
        ("rgb_224x160.png", (224, 160), "RGB", "PNG"),   # longest side exactly 224 (HPSv2: no resize, no pad)
        ("rgb_160x224.png", (160, 224), "RGB", "PNG"),
        ("rgb_512x512.png", (512, 512), "RGB", "PNG"),
        ("rgb_640x360.png", (640, 360), "RGB", "PNG"),
        ("rgb_360x640.png", (360, 640), "RGB", "PNG"),
        ("rgb_97x61.png", (97, 61), "RGB", "PNG"),       # upsampled
        ("rgb_1000x250.png", (1000, 250), "RGB", "PNG"),  # 4:1
        ("rgb_301x300.png", (301, 300), "RGB", "PNG"),
        ("photo_320x240.jpg", (320, 240), "RGB", "JPEG"),
        ("gray_256x192.png", (256, 192), "L", "PNG"),
        ("gray_200x200.jpg", (200, 200), "L", "JPEG"),
        ("palette_200x150.png", (200, 150), "P", "PNG"),
        ("rgba_180x240.png", (180, 240), "RGBA", "PNG"),
        # the input kinds where rewardkit's corrected decoding and the official packages part (docs/zoo.md,
        # "Input policy"): EXIF-rotated photos, 16-bit gray, gray + alpha, a palette with a transparent index
        ("exif6_320x200.jpg", (320, 200), "RGB", "JPEG"),  # EXIF orientation 6: displayed rotated 90 degrees
        ("exif3_240x180.png", (240, 180), "RGB", "PNG"),   # orientation 3: displayed upside down
        ("gray16_256x160.png", (256, 160), "I;16", "PNG"),  # 16-bit gray over the whole 0-65535 range
        ("la_200x240.png", (200, 240), "LA", "PNG"),
        ("ptrans_220x150.png", (220, 150), "P", "PNG"),     # palette, index 0 transparent
    ]
    images = []
    for i, (name, (w, h), mode, fmt) in enumerate(specs):
        arr = _pattern(w, h, seed=100 + i)
        im = Image.fromarray(arr, "RGB")
        if mode == "L":
            im = im.convert("L")
        elif mode == "P":
            im = im.quantize(colors=64, method=Image.Quantize.MEDIANCUT)
            if name.startswith("ptrans"):  # the most frequent palette index is transparent
                im.info["transparency"] = int(np.bincount(np.asarray(im).ravel()).argmax())
        elif mode == "RGBA":
            alpha = np.tile(np.linspace(0, 255, w).astype(np.uint8), (h, 1))
            im = Image.fromarray(np.dstack([arr, alpha]), "RGBA")
        elif mode == "I;16":  # smooth 16-bit gray: most values above 255, as a real 16-bit file
            im = Image.fromarray((arr.astype(np.uint16).mean(-1) * 257).astype(np.uint16))
        elif mode == "LA":
            alpha = np.tile(np.linspace(255, 0, h).astype(np.uint8)[:, None], (1, w))
            alpha[:, : w // 3] = 0  # a fully transparent band
            im = Image.fromarray(np.dstack([np.asarray(im.convert("L")), alpha]), "LA")
        kw: dict = {"quality": 90} if fmt == "JPEG" else {}
        if name.startswith("exif"):
            exif = Image.Exif()
            exif[0x0112] = int(name[4])
            kw["exif"] = exif
        if "transparency" in im.info:
            kw["transparency"] = im.info["transparency"]
        im.save(imgdir / name, fmt, **kw)
        kind = name.split("_")[0]
        images.append({"file": f"images/{name}", "mode": mode, "size": [w, h], "kind": kind,
                       "rgb": mode == "RGB" and not name.startswith("exif")})
    spec = {"images": images, "prompts": PROMPTS}
    (out / "inputs.json").write_text(json.dumps(spec, indent=1, ensure_ascii=False))
    return spec


def read_inputs(root: str | Path) -> tuple[list[dict], list[str]]:
    """(images with absolute ``path`` added, prompts) of an inputs directory."""
    root = Path(root)
    spec = json.loads((root / "inputs.json").read_text())
    for im in spec["images"]:
        im["path"] = str(root / im["file"])
    return spec["images"], spec["prompts"]


def write_scores(path: str | Path, scores: dict, **info) -> None:
    """``scores``: {"<image file>\\t<prompt index>": float or None (the official call crashed) or a string
    (the error)}."""
    Path(path).write_text(json.dumps({"scores": scores, **info}, ensure_ascii=False, indent=0))


def key(image: dict, prompt_index: int) -> str:
    return f"{image['file']}\t{prompt_index}"


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "inputs":
        sys.exit("usage: common.py inputs DIR")
    s = write_inputs(Path(sys.argv[2]))
    print(f"  {len(s['images'])} images, {len(s['prompts'])} prompts -> {sys.argv[2]}")
