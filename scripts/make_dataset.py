#!/usr/bin/env python3
"""Builds an image-text dataset from the project's photos: resized and cropped variants at
ImageNet-like sizes, a caption per image, and manifest.jsonl beside them (plus, with
--webdataset, the same samples as tar shards).

usage: make_dataset.py OUT_DIR [--count N] [--webdataset SHARDS] [--seed S]
Needs only the standard library and OpenCV's Python-free path: images are produced by
ffmpeg (scale/crop), so nothing beyond Debian's ffmpeg is required.
"""
import argparse, json, os, random, subprocess, sys, tarfile, io, pathlib

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
    # Produce each distinct variant once with ffmpeg, then reuse it for several samples.
    files = []
    for i, (p, w) in enumerate(variants):
        dst = out / "img" / f"v{i:03d}.jpg"
        if not dst.exists():
            q = rng.choice((3, 4, 5))  # ffmpeg mjpeg qscale: ~ quality 85-92
            subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(p), "-vf",
                            f"scale={w}:-2:flags=bicubic", "-q:v", str(q), str(dst)], check=True)
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
