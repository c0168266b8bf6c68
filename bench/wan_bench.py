#!/usr/bin/python3
"""Wan2.2 clip benchmark: clips/s of configs/wan2.2-t2v.yaml's video stage (81 frames at 16 fps
from a random start, each scaled to cover 480x832 and center-cropped, CTHW float32 in [-1, 1])
against, in the same run on the same files, what a user writes without mmfeed: a PyTorch
Dataset that decodes every frame with PyAV, picks the frames on screen at start + i/16 s,
scales each to cover 480x832 with PIL and crops its center, normalizes to [-1, 1] and stacks
them CTHW, under DataLoader(num_workers=2, batch_size=None).

Sources: 30 fps videos at 720p and 1080p (8 s, a slow pan/zoom with film grain, x264
--preset veryfast, default GOP), made once with Debian's ffmpeg from the test photos (as
bench/video_bench.py makes its own). Also reported: decoded frames per output frame, and the
exact-decode limit as bench/video_bench.py measures it ("ffmpeg_refs_only": the cores doing
nothing but FFmpeg decoding the reference frames from the keyframe before each of mmfeed's
clips to its last frame; an estimate of the most an exact CPU loader can reach).

usage: wan_bench.py [--build BUILD] [--out DIR] [--videos N] [--repeat R]
"""
import argparse, json, os, pathlib, sys, time

import av
import numpy as np
import torch
import yaml
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import video_bench  # noqa: E402  (make_video, run_mmfeed)

CONFIG = ROOT / "configs" / "wan2.2-t2v.yaml"


def stage_params():
    cfg = yaml.safe_load(CONFIG.read_text())
    return next(s for s in cfg["stages"] if s["type"] == "video")["params"]


class PyAvClips(torch.utils.data.Dataset):
    """The reference a user writes: decode every frame, pick by timestamp, PIL cover + crop."""

    def __init__(self, files, frames, fps, size):
        self.files, self.frames, self.fps, (self.h, self.w) = files, frames, fps, size
        self.decoded = torch.zeros(1, dtype=torch.int64).share_memory_()

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        with av.open(str(self.files[i])) as c:
            s = c.streams.video[0]
            tb = float(s.time_base)
            decoded = [(f.pts * tb, f) for f in c.decode(s)]
        self.decoded += len(decoded)
        decoded.sort(key=lambda x: x[0])
        t0, length = decoded[0][0], decoded[-1][0] - decoded[0][0]
        start = t0 + rng.uniform(0, max(0.0, length - (self.frames - 1) / self.fps))
        out = np.empty((3, self.frames, self.h, self.w), np.float32)
        k = 0
        for n in range(self.frames):
            t = start + n / self.fps
            while k + 1 < len(decoded) and decoded[k + 1][0] <= t + 1e-6:
                k += 1
            img = decoded[k][1].to_image()
            scale = max(self.w / img.width, self.h / img.height)
            sw, sh = max(self.w, round(img.width * scale)), max(self.h, round(img.height * scale))
            img = img.resize((sw, sh), Image.BILINEAR)
            left, top = (sw - self.w) // 2, (sh - self.h) // 2
            a = np.asarray(img.crop((left, top, left + self.w, top + self.h)), np.float32)
            out[:, n] = a.transpose(2, 0, 1) / 127.5 - 1.0
        return torch.from_numpy(out)


def run_reference(files, params, repeat):
    ds = PyAvClips(files * repeat, params["frames"], params["fps"], params["size"])
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    t0 = time.perf_counter()
    n = sum(1 for _ in loader)
    secs = time.perf_counter() - t0
    return {"clips_per_s": n / secs, "decoded_per_sampled": ds.decoded.item() / (n * params["frames"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "wan"))
    ap.add_argument("--videos", type=int, default=2, help="videos per resolution")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    params = stage_params()
    torch.set_num_threads(1)
    results = {"cores": os.cpu_count(), "params": params}
    for w, h in ((1280, 720), (1920, 1080)):
        files = video_bench.clip_videos(out, w, h, a.videos)
        mm = video_bench.run_mmfeed(a.build, params, files, a.repeat)
        ref = run_reference(files, params, a.repeat)
        limit = video_bench.ffmpeg_refs_only(video_bench.sampled_clips(a.build, params, files, a.repeat))
        results[f"{h}p"] = {"mmfeed": mm, "pyav_dataloader": ref, "ffmpeg_refs_only": limit,
                            "ratio": mm["clips_per_s"] / ref["clips_per_s"],
                            "of_limit": mm["clips_per_s"] / limit["clips_per_s"]}
    print(json.dumps(results, indent=2))
    print("\n| source | mmfeed clips/s | decoded frames per output frame | PyAV + PIL, DataLoader(num_workers=2) clips/s | "
          "decoded per output frame | ratio | exact-decode limit clips/s | mmfeed / limit |")
    print("|---|---|---|---|---|---|---|---|")
    for k in ("720p", "1080p"):
        r = results[k]
        print(f"| {k} 30 fps | {r['mmfeed']['clips_per_s']:.2f} | {r['mmfeed']['decoded_per_sampled']:.2f} | "
              f"{r['pyav_dataloader']['clips_per_s']:.2f} | {r['pyav_dataloader']['decoded_per_sampled']:.2f} | "
              f"**{r['ratio']:.2f}x** | {r['ffmpeg_refs_only']['clips_per_s']:.2f} | {r['of_limit']:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
