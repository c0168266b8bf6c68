#!/usr/bin/env python3
"""Disk cache benchmark (#33 part 1, source.cache): the canonical image-text pipeline
(configs/demo.yaml's stages, two ranks) reading WebDataset shards from nginx with a
per-connection rate limit (an object store's bandwidth), three epochs, in one run:

- no cache (prefetch_bytes holds a third of the data, so every epoch fetches every shard): its
  nginx access log is the sequence of shard reads;
- a disk cache of half the data: the bytes it fetched against what Belady's MIN (the offline
  optimum, with bypass) and LRU of the same size fetch on that same sequence, computed here;
- a disk cache holding all the data: epochs 2-3 against epoch 1.

Epochs are timed by consuming each one separately (both ranks take one epoch's batches, then
the next pair attaches where they stopped). The shards are indexed once before (--state-dir),
so the runs fetch only to read.

usage: cache_bench.py [--build BUILD] [--out DIR] [--shards 32] [--per-shard 64] [--rate 8m]
"""
import argparse, json, pathlib, shutil, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import remote_bench  # noqa: E402
from remote_test import Nginx, min_and_lru, shard_gets  # noqa: E402

EPOCHS, RANKS, BATCH = 3, 2, 32


def run(name, build, work, url, source, batches_per_epoch, log):
    """Three epochs, each consumed separately; returns (seconds per epoch, shards GET in order)."""
    (work / "bench.yaml").write_text(remote_bench.config(url, EPOCHS, source))
    sock = work / "bench.sock"
    if sock.exists():
        sock.unlink()
    (work / "state" / "cursors.json").unlink(missing_ok=True)
    since = pathlib.Path(log).stat().st_size
    dlog = open(work / f"daemon-{name}.log", "w")
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(work / "bench.yaml"), "--socket", str(sock),
                          "--state-dir", str(work / "state")], stderr=dlog, stdout=dlog)
    while not sock.exists():
        if d.poll() is not None:
            raise SystemExit("mmfeedd did not start:\n" + (work / f"daemon-{name}.log").read_text())
        time.sleep(0.01)
    seconds = []
    for _ in range(EPOCHS):
        t0 = time.perf_counter()
        cs = [subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", str(sock), "--rank", str(r), "--json",
                                "--batches", str(batches_per_epoch)], stdout=subprocess.PIPE, text=True)
              for r in range(RANKS)]
        for c in cs:
            out = json.loads(c.communicate()[0])
            assert out["batches"] == batches_per_epoch, out
        seconds.append(time.perf_counter() - t0)
    d.wait()
    dlog.close()
    return seconds, shard_gets(log, since)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "cache"))
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--rate", default="8m", help="nginx limit_rate per connection")
    a = ap.parse_args()
    work = pathlib.Path(a.out)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    remote_bench.make_shards(work, a.shards, a.per_shard)
    sizes = {p.name: p.stat().st_size for p in (work / "shards").glob("*.tar")}
    total = sum(sizes.values())
    samples = a.shards * a.per_shard
    batches = samples // RANKS // BATCH
    n = Nginx(work / "shards", work / "nginx", server=f"    limit_rate {a.rate};")
    log = work / "nginx" / "nginx-access.log"
    try:
        url = f"{n.url}/{remote_bench.pattern(a.shards)}"
        (work / "check.yaml").write_text(remote_bench.config(url, 1))
        subprocess.run([f"{a.build}/bin/mmfeedd", "--check", str(work / "check.yaml"), "--state-dir",
                        str(work / "state")], check=True, capture_output=True)
        budget = f"prefetch_bytes: {total * 10 // a.shards}, fetch_concurrency: 4"
        plain_s, reads = run("plain", a.build, work, url, budget, batches, log)
        half = total // 2
        half_s, half_gets = run("half", a.build, work, url, f"{budget}, cache: {{dir: {work / 'half'}, max_bytes: {half}}}",
                                batches, log)
        full_s, full_gets = run("full", a.build, work, url,
                                f"{budget}, cache: {{dir: {work / 'full'}, max_bytes: {total * 2}}}", batches, log)
    finally:
        n.kill()
    # Cache files carry a trailer of under 300 bytes: MIN and LRU get the same room per shard.
    room = half - 300 * a.shards
    min_bytes, lru_bytes = min_and_lru(reads, room, sizes.get)
    got = sum(sizes[s] for s in half_gets)
    first = sum(sizes[s] for s in dict.fromkeys(reads))  # every shard once: no cache avoids that
    print(f"{a.shards} shards x {a.per_shard} samples ({total / 1e6:.0f} MB, ImageNet-sized photos), nginx "
          f"{a.rate}/connection, {EPOCHS} epochs, {RANKS} ranks; {len(reads)} shard reads without a cache")
    print()
    print("| disk cache of half the data | MB fetched | vs MIN | vs LRU | MB after the first fetch of each shard |")
    print("|---|---|---|---|---|")
    for name, b in (("mmfeed (next use from the order)", got), ("MIN, offline optimum", min_bytes),
                    ("LRU, offline", lru_bytes)):
        print(f"| {name} | {b / 1e6:.0f} | {b / min_bytes:.2f}x | {b / lru_bytes:.2f}x | "
              f"{(b - first) / 1e6:.0f} ({(b - first) / max(1, lru_bytes - first):.2f}x LRU's) |")
    print()
    print("| run | epoch 1 samples/s | epoch 2 | epoch 3 | epochs 2-3 vs epoch 1 | shards fetched |")
    print("|---|---|---|---|---|---|")
    for name, s, gets in (("no cache", plain_s, reads), ("cache of half the data", half_s, half_gets),
                          ("cache of all the data", full_s, full_gets)):
        rates = [samples / x for x in s]
        print(f"| {name} | {rates[0]:.0f} | {rates[1]:.0f} | {rates[2]:.0f} | "
              f"{(rates[1] + rates[2]) / 2 / rates[0]:.2f}x | {len(gets)} |")
    shutil.rmtree(work / "shards", ignore_errors=True)


if __name__ == "__main__":
    main()
