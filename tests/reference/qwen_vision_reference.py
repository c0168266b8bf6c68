#!/usr/bin/env python3
"""Qwen2-VL / Qwen3-VL / Qwen3.5 image and video preprocessing in numpy + PIL (+ PyAV for
video), written from the published definition (Hugging Face transformers' Qwen2VLImageProcessor,
Qwen3VLVideoProcessor and their smart_resize, Qwen3VLProcessor's video timestamps): the
reference the qwen_vision and qwen_video stages are tested and benchmarked against. No
transformers needed.

    patches, (t, h, w) = preprocess_image("photo.jpg")   # patches: float32 [t*h*w, 1536]
    patches, (t, h, w), seconds = preprocess_video("clip.mp4")

usage: qwen_vision_reference.py IMAGE|VIDEO [--max-pixels N] [--min-pixels N]: prints the grid
and the first values.
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


# Qwen3VLVideoProcessor's defaults
VIDEO_FPS, MIN_FRAMES, MAX_FRAMES = 2, 4, 768
VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS = 128 * 32 * 32, 768 * 32 * 32


def video_smart_resize(num_frames, height, width, temporal_factor=TEMPORAL_PATCH_SIZE,
                       factor=PATCH_SIZE * MERGE_SIZE, min_pixels=VIDEO_MIN_PIXELS,
                       max_pixels=VIDEO_MAX_PIXELS):
    """smart_resize over num_frames * height * width."""
    if num_frames < temporal_factor:
        raise ValueError(f"t:{num_frames} must be larger than temporal_factor:{temporal_factor}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be smaller than 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def sample_frame_indices(total, video_fps, fps=VIDEO_FPS, min_frames=MIN_FRAMES,
                         max_frames=MAX_FRAMES):
    num_frames = int(total / video_fps * fps)
    num_frames = min(max(num_frames, min_frames), max_frames, total)
    return np.linspace(0, total - 1, num_frames).round().astype(int)


def timestamps(indices, video_fps, temporal_patch_size=TEMPORAL_PATCH_SIZE):
    """Each temporal patch's time: the mean of its first and last frame's index / fps."""
    indices = list(indices)
    if len(indices) % temporal_patch_size:
        indices += [indices[-1]] * (temporal_patch_size - len(indices) % temporal_patch_size)
    t = [i / video_fps for i in indices]
    return [(t[i] + t[i + temporal_patch_size - 1]) / 2 for i in range(0, len(t), temporal_patch_size)]


def preprocess_video(path, fps=VIDEO_FPS, min_frames=MIN_FRAMES, max_frames=MAX_FRAMES,
                     min_pixels=VIDEO_MIN_PIXELS, max_pixels=VIDEO_MAX_PIXELS, mean=MEAN, std=STD,
                     patch_size=PATCH_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE,
                     merge_size=MERGE_SIZE):
    """Frames as transformers' PyAV loader picks them (the stream's frame count and average
    rate, the i-th decoded frame), resized with PIL's bicubic -> rows, grid, timestamps."""
    import av
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        total, video_fps = stream.frames, float(stream.average_rate)
        indices = sample_frame_indices(total, video_fps, fps, min_frames, max_frames)
        wanted, frames = set(indices.tolist()), {}
        for i, frame in enumerate(container.decode(stream)):
            if i > indices[-1]:
                break
            if i in wanted:
                frames[i] = frame.to_ndarray(format="rgb24")
    frames = [frames[i] for i in indices]
    h, w = video_smart_resize(len(frames), frames[0].shape[0], frames[0].shape[1],
                              temporal_patch_size, patch_size * merge_size, min_pixels, max_pixels)
    resized = [np.asarray(Image.fromarray(f).resize((w, h), resample=Image.BICUBIC)) for f in frames]
    x = (np.stack(resized).astype(np.float64) * (1 / 255)).astype(np.float32)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    x = x.transpose(0, 3, 1, 2)  # [T, C, H, W]
    if len(x) % temporal_patch_size:
        pad = temporal_patch_size - len(x) % temporal_patch_size
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    rows, grid = patchify(x, patch_size, temporal_patch_size, merge_size)
    return rows, grid, timestamps(indices, video_fps, temporal_patch_size)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("image")
    ap.add_argument("--min-pixels", type=int, default=0, help="default: the kind's")
    ap.add_argument("--max-pixels", type=int, default=0, help="default: the kind's")
    a = ap.parse_args()
    if a.image.endswith((".mp4", ".mkv", ".webm", ".mov", ".avi")):
        rows, grid, seconds = preprocess_video(a.image, min_pixels=a.min_pixels or VIDEO_MIN_PIXELS,
                                               max_pixels=a.max_pixels or VIDEO_MAX_PIXELS)
        print("seconds", [f"{t:.1f}" for t in seconds])
    else:
        rows, grid = preprocess_image(a.image, a.min_pixels or MIN_PIXELS, a.max_pixels or MAX_PIXELS)
    print("grid_thw", grid, "patches", rows.shape, "first", rows[0, :4])
