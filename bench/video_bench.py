#!/usr/bin/python3
"""Video benchmark: clips/s at 224x224 for mmfeed's video stage and, in the same run on the
same files, what users write without it:

- uniform 16 frames over short videos (12-16 s, 720p and 1080p) vs the seed's approach:
  OpenCV VideoCapture, decode every frame, keep every k-th, cv2.resize;
- a 16-frame clip at 4 fps from a random start (seeded) in 2-minute videos vs OpenCV
  VideoCapture with CAP_PROP_POS_MSEC seek then sequential reads, and vs PyAV with seek.

Every contender uses the machine's cores the way its users would: mmfeed with one worker per
core (mmfeed-video --bench, the stage's code), the Python baselines with one process per core
(a DataLoader-like pool) and their libraries' default decoder threading. Also reported:
decoded frames per sampled frame, the number that explains the speed.

And the work no exact loader can skip, on the same clips ("ffmpeg_refs_only"): FFmpeg's own
decoder, one thread, decoding only the reference frames from the keyframe before each clip's
first pick to its last pick (ffmpeg -skip_frame noref -ss -to), its startup subtracted, its
CPU time spread over all cores without loss. A loader that must return the exact pixels has
to decode these frames (every reference frame is needed by the frames after it), so this
contender's ratio over a baseline is about the most any exact CPU loader can reach on these
files. It is an estimate, not a strict bound: it leaves out the picked frames themselves and
their conversion, but counts the ffmpeg tool's own per-frame work, so mmfeed (which does only
what the clip needs) lands within a few percent of it with one worker; with every core busy,
decoders sharing the memory bandwidth cost more than this estimate, which runs alone.

Videos are made once with Debian's ffmpeg from tests/data/photos: a slow pan/zoom with
film grain (so the bitrate is realistic), x264 --preset veryfast with its default GOP.

usage: video_bench.py [--build BUILD] [--out DIR] [--quick]
"""
import argparse, json, multiprocessing, os, pathlib, subprocess, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PHOTOS = sorted((ROOT / "tests" / "data" / "photos").glob("photo0[0-9].jpg"))
SIZE = 224
FRAMES = 16
CLIP_FPS = 4.0
CORES = os.cpu_count() or 2


def make_video(photo, out, width, height, seconds, codec="h264"):
    if out.exists():
        return out
    vf = (f"scale={width * 3 // 2}:-2:flags=bicubic,"
          f"zoompan=z='1.15+0.1*sin(on/90)':x='(iw-iw/zoom)/2*(1+0.8*sin(on/70))':"
          f"y='(ih-ih/zoom)/2*(1+0.8*cos(on/110))':d=1:s={width}x{height}:fps=30,"
          f"noise=alls=8:allf=t,format=yuv420p")
    tmp = out.with_suffix(".part.mp4")
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-loop", "1", "-framerate", "30", "-i", str(photo), "-t", str(seconds),
                    "-vf", vf, *CODECS[codec], "-preset", "veryfast", str(tmp)], check=True)
    tmp.rename(out)
    return out


CODECS = {"h264": ["-c:v", "libx264"], "hevc": ["-c:v", "libx265", "-x265-params", "log-level=error", "-crf", "23"]}


def clip_videos(out, width, height, n, codec="h264"):
    """n 8 s videos at width x height, from the first photos (bench/wan_bench.py's sources)."""
    suffix = "" if codec == "h264" else f"_{codec}"
    return [make_video(PHOTOS[i % len(PHOTOS)], out / f"wan{i}_{height}p{suffix}.mp4", width, height, 8, codec)
            for i in range(n)]


def make_videos(out, quick):
    out.mkdir(parents=True, exist_ok=True)
    short, long = [], []
    specs = [(1280, 720, 12), (1920, 1080, 14), (1280, 720, 16), (1920, 1080, 12)]
    for i, (w, h, s) in enumerate(specs[: 2 if quick else 4]):
        short.append(make_video(PHOTOS[i], out / f"short{i}_{h}p.mp4", w, h, s))
    for i, (w, h) in enumerate([(1280, 720), (1920, 1080)]):
        long.append(make_video(PHOTOS[4 + i], out / f"long{i}_{h}p.mp4", w, h, 30 if quick else 120))
    return short, long


