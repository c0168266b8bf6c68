#!/usr/bin/python3
"""Video clips against their true limit (issue #34): for each video config, clips/s of mmfeed's
video stage (mmfeed-video --bench: the stage's own code, a worker per core, 1 decoder thread each) and,
in the same run on the same files and the same picks, the least work any exact loader must do
(mmfeed-bench-video-limit, bench/video_limit.cc: demux, seek to the keyframe before each group
of picks, decode the reference frames and the picked ones with the same decoder, threads and
workers, convert nothing). Reported: both rates, mmfeed as a fraction of the limit, and each
one's decoded frames per picked frame (equal when mmfeed decodes nothing it need not).
Medians of alternating rounds (mmfeed, limit, mmfeed, ...), as bench/image_bench runs, and the
median of each round's own ratio (mmfeed's run against the limit's right after it), with its range.

Configs: configs/wan2.2-t2v.yaml (as shipped, scale_in: yuv, and with scale_in: rgb24) and
configs/wan2.2-ti2v-5b.yaml (clip sampler), the uniform sampler of configs/video-text.yaml,
bench/video_bench.py's clip sampler (16 frames at 4 fps, 224x224), and
configs/qwen3.5-vl-video.yaml's qwen_video stage (mmfeed-video --bench --stage qwen_video;
its picks for the limit by Hugging Face's rule, from the reference). Sources:
bench/wan_bench.py's 8 s 30 fps videos at 720p and 1080p, H.264 (x264 veryfast, default GOP)
and HEVC (x265 veryfast, CRF 23, default GOP), made once.

usage: video_limit.py [--build BUILD] [--out DIR] [--videos N] [--repeat R] [--rounds K] [--codecs h264,hevc]
                      [--only NAME]
"""
import argparse, itertools, json, os, pathlib, subprocess, sys

import av
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import video_bench  # noqa: E402  (make_video)
sys.path.insert(0, str(ROOT / "tests" / "reference"))
import qwen_vision_reference as qwen_ref  # noqa: E402


def video_params(config, stage="video"):
    cfg = yaml.safe_load((ROOT / "configs" / config).read_text())
    return next(s for s in cfg["stages"] if s["type"] == stage)["params"]


CONFIGS = {
    "wan2.2-t2v": video_params("wan2.2-t2v.yaml"),
    "wan2.2-t2v, scale_in: rgb24": dict(video_params("wan2.2-t2v.yaml"), scale_in="rgb24"),
    "wan2.2-ti2v-5b": video_params("wan2.2-ti2v-5b.yaml"),
    "video-text (uniform 16)": video_params("video-text.yaml"),
    "clip 16 at 4 fps, 224": {"sampling": "clip", "frames": 16, "fps": 4, "clip_start": "random",
                              "size": [224, 224], "dtype": "uint8"},
}
# Stages other than `video` (mmfeed-video --bench --stage TYPE runs them as the daemon does).
QWEN = "qwen3.5-vl-video (qwen_video)"
CONFIGS[QWEN] = video_params("qwen3.5-vl-video.yaml", "qwen_video")
STAGES = {QWEN: "qwen_video"}


def clips(build, files, params, repeat, path):
    """The picks mmfeed-video --bench makes (epoch = repetition), one line per clip."""
    lines = []
    for epoch in range(repeat):
        out = subprocess.run([f"{build}/bin/mmfeed-video", "--epoch", str(epoch), "--params", json.dumps(params),
                              *map(str, files)], capture_output=True, text=True, check=True)
        lines += out.stdout.splitlines()
    path.write_text("\n".join(lines) + "\n")
    return path


def qwen_clips(files, params, repeat, path):
    """The frames the qwen_video stage picks: Hugging Face's rule (tests/reference/
    qwen_vision_reference.py, which qwen_fidelity_test checks the stage against); frame k of
    these constant-rate videos is the one at k / fps."""
    lines = []
    for _ in range(repeat):
        for f in files:
            with av.open(str(f)) as c:
                s = c.streams.video[0]
                total, fps = s.frames, float(s.average_rate)
            if total < 1:
                raise SystemExit(f"{f}: the container gives no frame count (the sources here are MP4)")
            picks = qwen_ref.sample_frame_indices(total, fps, params["fps"], params["min_frames"], params["max_frames"])
            lines.append(json.dumps({"path": str(f), "ok": True, "pts": [int(k) / fps for k in picks],
                                     "mask": [1] * len(picks)}))
    path.write_text("\n".join(lines) + "\n")
    return path


def limit(build, clip_file):
    out = subprocess.run([f"{build}/bin/mmfeed-bench-video-limit", "--workers", str(video_bench.CORES),
                          "--threads", "1", str(clip_file)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "wan"))
    ap.add_argument("--videos", type=int, default=2, help="videos per resolution")
    ap.add_argument("--repeat", type=int, default=3, help="clips per video in a run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="", help="the configs whose name contains this")
    ap.add_argument("--codecs", default="h264,hevc", help="source codecs, comma-separated: h264, hevc")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"cores": os.cpu_count(), "repeat": a.repeat, "rounds": a.rounds, "rows": []}
    for (w, h), codec in itertools.product(((1280, 720), (1920, 1080)), a.codecs.split(",")):
        files = video_bench.clip_videos(out, w, h, a.videos, codec)
        for name, params in ((n, p) for n, p in CONFIGS.items() if a.only in n):
            picks = out / f"picks_{h}p_{codec}.jsonl"
            stage = STAGES.get(name, "video")
            clip_file = (qwen_clips(files, params, a.repeat, picks) if stage == "qwen_video"
                         else clips(a.build, files, params, a.repeat, picks))
            med = video_bench.interleaved(a.rounds, {
                "mmfeed": lambda: video_bench.run_mmfeed(a.build, params, files, a.repeat, stage),
                "limit": lambda: limit(a.build, clip_file)})
            # Each round's mmfeed run against the limit's run right after it: a drift of the
            # machine's speed between rounds cancels in these.
            pairs = sorted(m / l for m, l in zip(med["mmfeed"]["clips_per_s_runs"], med["limit"]["clips_per_s_runs"]))
            results["rows"].append({
                "config": name, "source": f"{h}p {codec}", "mmfeed_clips_per_s": med["mmfeed"]["clips_per_s"],
                "limit_clips_per_s": med["limit"]["clips_per_s"],
                "of_limit": med["mmfeed"]["clips_per_s"] / med["limit"]["clips_per_s"],
                "of_limit_rounds": pairs, "of_limit_rounds_median": pairs[len(pairs) // 2],
                "mmfeed_decoded_per_sampled": med["mmfeed"]["decoded_per_sampled"],
                "limit_decoded_per_sampled": med["limit"]["decoded_per_sampled"]})
    print(json.dumps(results, indent=2))
    print("\n| config | source | mmfeed clips/s | limit clips/s | mmfeed / limit | per round (median, range) "
          "| decoded per picked frame (mmfeed, limit) |")
    print("|---|---|---|---|---|---|---|")
    for r in results["rows"]:
        rounds = r["of_limit_rounds"]
        print(f"| {r['config']} | {r['source']}, 30 fps | {r['mmfeed_clips_per_s']:.2f} | "
              f"{r['limit_clips_per_s']:.2f} | **{r['of_limit']:.2f}** | {r['of_limit_rounds_median']:.2f} "
              f"({rounds[0]:.2f}-{rounds[-1]:.2f}) | "
              f"{r['mmfeed_decoded_per_sampled']:.2f}, {r['limit_decoded_per_sampled']:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
