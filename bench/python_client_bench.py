#!/usr/bin/env python3
"""Python client benchmark, side by side with the C++ client, in one run:

1. Per-batch overhead: a ring of 64 slots is filled with 64 ready batches (image-text, 4
   tensors), then drained by mmfeed-consume and by a Python loop (next(), wrap every tensor as
   a numpy view, release). Median microseconds per batch. Then the cost of torch()'s writable
   copy-on-write view: the same batches read whole (sum of every tensor) through read-only
   torch views, through b.torch(), and through b.torch() after an in-place add_ on the image.
2. Throughput: configs/demo.yaml's image-text pipeline (two ranks) consumed by two
   mmfeed-consume processes, then by two Python processes (`for b in mmfeed.Client(): b.torch()`),
   then the PyTorch DataLoader(num_workers=2) baseline over the same files
   (bench/torch_baseline.py). Steady state: (long - short) samples / (long - short) seconds,
   each consumer timed by its own clock from attach to its last batch. The C++ and Python
   measurements alternate --trials times, and the ratio reported is the median of the
   trials' ratios: single runs vary by about 10% on a small VM.

usage: python_client_bench.py [--build build] [--out bench/out/python_client] [--short 512] [--long 2048]
                              [--trials 5]
Prints one JSON object.
"""
import argparse, json, os, pathlib, statistics, subprocess, sys, textwrap, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"

# Imports first, then says so and waits for the daemon's socket: the bench starts the daemon only
# once both Python consumers are ready, so that importing torch does not take CPU from it.
PY_CONSUMER = """
import json, os, sys, time, torch, mmfeed
print("ready", flush=True)
while True:  # the socket's file appears just before the daemon listens on it
    try:
        t0 = time.perf_counter()
        client = mmfeed.Client(socket=sys.argv[1], rank=int(sys.argv[2]))
        break
    except mmfeed.AttachError:
        time.sleep(0.005)
n = 0
for b in client:
    t = b.torch(); n += len(b.ids); del t, b
s = time.perf_counter() - t0
print(json.dumps({"samples": n, "seconds": s}))
"""

# Modes: "numpy" wraps every tensor as a read-only numpy view; the torch modes also read every
# byte (sum): "torch_readonly" over torch.from_numpy of those read-only views (what torch() was
# before it became writable), "torch" over b.torch() (the ring's copy-on-write view), and
# "torch_write" adds 1 to the image tensor in place first (its pages become private copies,
# dropped at the release).
PY_OVERHEAD = """
import json, statistics, sys, time, warnings, mmfeed
mode = sys.argv[2]
if mode != "numpy":
    import torch
    warnings.simplefilter("ignore", UserWarning)
c = mmfeed.Client(socket=sys.argv[1], rank=0)
us = []
while True:
    t0 = time.perf_counter()
    b = c.next()
    if b is None:
        break
    if mode == "numpy":
        views = b.tensors
    elif mode == "torch_readonly":
        views = {k: torch.from_numpy(v) for k, v in b.tensors.items()}
    else:
        views = b.torch()
        if mode == "torch_write":
            views["image"].add_(1)
    if mode != "numpy":
        [v.sum() for v in views.values()]  # a loop variable would keep the last tensor (the lease)
    del views
    b.release()
    us.append((time.perf_counter() - t0) * 1e6)
print(json.dumps({"batches": len(us), "batch_us_median": statistics.median(us)}))
"""


def start_daemon(build, cfg_text, data, name):
    (data / f"{name}.yaml").write_text(cfg_text)
    sock = data / f"{name}.sock"
    if sock.exists():
        sock.unlink()
    log = open(data / f"{name}.log", "w")
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(data / f"{name}.yaml"), "--socket", str(sock)],
                         stderr=log)
    while not sock.exists():
        time.sleep(0.01)
    return d, str(sock)


def published(build, sock):
    out = subprocess.run([f"{build}/bin/mmfeedctl", "--socket", sock, "status", "--json"], capture_output=True,
                         text=True).stdout
    return json.loads(out)["consumers"][0]["published"] if out else 0


def overhead(build, data, manifest, python, mode="numpy"):
    cfg = (ROOT / "configs" / "demo.yaml").read_text().replace("path: manifest.jsonl", f"path: {manifest}")
    cfg = cfg.replace("consumers: 2", "consumers: 1").replace("ring_slots: 8", "ring_slots: 64")
    if "ring_slots: 64" not in cfg:
        cfg += "output: {ring_slots: 64}\n"
    d, sock = start_daemon(build, cfg, data, "overhead")
    while published(build, sock) < 64:  # every slot holds a ready batch
        time.sleep(0.1)
    if python:
        out = subprocess.run([PY, "-c", PY_OVERHEAD, sock, mode], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=f"{build}/python"))
    else:
        out = subprocess.run([f"{build}/bin/mmfeed-consume", "--socket", sock, "--rank", "0", "--json"],
                             capture_output=True, text=True)
    d.wait()
    return json.loads(out.stdout)["batch_us_median"]


