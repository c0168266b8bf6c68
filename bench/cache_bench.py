#!/usr/bin/env python3
"""Cache benchmarks (#33), side by side on the same files in one run.

--part remote (source.cache, disk cache of remote shards): the canonical image-text pipeline
(configs/demo.yaml's stages, two ranks) reading WebDataset shards from nginx with a
per-connection rate limit (an object store's bandwidth), three epochs:

- no cache (prefetch_bytes holds a third of the data, so every epoch fetches every shard): its
  nginx access log is the sequence of shard reads;
- a disk cache of half the data: the bytes it fetched against what Belady's MIN (the offline
  optimum, with bypass) and LRU of the same size fetch on that same sequence, computed here;
- a disk cache holding all the data: epochs 2-3 against epoch 1.

--part processed (a stage's cache:, processed samples in memory), on ImageNet-sized photos (image_text_bench.py's set):
- the canonical pipeline (random_resized_crop + flip, float32 CHW 224x224, two ranks) with a
  cache holding every image decoded: epochs 2-4 against a bare full-size libjpeg-turbo decode of
  the same files (mmfeed-bench-decode, as many threads as the pipeline's workers);
- configs/qwen3.5-vl.yaml with both stages cached: epochs 2-3 against its epoch 1;
- the canonical pipeline (64x64 outputs, one rank, its ids dumped) with a cache of half the
  decoded images: its hit rate against MIN's and LRU's of the same size on the same reads.

--part disk (a stage's cache with a disk tier, cache: {disk: {dir, max_bytes}}): the canonical
pipeline with memory for an eighth of the decoded images, alone and with a disk tier holding
them all, and with memory for them all: epochs 2-4 of each against epoch 1 and a bare decode.

Epochs are timed by consuming each one separately (the ranks take one epoch's batches, then
the next ones attach where they stopped). The shards are indexed once before (--state-dir),
so the remote runs fetch only to read.

usage: cache_bench.py [--build BUILD] [--out DIR] [--part remote,processed,disk] [--shards 32]
                      [--per-shard 64] [--rate 8m] [--samples 3200]
"""
import argparse, json, pathlib, re, shutil, subprocess, sys, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
import remote_bench  # noqa: E402
import image_text_bench  # noqa: E402
from cache_test import cache_figures  # noqa: E402
from cache_test import min_and_lru  # noqa: E402
from remote_test import Nginx, shard_gets  # noqa: E402

EPOCHS, RANKS, BATCH = 3, 2, 32


def start(name, build, work, config, extra=()):
    """mmfeedd on `config`, serving; returns (the process, its socket, its log file)."""
    (work / f"{name}.yaml").write_text(config)
    sock = work / "bench.sock"
    if sock.exists():
        sock.unlink()
    dlog = open(work / f"daemon-{name}.log", "w")
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(work / f"{name}.yaml"), "--socket", str(sock),
                          *extra], stderr=dlog, stdout=dlog)
    while not sock.exists():
        if d.poll() is not None:
            raise SystemExit("mmfeedd did not start:\n" + (work / f"daemon-{name}.log").read_text())
        time.sleep(0.01)
    return d, sock, dlog


def epochs(name, build, work, config, epochs, ranks, batches_per_epoch, extra=(), dump=None):
    """The daemon on `config`, its epochs consumed one by one; returns (seconds per epoch, the
    daemon's log)."""
    d, sock, dlog = start(name, build, work, config, extra)
    seconds = []
    for e in range(epochs):
        t0 = time.perf_counter()
        cs = [subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", str(sock), "--rank", str(r), "--json",
                                "--batches", str(batches_per_epoch),
                                *(["--dump", str(dump / f"e{e}r{r}")] if dump else [])],
                               stdout=subprocess.PIPE, text=True)
              for r in range(ranks)]
        for c in cs:
            out = json.loads(c.communicate()[0])
            assert out["batches"] == batches_per_epoch, out
        seconds.append(time.perf_counter() - t0)
    d.wait()
    dlog.close()
    return seconds, (work / f"daemon-{name}.log").read_text()


def epochs_by_cursor(name, build, work, config):
    """One rank consumes every epoch of `config` (token budgets: the batches per epoch vary);
    each epoch ends when the cursor the consumer writes after every batch enters the next one.
    Returns (seconds per epoch, the daemon's log)."""
    d, sock, dlog = start(name, build, work, config)
    cursor = work / f"{name}.cursor"
    cursor.unlink(missing_ok=True)
    t0 = time.perf_counter()
    c = subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", str(sock), "--rank", "0", "--json",
                          "--cursor", str(cursor)], stdout=subprocess.PIPE, text=True)
    ends = []

    def seen():  # an epoch the cursor has entered ends the one before
        try:
            epoch = json.loads(cursor.read_text())["epoch"]
        except (OSError, ValueError):
            epoch = 0
        while len(ends) < epoch:
            ends.append(time.perf_counter())

    while c.poll() is None:
        seen()
        time.sleep(0.002)
    c.communicate()
    seen()  # the last batch's cursor is the next epoch's start
    d.wait()
    dlog.close()
    return [b - a for a, b in zip([t0] + ends, ends)], (work / f"daemon-{name}.log").read_text()


