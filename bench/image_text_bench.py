#!/usr/bin/env python3
"""Image-text benchmark: mmfeed (configs/demo.yaml's pipeline, two consumer ranks) against the
PyTorch DataLoader baseline and a bare libjpeg-turbo full-size decode, on the same files in one
run. Steady state: each side runs a short and a long pass, and throughput is
(long - short samples) / (long - short seconds), so start-up cancels out.

usage: image_text_bench.py --build BUILD --out DIR [--short N] [--long N]
"""
import argparse, glob, json, os, pathlib, shutil, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"


def run_mmfeed(build, data, samples):
    cfg = (ROOT / "configs" / "demo.yaml").read_text().replace("path: manifest.jsonl", f"path: manifest-{samples}.jsonl")
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "image_text"))
    ap.add_argument("--short", type=int, default=1024)
    ap.add_argument("--long", type=int, default=6144)
    a = ap.parse_args()
    data = pathlib.Path(a.out)
    subprocess.run([PY, str(ROOT / "scripts" / "make_dataset.py"), str(data), "--count", str(a.long)], check=True)
    lines = (data / "manifest.jsonl").read_text().splitlines()
    for n in (a.short, a.long):
        (data / f"manifest-{n}.jsonl").write_text("\n".join(lines[:n]) + "\n")
    files = sorted(glob.glob(str(data / "img" / "*.jpg")))
    res = {}
    res["mmfeed"] = steady(run_mmfeed(a.build, data, a.short), run_mmfeed(a.build, data, a.long))
    res["torch_dataloader"] = steady(run_torch(data, a.short), run_torch(data, a.long))
    reps = max(1, a.long // len(files))
    dec = json.loads(subprocess.run([f"{a.build}/bin/mmfeed-bench-decode", "--threads", "2", "--repeat", str(reps), *files],
                                    capture_output=True, text=True, check=True).stdout)
    res["bare_libjpeg_turbo_decode"] = dec["images_per_s"]
    res["mmfeed_vs_dataloader"] = res["mmfeed"] / res["torch_dataloader"]
    res["mmfeed_vs_bare_decode"] = res["mmfeed"] / res["bare_libjpeg_turbo_decode"]
    res["images"] = len(files)
    res["cores"] = os.cpu_count()
    print(json.dumps(res, indent=2))
    print(f"\n| pipeline | images/s (steady state) | ratio |\n|---|---|---|\n"
          f"| mmfeed (demo.yaml, 2 ranks) | {res['mmfeed']:.0f} | 1.00 |\n"
          f"| PyTorch DataLoader(num_workers=2) + torchvision | {res['torch_dataloader']:.0f} | "
          f"mmfeed is {res['mmfeed_vs_dataloader']:.2f}x |\n"
          f"| bare libjpeg-turbo full decode, 2 threads | {res['bare_libjpeg_turbo_decode']:.0f} | "
          f"mmfeed is {res['mmfeed_vs_bare_decode']:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
