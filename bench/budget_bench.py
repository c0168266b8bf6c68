#!/usr/bin/env python3
"""Token-budget batches against fixed-size batches, in one run on the same samples:
configs/qwen3.5-vl.yaml as shipped (batch_size 8 at most, max_tokens 8192, max_patches 16384)
and the same config without its budgets (batches of exactly 8), on photos 240-2000 px wide
(so 64 to 3920 patches each) with chats of 20-200 words, read by a Python trainer loop
(mmfeed.Client). Reported per side: samples/s, batches, tokens and patches per batch (mean,
largest: the largest decides the GPU memory a trainer must provision), the budget's fill, and
the time the budgeted daemon took at start to measure every sample (from its log), also with a
cold page cache (`mmfeedd --check` after dropping the caches, as root).

usage: budget_bench.py --build BUILD --out DIR [--samples N] [--rounds R]
"""
import argparse, json, os, pathlib, random, re, statistics, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"
sys.path.insert(0, str(ROOT / "scripts"))
import make_photos  # noqa: E402
from qwen_bench import start_daemon  # noqa: E402

TOKENIZER = ROOT / "tests" / "data" / "tokenizer" / "qwen3-tokenizer.json.gz"
READER = r'''
import json, sys, time
import mmfeed
rows = []
t0 = None
for b in mmfeed.Client(socket=sys.argv[1], rank=0, timeout_s=600):
    with b:
        if t0 is None:
            t0 = time.perf_counter()
        rows.append((len(b.ids), int(b["input_ids_lengths"].sum()), int(b["pixel_values"].shape[0])))
print(json.dumps({"batches": rows, "seconds": time.perf_counter() - t0}))
'''


def make_set(d, count):
    photos = make_photos.make(d, count, 240, 2000, seed=13)
    rng = random.Random(1)
    words = ("what", "is", "in", "the", "photo", "a", "red", "house", "dog", "park", "describe", "it")
    lines = []
    for i, p in enumerate(photos):
        lines.append({"image": p["name"], "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) + "?",
                      "answer": " ".join(rng.choice(words) for _ in range(rng.randint(20, 200))) + "."})
    return lines


MEASURED = r"token budget: (\d+) samples measured in ([0-9.]+)s"


def write_config(d, budget, samples, lines):
    with open(d / "manifest-bench.jsonl", "w") as m:
        for i in range(samples):
            m.write(json.dumps(dict(lines[i % len(lines)], id=f"s{i}")) + "\n")
    cfg = (ROOT / "configs" / "qwen3.5-vl.yaml").read_text()
    cfg = cfg.replace("path: manifest.jsonl", "path: manifest-bench.jsonl")
    cfg = cfg.replace("../tests/data/tokenizer/qwen3-tokenizer.json.gz", str(TOKENIZER))
    if not budget:
        cfg = cfg.replace(", max_tokens: 8192, max_patches: 16384", "")
        assert "max_tokens" not in cfg.split("stages:")[1].split("- {name: batch")[1]
    (d / "bench.yaml").write_text(cfg)


def cold_measure(build, d, samples, lines):
    """Seconds the budgeted config's `mmfeedd --check` spends measuring with a cold page cache
    (None where caches cannot be dropped: not root)."""
    write_config(d, True, samples, lines)
    try:
        os.sync()
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return None
    out = subprocess.run([f"{build}/bin/mmfeedd", "--check", str(d / "bench.yaml")],
                         capture_output=True, text=True, check=True)
    return float(re.search(MEASURED, out.stdout + out.stderr).group(2))


def run(build, d, budget, samples, lines):
    write_config(d, budget, samples, lines)
    t0 = time.perf_counter()
    daemon, sock = start_daemon(build, d)
    serving = time.perf_counter() - t0
    out = subprocess.run([PY, "-c", READER, sock], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=f"{build}/python")).stdout
    daemon.wait()
    r = json.loads(out)
    m = re.search(MEASURED, (d / "daemon.log").read_text())
    r["measure_s"] = float(m.group(2)) if m else 0.0
    r["start_s"] = serving
    return r


def summary(r, samples):
    rows, tokens, patches = zip(*r["batches"])
    return {"samples_per_s": sum(rows) / r["seconds"], "samples": sum(rows), "batches": len(rows),
            "tokens_mean": statistics.mean(tokens), "tokens_max": max(tokens),
            "patches_mean": statistics.mean(patches), "patches_max": max(patches),
            "rows_mean": statistics.mean(rows), "measure_s": r["measure_s"], "start_s": r["start_s"],
            "measure_ms_per_sample": 1000 * r["measure_s"] / samples}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "budget"))
    ap.add_argument("--samples", type=int, default=480)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    d = pathlib.Path(a.out)
    d.mkdir(parents=True, exist_ok=True)
    lines = make_set(d, 120)
    cold = cold_measure(a.build, d, a.samples, lines)
    rounds = []
    for _ in range(a.rounds):
        fixed = summary(run(a.build, d, False, a.samples, lines), a.samples)
        budget = summary(run(a.build, d, True, a.samples, lines), a.samples)
        rounds.append({"fixed": fixed, "budget": budget})
        print(f"fixed {fixed['samples_per_s']:.1f}/s, budget {budget['samples_per_s']:.1f}/s "
              f"({budget['samples_per_s'] / fixed['samples_per_s']:.2f}x); measuring "
              f"{budget['measure_ms_per_sample']:.2f} ms/sample", file=sys.stderr)
    med = {side: {k: statistics.median(r[side][k] for r in rounds) for k in rounds[0][side]}
           for side in ("fixed", "budget")}
    print(json.dumps(med, indent=2))
    f, b = med["fixed"], med["budget"]
    print("\n| batches of | samples/s | batches | tokens per batch (mean / largest) | "
          "patches per batch (mean / largest) | samples per batch |\n|---|---|---|---|---|---|")
    for name, r in (("exactly 8 samples", f), ("max_tokens 8192, max_patches 16384, <= 8 samples", b)):
        print(f"| {name} | {r['samples_per_s']:.1f} | {r['batches']:.0f} | {r['tokens_mean']:.0f} / "
              f"{r['tokens_max']:.0f} | {r['patches_mean']:.0f} / {r['patches_max']:.0f} | {r['rows_mean']:.2f} |")
    print(f"\nthroughput budget / fixed: {b['samples_per_s'] / f['samples_per_s']:.2f}x; measuring at start: "
          f"{b['measure_ms_per_sample']:.2f} ms per sample ({b['measure_s']:.2f} s for {a.samples}) with a warm "
          f"page cache" + (f", {1000 * cold / a.samples:.2f} ms per sample cold ({cold:.2f} s)" if cold else ""))


if __name__ == "__main__":
    sys.exit(main())
