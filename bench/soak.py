#!/usr/bin/env python3
"""Soak: the real daemon fed a dataset with 5% bad files, for SECONDS, while its two consumer
ranks are SIGKILLed and restarted at random (resuming with --cursor) and a third, slow
consumer (--hold-ms) holds rank 2. Checks, and prints:

- every rank's batches arrive in order with no gap, and no duplicate beyond one re-delivery per
  kill (a batch dumped but not yet recorded in the cursor file when the consumer died);
- no bad sample is ever delivered, and the daemon's accounting closes: failed = refilled
  (every failed row was refilled), skipped = failed (the log may lead the count by a few while samples fail);
- the daemon's RSS and open fds stay flat after warm-up.

usage: soak.py --bin BUILD/bin [--seconds 600] [--samples 20000]
Exit status 0 when every check holds. bench/soak.sh builds and runs it (10 minutes by default;
CI runs 60 s).
"""
import argparse, json, os, pathlib, random, shutil, signal, subprocess, sys, tempfile, time

CONFIG = """pipeline: soak
source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 3, epochs: 0}
consumers: 3
stages:
  - {name: text, type: text, field: text, workers: 2, params: {max_len: 32}}
  - {name: batch, type: batch, inputs: [text], params: {batch_size: 16}}
output: {ring_slots: 4}
"""


def rss_and_fds(pid):
    rss = 0
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--samples", type=int, default=20000)
    a = ap.parse_args()
    bin_dir = os.path.abspath(a.bin)
    work = pathlib.Path(tempfile.mkdtemp(prefix="mmfeed-soak-"))
    rng = random.Random(1)
    bad = set()
    with open(work / "manifest.jsonl", "w") as m:
        for i in range(a.samples):
            if rng.random() < 0.05:
                bad.add(f"b{i}")
                m.write(json.dumps({"id": f"b{i}", "text": {"path": f"missing/{i}.txt"}}) + "\n")
            else:
                m.write(json.dumps({"id": f"s{i}", "text": f"caption {i}"}) + "\n")
    (work / "p.yaml").write_text(CONFIG)
    sock = str(work / "mmfeed.sock")
    log = open(work / "daemon.log", "w+")
    daemon = subprocess.Popen([f"{bin_dir}/mmfeedd", "--config", str(work / "p.yaml"), "--socket", sock,
                               "--drain-timeout", "5", "--log-level", "warn"], stdout=log, stderr=log)
    while not os.path.exists(sock):
        time.sleep(0.02)

    def consume(rank, *extra):
        d = work / f"r{rank}"
        return subprocess.Popen([f"{bin_dir}/mmfeed-consume", "--socket", sock, "--rank", str(rank), "--cursor",
                                 str(work / f"r{rank}.cursor"), "--dump", str(d / f"run{runs[rank]}"), *extra],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    runs = [0, 0, 0]
    procs = [consume(0, "--hold-ms", "5"), consume(1, "--hold-ms", "5"), consume(2, "--hold-ms", "30")]
    kills = [0, 0]
    samples, failures = [], []
    t_end = time.time() + a.seconds
    next_sample = time.time() + 2
    while time.time() < t_end:
        time.sleep(rng.uniform(0.2, 1.5))
        r = rng.randrange(2)
        procs[r].send_signal(signal.SIGKILL)
        procs[r].wait()
        kills[r] += 1
        runs[r] += 1
        procs[r] = consume(r, "--hold-ms", "5")  # at once: the dead holder is taken over
        if time.time() >= next_sample:
            samples.append(rss_and_fds(daemon.pid))
            next_sample = time.time() + 2
        if daemon.poll() is not None:
            failures.append(f"the daemon exited ({daemon.returncode})")
            break
    status = json.loads(subprocess.run([f"{bin_dir}/mmfeedctl", "--socket", sock, "status", "--json"],
                                       capture_output=True, text=True).stdout)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(60)

    delivered = duplicates = 0
    for rank in range(3):
        seqs, ids = [], []
        for run in sorted((work / f"r{rank}").glob("run*"), key=lambda p: int(p.name[3:])):
            for b in sorted(run.iterdir()):
                try:  # a consumer killed while dumping leaves a partial batch: not delivered
                    meta = json.loads((b / "meta.json").read_text())
                except (FileNotFoundError, json.JSONDecodeError):
                    continue
                seqs.append(meta["seq"])
                ids += meta["ids"]
        delivered += len(seqs)
        # Resumed runs start at the cursor: the sequence may repeat a batch only where a kill
        # fell between its dump and the cursor write.
        expect, dup = 0, 0
        for s in seqs:
            if s == expect:
                expect += 1
            elif s == expect - 1:
                dup += 1
            else:
                failures.append(f"rank {rank}: batch {s} where {expect} was due")
                break
        allowed = kills[rank] if rank < 2 else 0
        if dup > allowed:
            failures.append(f"rank {rank}: {dup} duplicate batches for {allowed} kills")
        duplicates += dup
        if bad & set(ids):
            failures.append(f"rank {rank}: bad samples delivered: {sorted(bad & set(ids))[:5]}")
    s = status["profile"]["samples"]
    skipped = status["profile"]["errors"]["total"]
    # The status is taken while samples fail: each is logged, then counted, and the count is
    # read first, so the log may be a few ahead, never behind.
    if not 0 <= skipped - s["failed"] <= 16:
        failures.append(f"skipped {skipped} vs failed {s['failed']}")
    in_flight = s["failed"] - s["refilled"]
    if not 0 <= in_flight <= 3 * 4 * 16:  # rows of batches still being refilled when status was taken
        failures.append(f"failed {s['failed']} vs refilled {s['refilled']}")
    warm = samples[len(samples) // 4:] if len(samples) >= 4 else samples
    if warm:
        rss0, fds0 = warm[0]
        rss1, fds1 = max(x[0] for x in warm), max(x[1] for x in warm)
        if rss1 > rss0 * 1.25 + (32 << 20):
            failures.append(f"RSS grew from {rss0 >> 20} MiB to {rss1 >> 20} MiB")
        if fds1 > fds0 + 8:
            failures.append(f"open fds grew from {fds0} to {fds1}")
    else:
        rss0 = rss1 = fds0 = fds1 = 0
    print(json.dumps({"seconds": a.seconds, "kills": kills, "batches_delivered": delivered,
                      "duplicate_batches": duplicates, "samples_dealt": s["dealt"], "samples_failed": s["failed"],
                      "rows_refilled": s["refilled"], "rss_mib": [rss0 >> 20, rss1 >> 20], "fds": [fds0, fds1],
                      "failures": failures}))
    if failures:
        log.flush()
        print((work / "daemon.log").read_text()[-3000:], file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
