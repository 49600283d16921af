"""Draw the example images shipped with rewardkit (run from anywhere: ``python examples/images/make_images.py``).

Every image is drawn here with PIL primitives (no photographs, no third-party artwork), so the folder is the
project's own work, dedicated to the public domain (CC0 1.0, see LICENSE). Deterministic: the same PNGs
every run.
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent
SIZE = 256


def _sky_and_grass(sky=(135, 190, 235), grass=(80, 160, 70), horizon=170) -> Image.Image:
    img = Image.new("RGB", (SIZE, SIZE), sky)
    ImageDraw.Draw(img).rectangle([0, horizon, SIZE, SIZE], fill=grass)
    return img


def red_apple() -> Image.Image:
    img = Image.new("RGB", (SIZE, SIZE), (245, 240, 225))
    d = ImageDraw.Draw(img)
    d.rectangle([0, 190, SIZE, SIZE], fill=(150, 110, 70))               # table
    d.ellipse([78, 88, 178, 188], fill=(200, 30, 35))                    # apple
    d.rectangle([125, 68, 131, 92], fill=(90, 60, 30))                   # stem
    d.ellipse([131, 66, 161, 82], fill=(60, 150, 60))                    # leaf
    return img


def house_at_sunset() -> Image.Image:
    img = _sky_and_grass(sky=(250, 170, 110), grass=(70, 120, 60), horizon=180)
    d = ImageDraw.Draw(img)
    d.ellipse([170, 40, 230, 100], fill=(255, 220, 90))                  # sun
    d.rectangle([60, 110, 160, 190], fill=(230, 220, 200))               # walls
    d.polygon([(50, 112), (110, 60), (170, 112)], fill=(150, 50, 40))    # roof
    d.rectangle([98, 145, 122, 190], fill=(100, 60, 30))                 # door
    d.rectangle([72, 125, 92, 145], fill=(120, 170, 220))                # window
    return img


def text_sign() -> Image.Image:
    img = Image.new("RGB", (SIZE, SIZE), (40, 40, 48))
    d = ImageDraw.Draw(img)
    d.rectangle([28, 88, 228, 168], fill=(250, 250, 250), outline=(200, 40, 40), width=6)
    d.text((70, 120), "OPEN 24H", fill=(20, 20, 20))                      # PIL's built-in bitmap font
    return img


def ball(color) -> Image.Image:
    img = _sky_and_grass()
    d = ImageDraw.Draw(img)
    d.ellipse([88, 120, 168, 200], fill=color)
    d.ellipse([108, 136, 124, 152], fill=tuple(min(255, c + 70) for c in color))  # highlight
    return img


IMAGES = {
    "t2i_red_apple.png": red_apple,
    "t2i_house_sunset.png": house_at_sunset,
    "t2i_open_sign.png": text_sign,
    "edit_source_blue_ball.png": lambda: ball((40, 70, 200)),
    "edit_result_red_ball.png": lambda: ball((205, 35, 40)),
    "edit_result_green_ball.png": lambda: ball((40, 170, 60)),
}

T2I = [
    {"prompt": "a red apple on a wooden table", "image": "t2i_red_apple.png"},
    {"prompt": "a small house with a red roof at sunset", "image": "t2i_house_sunset.png"},
    {"prompt": "a shop sign that says \"OPEN 24H\"", "image": "t2i_open_sign.png"},
]
EDIT = [
    {"prompt": "make the ball red", "image": "edit_result_red_ball.png", "sources": ["edit_source_blue_ball.png"]},
    {"prompt": "make the ball red", "image": "edit_result_green_ball.png", "sources": ["edit_source_blue_ball.png"]},
]


def main() -> None:
    for name, draw in IMAGES.items():
        draw().save(HERE / name, optimize=True)
    for fname, rows in (("t2i.jsonl", T2I), ("edit.jsonl", EDIT)):
        (HERE / fname).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
