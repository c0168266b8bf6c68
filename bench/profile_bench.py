#!/usr/bin/env python3
"""The profile's own cost: the image-text pipeline's throughput with and without `mmfeedctl
profile` running (back-to-back windows), and with a trace recorded, in one run on the same
files. Segments alternate, each mode taking each position in turn, so that drift cancels; throughput is
the trainers' released batches over each segment, read from `mmfeedctl status` (cheap).
Target: with a profile running, at least 0.98x the throughput without.

usage: profile_bench.py [--build BUILD] [--segment S] [--rounds N] [--out DIR]
"""
import argparse, json, os, pathlib, signal, shutil, statistics, subprocess, sys, tempfile, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from daemon_test import CONFIG, make_dataset  # the integration tests' image-text pipeline


def cpu_ns(pid, tid=None):
    """CPU time of a process (all its threads) or of one of its threads."""
    if tid is not None:
        return int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
    return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{pid}/task"))


def released(ctl):
    status = json.loads(subprocess.run(ctl + ["status", "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    return sum(r["released"] for r in status["consumers"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--segment", type=float, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out"))
    a = ap.parse_args()
    d = pathlib.Path(tempfile.mkdtemp(prefix="mmfeed-profile-"))
    rates = {"off": [], "profile": [], "trace": []}
    control = {m: [] for m in rates}  # the daemon's control thread: CPU ms per s
    daemon = consumers = None
    try:
        make_dataset(d, 1024)
        (d / "p.yaml").write_text(CONFIG.format(source_type="manifest", path="manifest.jsonl", seed=1, epochs=0,
                                                consumers=2, workers=2, batch=32, placement=""))
        sock = str(d / "bench.sock")
        ctl = [f"{a.build}/bin/mmfeedctl", "--socket", sock]
        daemon = subprocess.Popen([f"{a.build}/bin/mmfeedd", "--config", str(d / "p.yaml"), "--socket", sock],
                                  stderr=subprocess.DEVNULL)
        while subprocess.run(ctl + ["status"], capture_output=True).returncode != 0:
            time.sleep(0.05)
        consumers = [subprocess.Popen([f"{a.build}/bin/mmfeed-consume", "--socket", sock, "--rank", str(r)],
                                      stdout=subprocess.DEVNULL) for r in range(2)]
        time.sleep(3)  # warm
        modes = list(rates)
        for k in range(a.rounds):
            for mode in modes[k % 3:] + modes[:k % 3]:  # each mode in each position in turn
                profiler = None
                if mode != "off":  # windows back to back over the whole segment
                    extra = ["--trace", str(d / "trace.json")] if mode == "trace" else []
                    profiler = subprocess.Popen(
                        ["bash", "-c", 'while true; do "$@" > /dev/null 2>&1; done', "-",
                         *ctl, "profile", "--seconds", "2", *extra], start_new_session=True)
                    time.sleep(0.2)
                n0, t0, c0 = released(ctl), time.monotonic(), cpu_ns(daemon.pid, daemon.pid)
                time.sleep(a.segment)
                n1, t1, c1 = released(ctl), time.monotonic(), cpu_ns(daemon.pid, daemon.pid)
                control[mode].append((c1 - c0) / 1e6 / (t1 - t0))
                if profiler:  # the loop and the window under way
                    os.killpg(profiler.pid, signal.SIGKILL)
                    profiler.wait()
                rates[mode].append((n1 - n0) * 32 / (t1 - t0))
    finally:
        for p in (consumers or []) + ([daemon] if daemon else []):
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)
    med = {m: statistics.median(r) for m, r in rates.items()}
    for m in rates:
        print(f"{m:<8} {med[m]:7.0f} samples/s (median of {len(rates[m])} segments of {a.segment:.0f}s: "
              f"{', '.join(f'{x:.0f}' for x in rates[m])})  {med[m] / med['off']:.3f}x; "
              f"control thread {statistics.median(control[m]):.1f} ms of CPU per s")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps({"samples_per_s": rates, "median": med,
                                                  "profile_ratio": med["profile"] / med["off"],
                                                  "trace_ratio": med["trace"] / med["off"],
                                                  "control_thread_cpu_ms_per_s": control}, indent=1) + "\n")


if __name__ == "__main__":
    main()
