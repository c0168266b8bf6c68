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

Usage: video_reference_test.py --bin BUILD/bin [--sanitized]
"""
import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest
from fractions import Fraction

import av
import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import video_limit  # noqa: E402  (qwen_clips: the qwen_video stage's picks, for the limit)

BIN = None
TMP = None
SANITIZED = False  # --sanitized: the sanitizer build's shorter run (tests/CMakeLists.txt)
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
        if os.path.exists(path):
            continue
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
    p = dict(params, layout=layout)
    p.setdefault("size", list(SIZE))
    out = os.path.join(TMP, "out")
    os.makedirs(out, exist_ok=True)
    cmd = [os.path.join(BIN, "mmfeed-video"), "--params", json.dumps(p), "--out", out, path]
    if memory:
        cmd.insert(1, "--memory")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if not r.stdout.strip():
        raise AssertionError(f"{path}: mmfeed-video exited {r.returncode}: {r.stderr}")
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
        for mode in (0,) if SANITIZED else (0, 2):
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

    def test_frames_at_their_own_size_match_and_nothing_is_written_past_them(self):
        # Output size = the source's: swscale converts without resizing, and that path writes
        # whole blocks of 16 pixels, 24 bytes past a 200-pixel row (the stage's buffer has the
        # room). mmfeed-video fails when its canary after the output is touched; a sanitizer
        # cannot see it (the write is inside libswscale).
        path = os.path.join(TMP, "w200.mp4")
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc2=size=200x120:rate=25",
                        "-t", "2", "-c:v", "libx264", "-pix_fmt", "yuv420p", path], check=True)
        with av.open(path) as c:
            want = {f.pts: f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])}
        keys = sorted(want)
        for memory in (False, True):
            got, frames = run_stage(path, {"sampling": "keyframes", "frames": 1, "size": [120, 200]}, memory=memory)
            self.assertEqual(frames.shape, (1, 120, 200, 3))
            np.testing.assert_array_equal(frames[0], want[keys[0]], err_msg=f"memory={memory}")


# resize: cover (and layout: CTHW) on landscape and portrait sources, one whose centered crop
# starts on an odd column (rounded down to the chroma grid), sampled as Wan2.2 clips are: 4n+1
# frames at 16 fps from 30 and 25 fps sources.
COVER_VIDEOS = {
    "land_30fps.mp4": ("testsrc2=size=320x180:rate=30", 3),
    "odd_30fps.mp4": ("testsrc2=size=322x180:rate=30", 3),
    "portrait_25fps.mp4": ("testsrc2=size=240x320:rate=25", 3),
}
COVER_SIZE = (24, 40)  # H, W: wider than 16:9 sources are tall, taller than portrait ones
YUV_MEAN_LEVELS = 10  # scale_in: yuv against rgb24, the most mean difference allowed (docs/design/video.md)
COVER_CLIP = {"sampling": "clip", "frames": 17, "fps": 16, "clip_start": "0.3"}


def cover_crop(w, h, W, H):
    """The source region resize: cover reads (video_sampler.h): the centered region with the
    output's aspect ratio that the scaled frame covers, its left and top on even pixels (4:2:0)."""
    scale = max(W / w, H / h)
    cw = min(w, max(1, int(math.floor(W / scale + 0.5))))
    ch = min(h, max(1, int(math.floor(H / scale + 0.5))))
    return ((w - cw) // 2) & ~1, ((h - ch) // 2) & ~1, cw, ch


def cover_reference(path):
    """Every frame: its pts, its crop scaled by swscale (bilinear, RGB24) through PyAV, the whole
    frame as RGB24, and the crop as scale_in: yuv makes it (its planes scaled by swscale, then
    converted to RGB24 at the output size)."""
    H, W = COVER_SIZE
    out = []
    with av.open(path) as c:
        s = c.streams.video[0]
        for f in c.decode(s):
            x, y, cw, ch = cover_crop(f.width, f.height, W, H)
            yuv = f.to_ndarray(format="yuv420p")
            ys = yuv[: f.height]
            uv = yuv[f.height:].reshape(2, f.height // 2, f.width // 2)
            planes = [ys[y:y + ch, x:x + cw], uv[0, y // 2:(y + ch) // 2, x // 2:(x + cw) // 2],
                      uv[1, y // 2:(y + ch) // 2, x // 2:(x + cw) // 2]]
            packed = np.concatenate([p.ravel() for p in planes]).reshape(ch * 3 // 2, cw)
            crop = av.VideoFrame.from_ndarray(np.ascontiguousarray(packed), format="yuv420p")
            rgb = crop.reformat(width=W, height=H, format="rgb24", interpolation="BILINEAR").to_ndarray()
            planes = crop.reformat(width=W, height=H, format="yuv420p", interpolation="BILINEAR")
            rgb_yuv = planes.reformat(format="rgb24", interpolation="BILINEAR").to_ndarray()
            out.append((f.pts, rgb, f.to_ndarray(format="rgb24"), rgb_yuv))
    out.sort(key=lambda fr: fr[0])
    return out


class CoverTest(unittest.TestCase):
    """resize: cover, layout: CTHW, float32 in [-1, 1]: what configs/wan2.2-*.yaml ask for."""

    def test_cover_crop_cthw_clips_match_the_reference(self):
        H, W = COVER_SIZE
        for name, (src, seconds) in COVER_VIDEOS.items():
            path = os.path.join(TMP, name)
            subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", src, "-t", str(seconds),
                            "-c:v", "libx264", "-bf", "2", "-pix_fmt", "yuv420p", path], check=True)
            ref = Reference(path)  # the timeline and the picks (frames at 16 fps by timestamp)
            picks = ref.sample(COVER_CLIP)
            self.assertNotIn(None, picks, name)
            frames = cover_reference(path)
            self.assertEqual([f[0] for f in frames], ref.pts, name)
            p = dict(COVER_CLIP, size=list(COVER_SIZE), resize="cover")
            got, clip = run_stage(path, p, layout="CTHW")
            self.assertEqual(clip.shape, (3, 17, H, W), name)
            self.assertEqual(clip.dtype, np.uint8)
            for slot, k in enumerate(picks):
                self.assertAlmostEqual(got["pts"][slot], ref.seconds(ref.pts[k]), places=4, msg=f"{name} slot {slot}")
                np.testing.assert_array_equal(clip[:, slot].transpose(1, 2, 0), frames[k][1],
                                              err_msg=f"{name} slot {slot}")
            # The crop's geometry, checked independently: PIL scales the whole frame to cover
            # the output and crops its center (torchvision's Resize(min side) + CenterCrop).
            # On testsrc2's sharp pattern at 7.5x down, swscale's bilinear (not antialiased)
            # differs from PIL's by ~15 levels where the crops agree, and by ~31 where they are
            # one output pixel apart.
            for slot in (0, 8, 16):
                full = Image.fromarray(frames[picks[slot]][2])
                scale = max(W / full.width, H / full.height)
                sw, sh = max(W, round(full.width * scale)), max(H, round(full.height * scale))
                big = np.asarray(full.resize((sw, sh), Image.BILINEAR), dtype=np.float64)
                top, left = (sh - H) // 2, (sw - W) // 2
                want = big[top:top + H, left:left + W]
                diff = np.abs(clip[:, slot].transpose(1, 2, 0).astype(np.float64) - want).mean()
                self.assertLess(diff, 22, f"{name} slot {slot}: the crop is not centered as PIL's")
                print(f"  {name} slot {slot}: mean difference to PIL cover+crop {diff:.2f} levels", flush=True)
            # float32 with mean = std = 0.5: the same pixels in [-1, 1], THWC and TCHW the same.
            gotf, clipf = run_stage(path, dict(p, dtype="float32", mean=[0.5] * 3, std=[0.5] * 3), layout="CTHW")
            self.assertEqual(clipf.dtype, np.float32)
            np.testing.assert_allclose(clipf, clip.astype(np.float32) / 127.5 - 1, atol=1e-6, err_msg=name)
            _, thwc = run_stage(path, p, layout="THWC")
            _, tchw = run_stage(path, p, layout="TCHW")
            np.testing.assert_array_equal(thwc, clip.transpose(1, 2, 3, 0), err_msg=name)
            np.testing.assert_array_equal(tchw, clip.transpose(1, 0, 2, 3), err_msg=name)
            # scale_in: yuv equals PyAV resizing the crop's planes, then converting; from
            # rgb24's bytes it differs by chroma interpolated at the planes' resolution: on
            # testsrc2's saturated colour edges at 7.5x down, a few levels on average.
            _, yuv = run_stage(path, dict(p, scale_in="yuv"), layout="CTHW")
            for slot, k in enumerate(picks):
                np.testing.assert_array_equal(yuv[:, slot].transpose(1, 2, 0), frames[k][3],
                                              err_msg=f"{name} slot {slot} (scale_in: yuv)")
            diff = np.abs(yuv.astype(np.int16) - clip.astype(np.int16))
            print(f"  {name}: scale_in yuv against rgb24: mean {diff.mean():.2f} levels, "
                  f"99th percentile {np.percentile(diff, 99):.0f}, max {diff.max()}", flush=True)
            self.assertLess(diff.mean(), YUV_MEAN_LEVELS, name)


class LimitBenchTest(unittest.TestCase):
    """bench/video_limit.cc, the least work an exact loader must do for the stage's picks: it
    decodes at least every picked frame and never more than the stage does (which decodes only
    reference frames and picks)."""

    def test_the_limit_decodes_the_picks_and_no_more_than_the_stage(self):
        make_videos()
        for name in ("h264.mp4", "hevc.mkv", "h264_shortgop.mkv"):
            for mode, params in MODES[:3]:
                with self.subTest(video=name, mode=mode):
                    got, _ = run_stage(os.path.join(TMP, name), params)
                    picks = sorted({t for t, m in zip(got["pts"], got["mask"]) if m})
                    clips = os.path.join(TMP, "clips.jsonl")
                    with open(clips, "w") as f:
                        f.write(json.dumps(got) + "\n")
                    r = subprocess.run([os.path.join(BIN, "mmfeed-bench-video-limit"), "--workers", "1", clips],
                                       capture_output=True, text=True, check=True)
                    limit = json.loads(r.stdout)
                    decoded = limit["decoded_per_sampled"] * len(picks)
                    self.assertGreaterEqual(decoded, len(picks) - 1e-6, r.stdout)
                    self.assertLessEqual(decoded, got["decoded"] + 1e-6, r.stdout)

    def test_the_qwen_video_stage_decodes_what_the_limit_does_for_its_picks(self):
        # mmfeed-video --bench --stage qwen_video runs the stage as the daemon makes it; the
        # limit gets its picks by Hugging Face's rule, from bench/video_limit.py's qwen_clips.
        make_videos()
        params = {"fps": 2, "min_frames": 4, "max_frames": 768, "min_pixels": 4096, "max_pixels": 65536}
        for name in ("h264.mp4", "h264_ntsc.mp4"):  # MP4: the frame count is the container's
            path = os.path.join(TMP, name)
            r = subprocess.run([os.path.join(BIN, "mmfeed-video"), "--bench", "--stage", "qwen_video", "--workers", "1",
                                "--params", json.dumps(params), path], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            stage = json.loads(r.stdout)
            self.assertEqual((stage["clips"], stage["errors"]), (1, 0), r.stdout)
            clips = video_limit.qwen_clips([path], params, 1, pathlib.Path(TMP) / "qwen_clips.jsonl")
            picks = json.loads(clips.read_text())["pts"]
            r = subprocess.run([os.path.join(BIN, "mmfeed-bench-video-limit"), "--workers", "1", str(clips)],
                               capture_output=True, text=True, check=True)
            limit = json.loads(r.stdout)
            # The same picks: the limit decodes each and no more than the stage, which decodes
            # within a tenth of it (it decodes on through a group of pictures where the limit
            # seeks again: a few frames either way).
            decoded, least = stage["decoded_per_sampled"] * len(picks), limit["decoded_per_sampled"] * len(picks)
            self.assertGreaterEqual(least, len(picks) - 1e-6, (name, limit))
            self.assertLessEqual(least, decoded + 1e-6, (name, stage, limit))
            self.assertLessEqual(decoded, 1.1 * least + 4, (name, stage, limit))


def main():
    global BIN, TMP, SANITIZED
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--sanitized", action="store_true")
    args, rest = ap.parse_known_args()
    BIN = os.path.abspath(args.bin)
    SANITIZED = args.sanitized
    with tempfile.TemporaryDirectory(prefix="mmfeed-video-ref-") as tmp:
        TMP = tmp
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
