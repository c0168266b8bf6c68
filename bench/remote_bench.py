#!/usr/bin/env python3
"""Remote-shard benchmark: the canonical image-text pipeline (configs/demo.yaml's stages, two
consumer ranks) reading WebDataset shards from nginx on loopback, against the same pipeline on
the same shards as local files, and against the webdataset-style PyTorch baseline (DataLoader
(num_workers=2) whose workers stream their shards over HTTP with urllib + tarfile, decode with
PIL and transform with torchvision), in one run. Two servers: nginx at full speed, and nginx
with a per-connection rate limit (`--rate`, as an object store gives each connection a
bandwidth), where mmfeed runs with fetch_concurrency 1 and 4. mmfeed's prefetch_bytes holds a
third of the data, so that every epoch fetches its shards again. Steady state: each run is made
for --epochs and 2 x --epochs, and throughput is the difference of samples over the difference
of seconds, so start-up cancels out.

usage: remote_bench.py --build BUILD --out DIR [--shards 16] [--per-shard 64] [--epochs 2] [--rate 4m]
       remote_bench.py --baseline URL... --epochs N   (the PyTorch side, run in its own process)
"""
import argparse, io, json, os, pathlib, random, shutil, subprocess, sys, tarfile, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))


def make_shards(d, shards, per_shard):
    import make_photos
    make_photos.make(d / "img", 200, 240, 620, seed=7)
    photos = sorted((d / "img").glob("p*.jpg"))
    rng = random.Random(0)
    (d / "shards").mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with tarfile.open(d / "shards" / f"shard-{s:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(s * per_shard, (s + 1) * per_shard):
                words = " ".join(rng.choice(("a", "photo", "of", "the", "red", "house", "dog")) for _ in range(12))
                for ext, data in (("jpg", photos[i % len(photos)].read_bytes()), ("txt", words.encode())):
                    info = tarfile.TarInfo(f"s{i:06d}.{ext}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))


def pattern(shards):
    return "shard-{0000..%04d}.tar" % (shards - 1)


def config(path, epochs, source=""):
    cfg = (ROOT / "configs" / "demo.yaml").read_text()
    return cfg.replace("{type: manifest, path: manifest.jsonl, shuffle: true, seed: 42, epochs: 1}",
                       f'{{type: webdataset, path: "{path}", shuffle: true, seed: 42, epochs: {epochs}, '
                       f'shuffle_window: 4{", " + source if source else ""}}}')


def run_mmfeed(build, work, path, source, epochs):
    (work / "bench.yaml").write_text(config(path, epochs, source))
    sock = work / "bench.sock"
    if sock.exists():
        sock.unlink()
    log = open(work / "daemon.log", "w")
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(work / "bench.yaml"), "--socket", str(sock),
                          "--state-dir", str(work / "state")], stderr=log, stdout=log)
    while not sock.exists():
        if d.poll() is not None:
            raise SystemExit("mmfeedd did not start:\n" + (work / "daemon.log").read_text())
        time.sleep(0.01)
    t0 = time.perf_counter()
    cs = [subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", str(sock), "--rank", str(r), "--json"],
                           stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [json.loads(c.communicate()[0]) for c in cs]
    seconds = time.perf_counter() - t0
    d.wait()
    log.close()
    return {"samples": sum(o["samples"] for o in outs), "seconds": seconds}


def run_baseline(urls, epochs):
    out = subprocess.run([PY, __file__, "--baseline", *urls, "--epochs", str(epochs)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def baseline_main(urls, epochs):
    """webdataset's way: each DataLoader worker streams its share of the shards (shuffled per
    epoch) and yields samples through a small shuffle buffer."""
    import urllib.request
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
    from torchvision import transforms

    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(),
                             transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    class Shards(IterableDataset):
        def __iter__(self):
            w = get_worker_info()
            rng = random.Random(w.id)
            buffer = []
            for e in range(epochs):
                order = list(urls)
                random.Random(e).shuffle(order)
                for url in order[w.id::w.num_workers]:
                    with urllib.request.urlopen(url) as resp, tarfile.open(fileobj=resp, mode="r|") as t:
                        sample = {}
                        for m in t:
                            key, ext = m.name.split(".", 1)
                            sample[ext] = t.extractfile(m).read()
                            if len(sample) == 2:
                                buffer.append(sample)
                                sample = {}
                                if len(buffer) >= 64:
                                    yield self.item(buffer.pop(rng.randrange(len(buffer))))
            while buffer:
                yield self.item(buffer.pop())

        def item(self, s):
            img = tf(Image.open(io.BytesIO(s["jpg"])).convert("RGB"))
            ids = torch.zeros(128, dtype=torch.int32)
            b = s["txt"][:128]
            ids[:len(b)] = torch.tensor(list(b), dtype=torch.int32)
            return img, ids, len(b)

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    n = 0
    for img, _, _ in DataLoader(Shards(), batch_size=32, num_workers=2):
        n += img.shape[0]
    print(json.dumps({"samples": n, "seconds": time.perf_counter() - t0}))


def steady(run, *args):
    a, b = run(*args[:-1], args[-1]), run(*args[:-1], 2 * args[-1])
    return (b["samples"] - a["samples"]) / (b["seconds"] - a["seconds"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "remote"))
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rate", default="4m", help="nginx limit_rate per connection for the rate-limited server")
    ap.add_argument("--baseline", nargs="+")
    a = ap.parse_args()
    if a.baseline:
        return baseline_main(a.baseline, a.epochs)
    from remote_test import Nginx
    work = pathlib.Path(a.out)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    make_shards(work, a.shards, a.per_shard)
    shard_bytes = sum(p.stat().st_size for p in (work / "shards").glob("*.tar"))
    # Room for 10 shards (two and a half windows of 4), a third of the data: every epoch fetches
    # its shards again, as a data set much larger than the budget would.
    budget = f"prefetch_bytes: {shard_bytes * 10 // a.shards}"
    fast = Nginx(work / "shards", work / "nginx")
    slow = Nginx(work / "shards", work / "nginx", server=f"    limit_rate {a.rate};")
    try:
        urls = {name: f"{n.url}/{pattern(a.shards)}" for name, n in (("fast", fast), ("slow", slow))}
        # Index once per server (the URL names the index), timed: the first start's cost.
        index_s = {}
        for name, url in urls.items():
            (work / "check.yaml").write_text(config(url, 1))
            t0 = time.perf_counter()
            subprocess.run([f"{a.build}/bin/mmfeedd", "--check", str(work / "check.yaml"), "--state-dir",
                            str(work / "state")], check=True, capture_output=True)
            index_s[name] = time.perf_counter() - t0
        local = str(work / "shards" / pattern(a.shards))
        rows = [("mmfeed, local shards", steady(run_mmfeed, a.build, work, local, "index: on", a.epochs), None)]
        expand = [f"{fast.url}/shard-{s:04d}.tar" for s in range(a.shards)]
        rows.append(("mmfeed, nginx full speed", steady(run_mmfeed, a.build, work, urls["fast"], budget, a.epochs),
                     "fast"))
        rows.append(("PyTorch webdataset-style, nginx full speed", steady(run_baseline, expand, a.epochs), "fast"))
        slow_urls = [u.replace(fast.url, slow.url) for u in expand]
        for c in (1, 4):
            rows.append((f"mmfeed, nginx {a.rate}/connection, fetch_concurrency {c}",
                         steady(run_mmfeed, a.build, work, urls["slow"], f"{budget}, fetch_concurrency: {c}",
                                a.epochs), "slow"))
        rows.append((f"PyTorch webdataset-style, nginx {a.rate}/connection", steady(run_baseline, slow_urls, a.epochs),
                     "slow"))
    finally:
        fast.kill()
        slow.kill()
    base = {srv: r for name, r, srv in rows if name.startswith("PyTorch")}
    print(f"{a.shards} shards x {a.per_shard} samples ({shard_bytes / 1e6:.0f} MB, ImageNet-sized photos); "
          f"indexing at the first start: {index_s['fast']:.2f} s at full speed, {index_s['slow']:.2f} s at {a.rate}/connection")
    print("| source | samples/s | vs local shards | vs PyTorch on the same server |")
    print("|---|---|---|---|")
    for name, r, srv in rows:
        vs_base = f"{r / base[srv]:.2f}x" if srv else ""
        print(f"| {name} | {r:.0f} | {r / rows[0][1]:.2f}x | {vs_base} |")
    shutil.rmtree(work / "shards", ignore_errors=True)


if __name__ == "__main__":
    main()
