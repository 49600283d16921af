"""OCR reward throughput and exact-read rate on clean renders: Tesseract processes in parallel vs one at a time.

    python benchmarks/ocr_throughput.py [--n 40] [--workers 4]

Renders n images (384x128, Pillow's bundled font) with known words, scores them with ``load_reward("ocr")``
at num_workers=1 and num_workers=W side by side, and prints images/s and the fraction read exactly.
"""

from __future__ import annotations

import argparse
import time

WORDS = ["OPEN", "Hello World", "COFFEE SHOP", "Sale 50%", "rewardkit", "STOP", "Welcome Home", "Bakery",
         "EXIT", "Good Morning", "NO PARKING", "Happy Birthday", "Fresh Bread", "Hotel", "Library", "Diffusion",
         "Quantum Cafe", "Big Sale", "Pizza", "Sunrise 2026"]


def render(text, size=(384, 128), font_size=44):
    from PIL import Image, ImageDraw, ImageFont

    im = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(im)
    font = ImageFont.load_default(size=font_size)
    d.text(((size[0] - d.textlength(text, font=font)) / 2, (size[1] - font_size) / 2), text, fill="black", font=font)
    return im


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    from rewardkit import load_reward

    words = [WORDS[i % len(WORDS)] for i in range(args.n)]
    images = [render(w) for w in words]
    prompts = [f'a sign that says "{w}"' for w in words]
    print(f"{args.n} clean renders, 384x128")
    print(f"{'num_workers':>12s} {'wall s':>8s} {'images/s':>9s} {'exact reads':>12s}")
    for w in (1, args.workers):
        reward = load_reward("ocr", num_workers=w)
        t0 = time.perf_counter()
        out = reward(images, prompts)
        wall = time.perf_counter() - t0
        exact = float((out.scores == 1.0).float().mean())
        print(f"{w:12d} {wall:8.2f} {args.n / wall:9.1f} {exact:12.3f}")


if __name__ == "__main__":
    main()
