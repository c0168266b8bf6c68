#!/usr/bin/env python3
"""Builds an image-text dataset from the project's photos: resized and cropped variants at
ImageNet-like sizes, a caption per image, and manifest.jsonl beside them (plus, with
--webdataset, the same samples as tar shards).

usage: make_dataset.py OUT_DIR [--count N] [--webdataset SHARDS] [--seed S]
Needs the standard library and Pillow (python3-pil, which the demo's torchvision needs too):
images are resized and encoded in this process, in well under a second.
"""
import argparse, io, json, pathlib, random, sys, tarfile

from PIL import Image

HERE = pathlib.Path(__file__).resolve().parent.parent
PHOTOS = HERE / "tests" / "data" / "photos"
WORDS = ("a photo of a small red house near the lake at dawn with mountains behind "
         "children playing in the park dog running cat sleeping on the sofa street market "
         "busy city night lights forest path autumn leaves snow covered field").split()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=512)
    ap.add_argument("--webdataset", type=int, default=0, help="also write this many tar shards")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = pathlib.Path(a.out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    photos = sorted(p for p in PHOTOS.glob("*.jpg"))
    variants = []  # (source, width, quality)
    for p in photos:
        for w in (400, 500, 640, 800):  # ImageNet-like: most photos are 400-800 px wide
            variants.append((p, w))
    # Produce each distinct variant once (baseline 4:2:0 colour JPEGs, even heights), then reuse
    # it for several samples.
    files = []
    for i, (p, w) in enumerate(variants):
        dst = out / "img" / f"v{i:03d}.jpg"
        if not dst.exists():
            q = rng.choice((70, 75, 80))  # about the bytes per pixel of web photos
            with Image.open(p) as src:
                img = src.convert("RGB")
            h = max(2, round(img.height * w / img.width / 2) * 2)
            img.resize((w, h), Image.BICUBIC).save(dst, quality=q, subsampling="4:2:0")
        files.append(dst)
    lines = []
    for i in range(a.count):
        f = files[i % len(files)]
        caption = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 24)))
        lines.append({"id": f"s{i:06d}", "image": f"img/{f.name}", "text": caption})
    with open(out / "manifest.jsonl", "w") as m:
        for l in lines:
            m.write(json.dumps(l) + "\n")
    if a.webdataset:
        per = (len(lines) + a.webdataset - 1) // a.webdataset
        for s in range(a.webdataset):
            with tarfile.open(out / f"shard-{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
                for l in lines[s * per:(s + 1) * per]:
                    for ext, data in (("jpg", (out / l["image"]).read_bytes()), ("txt", l["text"].encode())):
                        info = tarfile.TarInfo(f"{l['id']}.{ext}")
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
    print(f"{out}: {a.count} samples from {len(files)} images")


if __name__ == "__main__":
    sys.exit(main())
