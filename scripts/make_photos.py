#!/usr/bin/env python3
"""Makes a varied set of JPEG photos from the project's own (tests/data/photos): random crops
of them resized to odd sizes in both orientations, encoded with 4:4:4, 4:2:2 and 4:2:0 chroma
subsampling, some progressive, some grayscale, quality 75-95. The defaults give ImageNet-like
photos (240-620 px wide, median about 430x350). Deterministic for a seed.

usage: make_photos.py OUT_DIR [--count N] [--min-width W] [--max-width W] [--seed S] [--prefix P]
Writes OUT_DIR/<prefix>NNNN.jpg and OUT_DIR/<prefix>photos.json (one entry per file: name,
width, height, subsampling, progressive, gray, quality). Needs python3-pil.
"""
import argparse, json, pathlib, random

from PIL import Image

PHOTOS = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "photos"
SUBSAMPLING = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}


def make(out, count, min_width, max_width, seed=0, prefix="p"):
    rng = random.Random(seed)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sources = [Image.open(p).convert("RGB") for p in sorted(PHOTOS.glob("photo??.jpg"))]
    entries = []
    for i in range(count):
        src = sources[i % len(sources)]
        # Mostly landscape, some portrait: height/width in [0.6, 0.9] or [1.1, 1.5].
        aspect = rng.uniform(0.6, 0.9) if rng.random() < 0.7 else rng.uniform(1.1, 1.5)
        width = rng.randint(min_width, max_width)
        height = max(16, round(width * aspect))
        # A random part of the source with that aspect ratio, at least half its shorter side.
        side = rng.uniform(0.5, 1.0) * min(src.width, src.height / aspect)
        cw, ch = max(8, int(side)), max(8, int(side * aspect))
        cw, ch = min(cw, src.width), min(ch, src.height)
        x, y = rng.randint(0, src.width - cw), rng.randint(0, src.height - ch)
        img = src.crop((x, y, x + cw, y + ch)).resize((width, height), Image.LANCZOS)
        gray = i % 7 == 3
        progressive = i % 5 == 1
        subsampling = i % 3
        quality = rng.randint(75, 95)
        if gray:
            img = img.convert("L")
        name = f"{prefix}{i:04d}.jpg"
        img.save(out / name, "JPEG", quality=quality, progressive=progressive,
                 subsampling=subsampling if not gray else 0)
        entries.append({"name": name, "width": width, "height": height, "gray": gray,
                        "subsampling": None if gray else SUBSAMPLING[subsampling],
                        "progressive": progressive, "quality": quality})
    (out / f"{prefix}photos.json").write_text(json.dumps(entries, indent=1) + "\n")
    return entries


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--min-width", type=int, default=240)
    ap.add_argument("--max-width", type=int, default=620)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix", default="p")
    a = ap.parse_args()
    make(a.out, a.count, a.min_width, a.max_width, a.seed, a.prefix)


if __name__ == "__main__":
    main()