def run(name, build, work, url, source, batches_per_epoch, log):
    """Three epochs of the remote config, each consumed separately; returns (seconds per epoch,
    shards GET in order)."""
    (work / "state" / "cursors.json").unlink(missing_ok=True)
    since = pathlib.Path(log).stat().st_size
    seconds, _ = epochs(name, build, work, remote_bench.config(url, EPOCHS, source), EPOCHS, RANKS,
                        batches_per_epoch, ("--state-dir", str(work / "state")))
    return seconds, shard_gets(log, since)


def remote(a, work):
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


PROCESSED_EPOCHS = 4


def canonical(epochs_, consumers, size=224, cache=""):
    """configs/demo.yaml's pipeline for `epochs_` epochs; `cache`: the image stage's cache line."""
    text = (ROOT / "configs" / "demo.yaml").read_text()
    for old, new in (("epochs: 1", f"epochs: {epochs_}"), ("consumers: 2", f"consumers: {consumers}"),
                     ("size: [224, 224]", f"size: [{size}, {size}]"),
                     ("field: image, workers: 2,", f"field: image, workers: 2,{cache}")):
        assert old in text, old
        text = text.replace(old, new)
    return text


def photo_set(a, work):
    """The bench's ImageNet-sized photo set: (photos, each sample's decoded bytes as the image
    cache keeps them, a function timing a bare full-size libjpeg-turbo decode of the same files
    on 2 threads in images/s)."""
    image_text_bench.imagenet_set(work, a.samples)
    photos = json.loads((work / "img" / "pphotos.json").read_text())
    decoded = {f"s{i:06d}": photos[i % len(photos)]["width"] * photos[i % len(photos)]["height"] * 3 + 8
               for i in range(a.samples)}
    files = [str(work / "img" / p["name"]) for p in photos]

    def bare():
        out = subprocess.run([f"{a.build}/bin/mmfeed-bench-decode", "--threads", "2", "--repeat",
                              str(max(1, a.samples // len(files))), *files],
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)["images_per_s"]

    return photos, decoded, bare


def processed(a, work):
    photos, decoded, bare = photo_set(a, work)
    total = sum(decoded.values())
    bare_before = bare()
    batches = -(-a.samples // 2 // 32)  # the last batch of an epoch may be short
    crop_s, crop_log = epochs("crop", a.build, work,
                              canonical(PROCESSED_EPOCHS, 2, cache=f" cache: {{max_bytes: {total * 2}}},"),
                              PROCESSED_EPOCHS, 2, batches)
    bare_after = bare()
    bare_rate = (bare_before + bare_after) / 2
    # Qwen keeps its patches (about 4 MB a sample here): a quarter of the samples, each photo twice.
    qwen_samples = min(a.samples, 2 * len(photos))
    lines = (work / "manifest.jsonl").read_text().splitlines()[:qwen_samples]
    (work / "qwen.jsonl").write_text("".join(json.dumps({**json.loads(l), "answer": "A photo."}) + "\n" for l in lines))
    qwen = (ROOT / "configs" / "qwen3.5-vl.yaml").read_text().replace("path: manifest.jsonl", "path: qwen.jsonl")
    qwen = qwen.replace("../tests/data/tokenizer/", str(ROOT / "tests" / "data" / "tokenizer") + "/")
    qwen = qwen.replace("epochs: 1", "epochs: 3")
    qwen = re.sub(r"(- \{name: (pixel_values|input_ids), type: \w+, field: \w+,)", r"\1 cache: {},", qwen)
    qwen += "cache_budget: 12G\n"
    qwen_s, qwen_log = epochs_by_cursor("qwen", a.build, work, qwen)
    # Half the decoded images: one rank, small outputs, its reads dumped.
    half_dump = work / "half-dump"
    _, half_log = epochs("half", a.build, work, canonical(PROCESSED_EPOCHS, 1, 64, f" cache: {{max_bytes: {total // 2}}},"),
                         PROCESSED_EPOCHS, 1, -(-a.samples // 32), dump=half_dump)
    reads = []
    for e in range(PROCESSED_EPOCHS):
        for b in sorted((half_dump / f"e{e}r0").iterdir()):
            reads += json.loads((b / "meta.json").read_text())["ids"]
    shutil.rmtree(half_dump)
    hits, misses, _ = cache_figures(half_log, "image")
    min_misses, lru_misses = min_and_lru(reads, total // 2, decoded.get, cost=lambda x: 1)

    crop_rates = [a.samples / x for x in crop_s]
    later = sum(crop_rates[1:]) / (len(crop_rates) - 1)
    print(f"{a.samples} samples of {len(photos)} ImageNet-sized photos (240-620 px wide), "
          f"{total / 1e6:.0f} MB decoded; {PROCESSED_EPOCHS} epochs")
    print()
    print("| pipeline | epoch 1 samples/s | epochs 2+ samples/s | epochs 2+ vs epoch 1 | vs bare full decode |")
    print("|---|---|---|---|---|")
    print(f"| canonical (random_resized_crop + flip, float32 224x224, 2 ranks), cache of every decoded image | "
          f"{crop_rates[0]:.0f} | {later:.0f} | {later / crop_rates[0]:.2f}x | {later / bare_rate:.2f}x |")
    qwen_rates = [qwen_samples / x for x in qwen_s]
    qwen_later = sum(qwen_rates[1:]) / (len(qwen_rates) - 1)
    print(f"| configs/qwen3.5-vl.yaml ({qwen_samples} samples, 1 rank), both stages cached (outputs kept) | "
          f"{qwen_rates[0]:.0f} | {qwen_later:.0f} | "
          f"{qwen_later / qwen_rates[0]:.2f}x | |")
    print(f"| bare full-size libjpeg-turbo decode, 2 threads (before and after) | | {bare_rate:.0f} | | 1.00x |")
    print()
    print("| cache of half the decoded images | hits | hit rate | vs MIN | vs LRU |")
    print("|---|---|---|---|---|")
    n = len(reads)
    for name, h in (("mmfeed (next use from the order)", hits), ("MIN, offline", n - min_misses),
                    ("LRU, offline", n - lru_misses)):
        print(f"| {name} | {h} | {h / n:.1%} | {h / (n - min_misses):.2f}x | {h / max(1, n - lru_misses):.2f}x |")
    for log in (crop_log, qwen_log):
        for line in log.splitlines():
            if ": cache hits" in line:
                print("   ", line)


def disk(a, work):
    """The canonical pipeline with memory for an eighth of the decoded images: alone, and with a
    disk tier holding them all; a memory cache of them all for comparison."""
    photos, decoded, bare = photo_set(a, work)
    total = sum(decoded.values())
    batches = -(-a.samples // 2 // 32)
    bare_before = bare()
    runs = [("memory for 1/8 of the decoded images", f" cache: {{max_bytes: {total // 8}}},"),
            ("memory for 1/8, disk tier for all", f" cache: {{max_bytes: {total // 8}, disk: "
                                                  f"{{dir: {work / 'tier'}, max_bytes: {total * 2}}}}},"),
            ("memory for all", f" cache: {{max_bytes: {total * 2}}},")]
    rates, logs = [], []
    for k, (_, cache) in enumerate(runs):
        took, log = epochs(f"disk{k}", a.build, work, canonical(PROCESSED_EPOCHS, 2, cache=cache),
                           PROCESSED_EPOCHS, 2, batches)
        rates.append([a.samples / x for x in took])
        logs.append(log)
    bare_rate = (bare_before + bare()) / 2
    print(f"{a.samples} samples of {len(photos)} ImageNet-sized photos, {total / 1e6:.0f} MB decoded; "
          f"{PROCESSED_EPOCHS} epochs, canonical pipeline (random_resized_crop + flip, float32 224x224, 2 ranks)")
    print()
    print("| image stage's cache | epoch 1 samples/s | epochs 2+ samples/s | epochs 2+ vs epoch 1 | vs bare full decode |")
    print("|---|---|---|---|---|")
    for (name, _), r in zip(runs, rates):
        later = sum(r[1:]) / (len(r) - 1)
        print(f"| {name} | {r[0]:.0f} | {later:.0f} | {later / r[0]:.2f}x | {later / bare_rate:.2f}x |")
    print(f"| bare full-size libjpeg-turbo decode, 2 threads (before and after) | | {bare_rate:.0f} | | 1.00x |")
    for log in logs:
        for line in log.splitlines():
            if ": cache " in line:
                print("   ", line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "cache"))
    ap.add_argument("--part", default="remote,processed,disk")
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--rate", default="8m", help="nginx limit_rate per connection")
    ap.add_argument("--samples", type=int, default=3200)
    a = ap.parse_args()
    for part in a.part.split(","):
        work = pathlib.Path(a.out) / part
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        {"remote": remote, "processed": processed, "disk": disk}[part](a, work)
        print()


if __name__ == "__main__":
    main()
