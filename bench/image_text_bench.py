#!/usr/bin/env python3
"""Image-text benchmark: mmfeed (configs/demo.yaml's pipeline, two consumer ranks; float32
and, with normalization left to the consumer, uint8 images) against the PyTorch DataLoader
baseline and a bare libjpeg-turbo full-size decode, on the same files in one run. Steady
state: each side runs a short and a long pass, and throughput is
(long - short samples) / (long - short seconds), so start-up cancels out; mmfeed and the
bare decode take turns for --rounds rounds and the ratios are medians of the rounds'. Two photo sets:
the project's own (scripts/make_dataset.py: 400-800 px wide) and ImageNet-sized photos
(scripts/make_photos.py: 240-620 px wide, median about 430x350).

With --baseline-build DIR (another build of mmfeed, e.g. of the revision before a refactor),
each round also runs that build's mmfeed (float32) on the same files, in turn with this one,
and the table gains its row and the ratio of this build to it.

usage: image_text_bench.py --build BUILD --out DIR [--short N] [--long N] [--sets project,imagenet]
                           [--rounds R] [--baseline-build DIR]
"""
import argparse, glob, json, os, pathlib, random, statistics, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"
sys.path.insert(0, str(ROOT / "scripts"))
import make_photos  # noqa: E402


def run_mmfeed(build, data, samples, dtype="float32"):
    cfg = (ROOT / "configs" / "demo.yaml").read_text().replace("path: manifest.jsonl", f"path: manifest-{samples}.jsonl")
    cfg = cfg.replace("dtype: float32", f"dtype: {dtype}")
    (data / f"bench-{samples}.yaml").write_text(cfg)
    sock = str(data / "bench.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    log = open(data / f"daemon-{samples}.log", "w")
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(data / f"bench-{samples}.yaml"), "--socket", sock],
                         stderr=log)
    while not os.path.exists(sock):
        time.sleep(0.01)
    t0 = time.perf_counter()
    cs = [subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", sock, "--rank", str(r), "--json"],
                           stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [json.loads(c.communicate()[0]) for c in cs]
    seconds = time.perf_counter() - t0
    d.wait()
    log.close()
    return {"samples": sum(o["samples"] for o in outs), "seconds": seconds}


def run_torch(data, samples):
    out = subprocess.run([PY, str(ROOT / "bench" / "torch_baseline.py"), str(data / "manifest.jsonl"),
                          "--samples", str(samples)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def steady(short, long):
    return (long["samples"] - short["samples"]) / (long["seconds"] - short["seconds"])


def imagenet_set(data, samples):
    """ImageNet-sized photos (400 of them) and a manifest of `samples` captioned samples."""
    make_photos.make(data / "img", 400, 240, 620, seed=7)
    rng = random.Random(0)
    files = sorted((data / "img").glob("p*.jpg"))
    with open(data / "manifest.jsonl", "w") as m:
        for i in range(samples):
            words = " ".join(rng.choice(("a", "photo", "of", "the", "red", "house", "dog", "park")) for _ in range(12))
            m.write(json.dumps({"id": f"s{i:06d}", "image": f"img/{files[i % len(files)].name}", "text": words}) + "\n")


def measure(build, data, short, long, rounds, baseline=None):
    lines = (data / "manifest.jsonl").read_text().splitlines()
    for n in (short, long):
        (data / f"manifest-{n}.jsonl").write_text("\n".join(lines[:n]) + "\n")
    files = sorted(glob.glob(str(data / "img" / "*.jpg")))
    reps = max(1, long // len(files))

    def bare():
        out = subprocess.run([f"{build}/bin/mmfeed-bench-decode", "--threads", "2", "--repeat", str(reps), *files],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)["images_per_s"]

    # The VM's speed drifts by 10-15% between minutes: mmfeed and the bare decode take turns,
    # `rounds` times, and each ratio is the median of the rounds' ratios.
    runs = {"mmfeed": [], "mmfeed_uint8": [], "bare_libjpeg_turbo_decode": []}
    if baseline:
        runs["mmfeed_baseline"] = []
    for _ in range(rounds):
        runs["mmfeed"].append(steady(run_mmfeed(build, data, short), run_mmfeed(build, data, long)))
        if baseline:
            runs["mmfeed_baseline"].append(
                steady(run_mmfeed(baseline, data, short), run_mmfeed(baseline, data, long)))
        runs["bare_libjpeg_turbo_decode"].append(bare())
        runs["mmfeed_uint8"].append(steady(run_mmfeed(build, data, short, "uint8"), run_mmfeed(build, data, long, "uint8")))
    res = {"images": len(files), "rounds": runs}
    for k, v in runs.items():
        res[k] = statistics.median(v)
    res["torch_dataloader"] = steady(run_torch(data, short), run_torch(data, long))
    if baseline:
        res["mmfeed_vs_baseline"] = statistics.median(
            m / b for m, b in zip(runs["mmfeed"], runs["mmfeed_baseline"]))
        res["mmfeed_baseline_vs_bare_decode"] = statistics.median(
            m / b for m, b in zip(runs["mmfeed_baseline"], runs["bare_libjpeg_turbo_decode"]))
        res["mmfeed_baseline_vs_dataloader"] = res["mmfeed_baseline"] / res["torch_dataloader"]
    for k in ("mmfeed", "mmfeed_uint8"):
        res[f"{k}_vs_dataloader"] = res[k] / res["torch_dataloader"]
        res[f"{k}_vs_bare_decode"] = statistics.median(
            m / b for m, b in zip(runs[k], runs["bare_libjpeg_turbo_decode"]))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "image_text"))
    ap.add_argument("--short", type=int, default=1024)
    ap.add_argument("--long", type=int, default=6144)
    ap.add_argument("--sets", default="project,imagenet")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-build", help="another mmfeed build, run side by side (float32)")
    a = ap.parse_args()
    results = {"cores": os.cpu_count()}
    for name in a.sets.split(","):
        data = pathlib.Path(a.out) / name
        if name == "project":
            subprocess.run([PY, str(ROOT / "scripts" / "make_dataset.py"), str(data), "--count", str(a.long)], check=True)
        elif name == "imagenet":
            imagenet_set(data, a.long)
        else:
            raise SystemExit(f"unknown photo set {name}: project or imagenet")
        results[name] = measure(a.build, data, a.short, a.long, a.rounds, a.baseline_build)
    print(json.dumps(results, indent=2))
    print("\n| photos | pipeline | images/s (steady state) | vs bare decode | vs DataLoader |\n|---|---|---|---|---|")
    for name in a.sets.split(","):
        r = results[name]
        label = {"project": "project set (400-800 px)", "imagenet": "ImageNet-sized (median ~430x350)"}[name]
        for k, what in (("mmfeed", "mmfeed, float32 CHW"), ("mmfeed_uint8", "mmfeed, uint8 CHW (normalize on the consumer)")):
            print(f"| {label} | {what} | {r[k]:.0f} | {r[k + '_vs_bare_decode']:.2f}x | {r[k + '_vs_dataloader']:.2f}x |")
        if "mmfeed_baseline" in r:
            print(f"| {label} | mmfeed, float32 CHW, baseline build ({a.baseline_build}) | {r['mmfeed_baseline']:.0f} | "
                  f"{r['mmfeed_baseline_vs_bare_decode']:.2f}x | {r['mmfeed_baseline_vs_dataloader']:.2f}x |")
        print(f"| {label} | PyTorch DataLoader(num_workers=2) + torchvision | {r['torch_dataloader']:.0f} | "
              f"{r['torch_dataloader'] / r['bare_libjpeg_turbo_decode']:.2f}x | 1.00x |")
        print(f"| {label} | bare libjpeg-turbo full decode, 2 threads | {r['bare_libjpeg_turbo_decode']:.0f} | 1.00x | "
              f"{r['bare_libjpeg_turbo_decode'] / r['torch_dataloader']:.2f}x |")

    print()
    for name in a.sets.split(","):
        if "mmfeed_vs_baseline" in results[name]:
            print(f"{name}: this build / baseline build, float32: "
                  f"{results[name]['mmfeed_vs_baseline']:.2f}x (median of the rounds' ratios)")


if __name__ == "__main__":
    sys.exit(main())
