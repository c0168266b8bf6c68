#!/usr/bin/python3
"""The video stage against a reference that decodes every frame (PyAV, Debian's python3-av).

For each generated video (H.264/MP4 with B-frames, HEVC/MKV, VP9/WebM, AV1/MP4, H.264 at
NTSC 29.97 fps, one encoded with many short GOPs, and two without an index: H.264/MPEG-TS
and a Matroska file without cues) and each sampling mode, mmfeed-video's
pts, mask and pixels must equal what this script picks by the rule in
stages/video/video_sampler.h: the frame on screen at each target time (the last with
pts <= t), padding past the end. Pixels are swscale bilinear RGB24 in both, so they match
exactly. Every file is also sampled from memory (the path of a tar member's bytes), in the
other layout, and with frame-threaded decoding: all must agree.

Usage: video_reference_test.py --bin BUILD/bin
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
from fractions import Fraction

import av
import numpy as np

BIN = None
TMP = None
SIZE = (48, 64)  # H, W: small, so the reference's full decode stays fast

# name -> ffmpeg arguments after the input (testsrc2 shows a moving pattern and a frame counter).
VIDEOS = {
    "h264.mp4": ("testsrc2=size=320x240:rate=30", 8, ["-c:v", "libx264", "-g", "48", "-bf", "3", "-pix_fmt", "yuv420p"]),
    "h264_ntsc.mp4": ("testsrc2=size=320x240:rate=30000/1001", 6, ["-c:v", "libx264", "-pix_fmt", "yuv420p"]),
    "h264_shortgop.mkv": ("testsrc2=size=320x240:rate=25", 6, ["-c:v", "libx264", "-g", "10", "-pix_fmt", "yuv420p"]),
    "hevc.mkv": ("testsrc2=size=320x240:rate=25", 6, ["-c:v", "libx265", "-x265-params", "keyint=40:log-level=error", "-pix_fmt", "yuv420p"]),
    "vp9.webm": ("testsrc2=size=320x240:rate=24", 6, ["-c:v", "libvpx-vp9", "-g", "40", "-b:v", "300k", "-deadline", "realtime", "-cpu-used", "8"]),
    # MPEG-TS: no index, no frame size in headers, timestamps starting at 1.4 s.
    "h264.ts": ("testsrc2=size=320x240:rate=25", 6, ["-c:v", "libx264", "-g", "30", "-bf", "2", "-pix_fmt", "yuv420p"]),
    # Written to a pipe, so the muxer cannot go back to add cues: Matroska without an index.
    "h264_nocues.mkv": ("testsrc2=size=320x240:rate=25", 6, ["-c:v", "libx264", "-g", "30", "-pix_fmt", "yuv420p", "-f", "matroska", "-"]),
    "av1.mp4": ("testsrc2=size=160x120:rate=24", 3, ["-c:v", "libaom-av1", "-g", "24", "-cpu-used", "8", "-row-mt", "1", "-b:v", "200k"]),
}

MODES = [
    ("uniform16", {"sampling": "uniform", "frames": 16}),
    ("uniform5", {"sampling": "uniform", "frames": 5}),
    ("clip", {"sampling": "clip", "frames": 12, "fps": 4, "clip_start": "1.3"}),
    ("clip_fast", {"sampling": "clip", "frames": 10, "fps": 50, "clip_start": "0.45"}),
    ("clip_past_end", {"sampling": "clip", "frames": 8, "fps": 2, "clip_start": "2.2"}),
    ("timestamps", {"sampling": "timestamps", "timestamps": [0.0, 2.0, 1.2345, 0.04, 999.0, 0.5]}),
    ("keyframes", {"sampling": "keyframes", "frames": 4}),
]


def make_videos():
    for name, (src, seconds, args) in VIDEOS.items():
        path = os.path.join(TMP, name)
        cmd = ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", src, "-t", str(seconds)] + args
        if args[-1] == "-":
            with open(path, "wb") as out:
                subprocess.run(cmd, check=True, stdout=out)
        else:
            subprocess.run(cmd + [path], check=True)


class Reference:
    """Every frame of a video, decoded by PyAV, with the timeline the stage uses."""

    def __init__(self, path):
        with av.open(path) as c:
            s = c.streams.video[0]
            self.tb = Fraction(s.time_base)
            frames = []
            for f in c.decode(s):
                rgb = f.reformat(width=SIZE[1], height=SIZE[0], format="rgb24", interpolation="BILINEAR").to_ndarray()
                frames.append((f.pts, f.key_frame, rgb))
            self.start = s.start_time if s.start_time is not None else frames[0][0]
            if s.duration:
                self.end = self.start + s.duration
            else:  # the container's duration, rescaled as av_rescale_q does (round half away)
                x = Fraction(c.duration, 1000000) / self.tb
                self.end = self.start + int(math.floor(x + Fraction(1, 2)))
        frames.sort(key=lambda fr: fr[0])
        self.pts = [fr[0] for fr in frames]
        self.keys = [i for i, fr in enumerate(frames) if fr[1]]
        self.rgb = [fr[2] for fr in frames]

    def seconds(self, ts):
        return (ts - self.start) * (self.tb.numerator / self.tb.denominator)

    def on_screen(self, t):
        """Index of the frame shown t seconds after the start (the rule of video_sampler.h)."""
        target = self.start + math.floor((t + 1e-6) * self.tb.denominator / self.tb.numerator)
        best = 0
        for i, p in enumerate(self.pts):
            if p <= target:
                best = i
        return best

    def sample(self, params):
        """(frame index or None for padding) per output slot."""
        mode = params["sampling"]
        duration = self.seconds(self.end)
        if mode == "keyframes":
            T, K = params["frames"], len(self.keys)
            picks = [self.keys[int((i + 0.5) * K / T) if K >= T else i] for i in range(min(K, T))]
            return picks + [None] * (T - len(picks))
        if mode == "uniform":
            T = params["frames"]
            ts = [(i + 0.5) * duration / T for i in range(T)]
        elif mode == "clip":
            s = float(params["clip_start"])
            ts = [s + i / params["fps"] for i in range(params["frames"])]
        else:
            ts = params["timestamps"]
        return [self.on_screen(t) if t < duration else None for t in ts]


def run_stage(path, params, memory=False, layout="THWC"):
    p = dict(params, size=list(SIZE), layout=layout)
    out = os.path.join(TMP, "out")
    os.makedirs(out, exist_ok=True)
    cmd = [os.path.join(BIN, "mmfeed-video"), "--params", json.dumps(p), "--out", out, path]
    if memory:
        cmd.insert(1, "--memory")
    r = subprocess.run(cmd, capture_output=True, text=True)
    j = json.loads(r.stdout.strip().splitlines()[-1])
    if not j["ok"]:
        raise AssertionError(f"{path}: {j['error']}")
    return j, np.load(os.path.join(out, "0.npy"))


class VideoReferenceTest(unittest.TestCase):
    refs = {}

    @classmethod
    def setUpClass(cls):
        make_videos()
        for name in VIDEOS:
            cls.refs[name] = Reference(os.path.join(TMP, name))

    def check(self, name, mode, params):
        ref = self.refs[name]
        path = os.path.join(TMP, name)
        picks = ref.sample(params)
        got, frames = run_stage(path, params)
        where = f"{name} {mode}"
        self.assertEqual(got["mask"], [0 if k is None else 1 for k in picks], where)
        last = max((k for k in picks if k is not None), default=None)
        for slot, k in enumerate(picks):
            want = k if k is not None else last  # padding repeats the last frame in time
            self.assertAlmostEqual(got["pts"][slot], ref.seconds(ref.pts[want]), places=4,
                                   msg=f"{where} slot {slot}: picked pts {got['pts'][slot]}, reference frame {want}")
            np.testing.assert_array_equal(frames[slot], ref.rgb[want], err_msg=f"{where} slot {slot}")
        # The stage decodes a fraction of what the reference does.
        print(f"  {where}: decoded {got['decoded']} of {len(ref.pts)} frames, {got['seeks']} seeks", flush=True)

    def test_every_mode_matches_the_reference(self):
        for name in VIDEOS:
            for mode, params in MODES:
                with self.subTest(video=name, mode=mode):
                    self.check(name, mode, params)

    def test_memory_input_layouts_and_decoder_threads_agree(self):
        for mode in (0, 2):
            params = dict(MODES[mode][1])
            for name in VIDEOS:
                path = os.path.join(TMP, name)
                a, fa = run_stage(path, params)
                b, fb = run_stage(path, params, memory=True)
                c, fc = run_stage(path, params, layout="TCHW")
                d, fd = run_stage(path, dict(params, threads=3))  # frame threads, skipping per packet
                self.assertEqual(a["pts"], b["pts"], name)
                self.assertEqual(a["pts"], d["pts"], name)
                np.testing.assert_array_equal(fa, fb, err_msg=name)
                np.testing.assert_array_equal(fa, fc.transpose(0, 2, 3, 1), err_msg=name)
                np.testing.assert_array_equal(fa, fd, err_msg=name)


def main():
    global BIN, TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args, rest = ap.parse_known_args()
    BIN = os.path.abspath(args.bin)
    with tempfile.TemporaryDirectory(prefix="mmfeed-video-ref-") as tmp:
        TMP = tmp
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