def throughput(build, data, manifest, python):
    cfg = (ROOT / "configs" / "demo.yaml").read_text().replace("path: manifest.jsonl", f"path: {manifest}")
    if python:
        sock = data / "throughput.sock"
        if sock.exists():
            sock.unlink()
        env = dict(os.environ, PYTHONPATH=f"{build}/python")
        cs = [subprocess.Popen([PY, "-c", PY_CONSUMER, str(sock), str(r)], stdout=subprocess.PIPE, text=True, env=env)
              for r in (0, 1)]
        for c in cs:
            assert c.stdout.readline().strip() == "ready"
        d, _ = start_daemon(build, cfg, data, "throughput")
    else:
        d, sock = start_daemon(build, cfg, data, "throughput")
        cs = [subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", sock, "--rank", str(r), "--json"],
                               stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    # Each consumer's own clock runs from its attach to its last batch (interpreter start-up and
    # imports excluded, as mmfeed-consume's own clock excludes nothing comparable).
    outs = [json.loads(c.communicate()[0]) for c in cs]
    d.wait()
    return sum(o["samples"] for o in outs), max(o["seconds"] for o in outs)


def torch_baseline(data, manifest, samples):
    out = subprocess.run([PY, str(ROOT / "bench" / "torch_baseline.py"), str(data / manifest), "--samples",
                          str(samples)], capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    return j["samples"], j["seconds"]


def steady(run, short, long):
    s0, t0 = run(short)
    s1, t1 = run(long)
    return (s1 - s0) / (t1 - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "python_client"))
    ap.add_argument("--short", type=int, default=512)
    ap.add_argument("--long", type=int, default=2048)
    ap.add_argument("--trials", type=int, default=5)
    a = ap.parse_args()
    data = pathlib.Path(a.out)
    data.mkdir(parents=True, exist_ok=True)
    if not (data / "manifest.jsonl").exists() or len((data / "manifest.jsonl").read_text().splitlines()) < a.long:
        subprocess.run([PY, str(ROOT / "scripts" / "make_dataset.py"), str(data), "--count", str(a.long)], check=True,
                       stdout=subprocess.DEVNULL)
    lines = (data / "manifest.jsonl").read_text().splitlines()
    for n in (a.short, a.long):
        (data / f"manifest-{n}.jsonl").write_text("\n".join(lines[:n]) + "\n")
    res = {}
    cpp_us = [overhead(a.build, data, f"manifest-{a.long}.jsonl", False) for _ in range(3)]
    py_us = [overhead(a.build, data, f"manifest-{a.long}.jsonl", True) for _ in range(3)]
    res["batch_overhead_us"] = {"cpp": statistics.median(cpp_us), "python": statistics.median(py_us)}
    # What the writable torch() costs: the same ready batches read whole through each way.
    for mode in ("torch_readonly", "torch", "torch_write"):
        res["batch_overhead_us"][mode] = statistics.median(
            [overhead(a.build, data, f"manifest-{a.long}.jsonl", True, mode) for _ in range(3)])
    res["torch_vs_readonly"] = round(res["batch_overhead_us"]["torch"] / res["batch_overhead_us"]["torch_readonly"], 3)
    cpps, pys = [], []
    for _ in range(a.trials):
        cpps.append(steady(lambda n: throughput(a.build, data, f"manifest-{n}.jsonl", False), a.short, a.long))
        pys.append(steady(lambda n: throughput(a.build, data, f"manifest-{n}.jsonl", True), a.short, a.long))
    cpp, py = statistics.median(cpps), statistics.median(pys)
    res["samples_per_s"] = {"mmfeed_consume": round(cpp), "python_client": round(py)}
    res["python_vs_cpp_trials"] = [round(p / c, 3) for c, p in zip(cpps, pys)]
    res["python_vs_cpp"] = statistics.median(res["python_vs_cpp_trials"])
    try:
        base = steady(lambda n: torch_baseline(data, f"manifest-{n}.jsonl", n), a.short, a.long)
        res["samples_per_s"]["torch_dataloader_2_workers"] = round(base)
        res["python_client_vs_dataloader"] = round(py / base, 2)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        res["torch_dataloader_2_workers"] = f"not run: {e}"
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
