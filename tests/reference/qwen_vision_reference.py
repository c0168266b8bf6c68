#!/usr/bin/env python3
"""Qwen2-VL / Qwen3-VL / Qwen3.5 image preprocessing in numpy + PIL, written from the published
definition (Hugging Face transformers' Qwen2VLImageProcessor and its smart_resize): the
reference the qwen_vision stage is tested and benchmarked against. No transformers needed.

    patches, (t, h, w) = preprocess_image("photo.jpg")   # patches: float32 [t*h*w, 1536]

usage: qwen_vision_reference.py IMAGE [--max-pixels N] [--min-pixels N]: prints the grid and
the first values.
"""
import argparse, math

import numpy as np
from PIL import Image

# Qwen3.5's preprocessor_config.json
PATCH_SIZE, TEMPORAL_PATCH_SIZE, MERGE_SIZE = 16, 2, 2
MIN_PIXELS, MAX_PIXELS = 65536, 16777216
MEAN = STD = (0.5, 0.5, 0.5)


def smart_resize(height, width, factor=PATCH_SIZE * MERGE_SIZE, min_pixels=MIN_PIXELS,
                 max_pixels=MAX_PIXELS):
    """Sides rounded to multiples of factor, scaled to fit [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {height} / {width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patchify(frames, patch_size=PATCH_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE,
             merge_size=MERGE_SIZE):
    """frames: float32 [T, C, H, W] (T a multiple of temporal_patch_size) -> rows, grid."""
    t, c, h, w = frames.shape
    gt, gh, gw = t // temporal_patch_size, h // patch_size, w // patch_size
    x = frames.reshape(gt, temporal_patch_size, c, gh // merge_size, merge_size, patch_size,
                       gw // merge_size, merge_size, patch_size)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * temporal_patch_size * patch_size * patch_size), (gt, gh, gw)


def preprocess_image(path, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, mean=MEAN, std=STD,
                     patch_size=PATCH_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE,
                     merge_size=MERGE_SIZE):
    img = Image.open(path).convert("RGB")
    h, w = smart_resize(img.height, img.width, patch_size * merge_size, min_pixels, max_pixels)
    img = img.resize((w, h), resample=Image.BICUBIC)
    # rescale: float64 * 1/255 kept as float32; normalize: (x - mean) / std
    x = (np.asarray(img).astype(np.float64) * (1 / 255)).astype(np.float32)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    frames = np.repeat(x.transpose(2, 0, 1)[None], temporal_patch_size, axis=0)
    return patchify(frames, patch_size, temporal_patch_size, merge_size)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("image")
    ap.add_argument("--min-pixels", type=int, default=MIN_PIXELS)
    ap.add_argument("--max-pixels", type=int, default=MAX_PIXELS)
    a = ap.parse_args()
    rows, grid = preprocess_image(a.image, a.min_pixels, a.max_pixels)
    print("grid_thw", grid, "patches", rows.shape, "first", rows[0, :4])