def sampled_clips(build, params, files, repeat):
    """The clips mmfeed's bench run samples (seed 0, epoch = repetition), as (file, first pick,
    last pick) in seconds, so the baselines decode the same clips."""
    clips = []
    for epoch in range(repeat):
        out = subprocess.run([f"{build}/bin/mmfeed-video", "--epoch", str(epoch), "--params", json.dumps(params),
                              *map(str, files)], capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            j = json.loads(line)
            picked = [t for t, m in zip(j["pts"], j["mask"]) if m]
            clips.append((j["path"], picked[0], picked[-1]))
    return clips


def _child_cpu(args):
    """CPU seconds of one child process (its own rusage: RUSAGE_CHILDREN would also count the
    pool workers reaped meanwhile)."""
    _, status, usage = os.wait4(subprocess.Popen(args).pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(args)} failed ({os.waitstatus_to_exitcode(status)})")
    return usage.ru_utime + usage.ru_stime


def ffmpeg_refs_only(clips):
    """clips/s if the cores did nothing but decode the reference frames each clip needs (see
    the module's docstring); one ffmpeg per clip, its startup (open, one frame) subtracted.
    ffmpeg is sent to the keyframe itself: its input -to counts from where decoding starts."""
    ffmpeg = ["ffmpeg", "-v", "error", "-nostdin", "-threads", "1", "-skip_frame", "noref"]
    startup = {p: _child_cpu([*ffmpeg, "-i", p, "-frames:v", "1", "-f", "null", "-"]) for p in {c[0] for c in clips}}
    cpu = 0.0
    for path, first, last in clips:
        key = keyframe_before(path, first)
        secs = _child_cpu([*ffmpeg, "-ss", f"{key + 1e-4:.6f}", "-to", f"{last + 1e-3:.6f}", "-i", path, "-f", "null", "-"])
        cpu += max(0.0, secs - startup[path])
    return {"clips_per_s": len(clips) * CORES / cpu, "cpu_s_per_clip": cpu / len(clips)}


# ---- baselines, one task per process ----

def opencv_uniform(path):
    """The seed: decode every frame, keep every k-th, resize."""
    import cv2
    cap = cv2.VideoCapture(path)
    n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    step = max(1, n // FRAMES)
    keep, decoded, i = [], 0, 0
    while len(keep) < FRAMES:
        ok, frame = cap.read()
        if not ok:
            break
        decoded += 1
        if i % step == step // 2:
            keep.append(cv2.cvtColor(cv2.resize(frame, (SIZE, SIZE)), cv2.COLOR_BGR2RGB))
        i += 1
    cap.release()
    return len(keep), decoded


_PACKETS = {}


def packets(path):
    """(pts seconds, is keyframe) of the file's video packets, read once."""
    if path not in _PACKETS:
        import av
        with av.open(path) as c:
            s = c.streams.video[0]
            _PACKETS[path] = [(float(p.pts * s.time_base), p.is_keyframe) for p in c.demux(s) if p.pts is not None]
    return _PACKETS[path]


def keyframe_before(path, t):
    return max((k for k, key in packets(path) if key and k <= t + 1e-6), default=0.0)


def preroll_frames(task):
    """Frames from the keyframe before the start to the start: what a seek decodes before it
    returns (OpenCV does that inside CAP_PROP_POS_MSEC, out of the caller's sight)."""
    path, start, _ = task
    key = keyframe_before(path, start)
    return sum(1 for t, _ in packets(path) if key <= t < start - 1e-6)


def opencv_clip(task):
    """Seek with CAP_PROP_POS_MSEC, then read sequentially and keep a frame every 1/fps."""
    import cv2
    path, start, _ = task
    cap = cv2.VideoCapture(path)
    cap.set(cv2.CAP_PROP_POS_MSEC, start * 1000)
    keep, decoded = [], 0
    nxt = start
    while len(keep) < FRAMES:
        ok, frame = cap.read()
        if not ok:
            break
        decoded += 1
        t = cap.get(cv2.CAP_PROP_POS_MSEC) / 1000
        if t + 1e-6 >= nxt:
            keep.append(cv2.cvtColor(cv2.resize(frame, (SIZE, SIZE)), cv2.COLOR_BGR2RGB))
            nxt += 1 / CLIP_FPS
    cap.release()
    return len(keep), decoded


def pyav_clip(task):
    """Seek to the keyframe before the start, decode forward, convert only the kept frames."""
    import av
    path, start, _ = task
    keep, decoded = [], 0
    with av.open(path) as c:
        s = c.streams.video[0]
        c.seek(int(start / s.time_base), stream=s, backward=True)
        nxt = start
        for f in c.decode(s):
            decoded += 1
            if f.time + 1e-6 >= nxt:
                keep.append(f.to_ndarray(width=SIZE, height=SIZE, format="rgb24"))
                nxt += 1 / CLIP_FPS
                if len(keep) == FRAMES:
                    break
    return len(keep), decoded


def run_pool(fn, tasks, hidden_decodes=0):
    with multiprocessing.Pool(CORES) as pool:
        pool.map(fn, tasks[:CORES])  # warm up imports and caches
        t0 = time.perf_counter()
        res = pool.map(fn, tasks, chunksize=1)
        secs = time.perf_counter() - t0
    sampled = sum(r[0] for r in res)
    decoded = sum(r[1] for r in res) + hidden_decodes
    return {"clips_per_s": len(tasks) / secs, "decoded_per_sampled": decoded / max(1, sampled), "clips": len(tasks)}


def run_mmfeed(build, params, files, repeat, stage="video"):
    out = subprocess.run([f"{build}/bin/mmfeed-video", "--bench", "--workers", str(CORES), "--repeat", str(repeat),
                          "--stage", stage, "--params", json.dumps(params), *map(str, files)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"mmfeed-video failed: {out.stderr}{out.stdout}")
    return json.loads(out.stdout)


def interleaved(rounds, contenders):
    """Runs the contenders (name -> function returning {"clips_per_s": ..}) in turn, `rounds`
    times, so a slow spell of the machine hits them all; reports each one's median."""
    runs = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            runs[name].append(fn())
    out = {}
    for name, rs in runs.items():
        cps = sorted(r["clips_per_s"] for r in rs)
        out[name] = {**rs[0], "clips_per_s": cps[len(cps) // 2], "clips_per_s_runs": [r["clips_per_s"] for r in rs]}
    return out


def ratios(res, of, to):
    return {f"{a}/{b}": res[a]["clips_per_s"] / res[b]["clips_per_s"] for a in of for b in to}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "video"))
    ap.add_argument("--quick", action="store_true", help="fewer, shorter videos, one round (a smoke run)")
    a = ap.parse_args()
    short, long = make_videos(pathlib.Path(a.out), a.quick)
    reps_short, reps_long, rounds = (2, 2, 1) if a.quick else (6, 10, 3)
    res = {"cores": CORES, "rounds": rounds}

    # Uniform 16 frames over the short videos.
    uniform = {"sampling": "uniform", "frames": FRAMES, "size": [SIZE, SIZE]}
    clips = sampled_clips(a.build, uniform, short, reps_short)
    u = interleaved(rounds, {
        "mmfeed": lambda: run_mmfeed(a.build, uniform, short, reps_short),
        "opencv_every_frame": lambda: run_pool(opencv_uniform, [str(f) for f in short] * reps_short),
        "ffmpeg_refs_only": lambda: ffmpeg_refs_only(clips)})
    u["mmfeed"] = {k: u["mmfeed"][k] for k in ("clips_per_s", "clips_per_s_runs", "decoded_per_sampled")}
    res["uniform"] = {"videos": [f.name for f in short], **u,
                      "ratios": ratios(u, ["mmfeed", "ffmpeg_refs_only"], ["opencv_every_frame"])}
    # Per video (one round): the gain depends on how many frames x264 made non-reference B-frames.
    per = {}
    for f in short:
        m1 = run_mmfeed(a.build, uniform, [f], CORES * 2)
        c1 = run_pool(opencv_uniform, [str(f)] * CORES * 2)
        f1 = ffmpeg_refs_only([c for c in clips if c[0] == str(f)][:2])
        per[f.name] = {"mmfeed_decoded_per_sampled": m1["decoded_per_sampled"], "opencv_decoded_per_sampled": c1["decoded_per_sampled"],
                       "mmfeed/opencv": m1["clips_per_s"] / c1["clips_per_s"],
                       "ffmpeg_refs_only/opencv": f1["clips_per_s"] / c1["clips_per_s"]}
    res["uniform"]["per_video"] = per

    # Clip of 16 frames at 4 fps from seeded random starts in the 2-minute videos; the
    # baselines are given the clips mmfeed draws.
    clip = {"sampling": "clip", "frames": FRAMES, "fps": CLIP_FPS, "size": [SIZE, SIZE]}
    tasks = sampled_clips(a.build, clip, long, reps_long)
    hidden = sum(map(preroll_frames, tasks))
    c = interleaved(rounds, {
        "mmfeed": lambda: run_mmfeed(a.build, clip, long, reps_long),
        "opencv_seek_then_read": lambda: run_pool(opencv_clip, tasks, hidden_decodes=hidden),
        "pyav_seek": lambda: run_pool(pyav_clip, tasks),
        "ffmpeg_refs_only": lambda: ffmpeg_refs_only(tasks)})
    c["mmfeed"] = {k: c["mmfeed"][k] for k in ("clips_per_s", "clips_per_s_runs", "decoded_per_sampled", "seeks_per_clip")}
    res["clip"] = {"videos": [f.name for f in long], **c,
                   "ratios": ratios(c, ["mmfeed", "ffmpeg_refs_only"], ["opencv_seek_then_read", "pyav_seek"])}
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
