#!/usr/bin/python3
"""Catalog benchmark: start-up time and resident memory of mmfeedd over generated manifests of
1M, 10M and 100M lines, with source.index: on (the first start builds the index, later ones map
it) against today's eager loader (index: off, every line parsed at start) and a Python
reference (json.loads of every line into a list), in one run on the same files.

Start-up is from launching mmfeedd to its control socket answering (the catalog loaded, the
stages built, the rings made); RSS is VmRSS then (anonymous and file-backed), less the RSS of
the same pipeline over a one-line manifest, per catalogued sample. Manifests are written
streaming (short captions, ~60 bytes per line, pointing at no file: the text is inline) and
deleted after; the eager loader and the Python reference are run up to --eager-max lines (at
100M they would need ~45 GB). The index is mapped, not read: its pages become resident (as page
cache, file-backed and reclaimable) as samples are dealt, up to the index file's size per
sample, which is reported too.

With --shards, the same for WebDataset tar shards of 10,000 samples (one short .txt member
each): index: on (first start builds one index file per shard, later starts map them) against
index: off (every shard's tar headers read at start) and a Python reference (tarfile listing
every shard's members into a list), each from a cold page cache (caches dropped before every
start; needs root, else warm).

usage: catalog_bench.py [--build BUILD] [--out DIR] [--sizes 1000000,10000000,100000000]
       catalog_bench.py --shards [--sizes 100000,1000000]
"""
import argparse, io, json, os, pathlib, resource, shutil, socket, subprocess, sys, tarfile, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"

CONFIG = """pipeline: catalog-bench
source: {{type: {type}, path: "{path}", shuffle: true, seed: 1, index: {index}}}
consumers: 1
stages:
  - {{name: text, type: text, field: text, workers: 1, params: {{max_len: 16}}}}
  - {{name: batch, type: batch, inputs: [text], params: {{batch_size: 4}}}}
output: {{ring_slots: 2}}
"""


def write_manifest(path, n):
    with open(path, "w", buffering=1 << 24) as f:
        chunk = 100000
        for start in range(0, n, chunk):
            f.write("".join(f'{{"id": "s{i:09d}", "text": "a short caption number {i}"}}\n'
                            for i in range(start, min(n, start + chunk))))


def rss_kb(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0])
    return out


def write_shards(folder, n, per_shard=10000):
    """n samples in shards of per_shard, "shard-{00000..N}.tar"; returns the path pattern."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = (n + per_shard - 1) // per_shard
    for s in range(shards):
        with tarfile.open(folder / f"shard-{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                data = f"a short caption number {i}".encode()
                info = tarfile.TarInfo(f"s{i:09d}.txt")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return f"{folder}/shard-{{00000..{shards - 1:05d}}}.tar"


def drop_caches():
    """Cold page cache for the next start; False where not allowed (not root)."""
    try:
        os.sync()
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def start_daemon(build, work, manifest, index, state, type="manifest"):
    cfg = work / "bench.yaml"
    cfg.write_text(CONFIG.format(type=type, path=manifest, index=index))
    sock = str(work / "bench.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    t0 = time.perf_counter()
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(cfg), "--socket", sock, "--state-dir", str(state)],
                         stderr=open(work / "daemon.log", "w"))
    while True:
        if d.poll() is not None:
            raise SystemExit(f"mmfeedd exited: {(work / 'daemon.log').read_text()}")
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock)
            break
        except OSError:
            time.sleep(0.005)
        finally:
            s.close()
    secs = time.perf_counter() - t0
    rss = rss_kb(d.pid)
    d.kill()
    d.wait()
    return secs, rss


def python_reference(manifest):
    code = ("import json,sys,time,resource\nt=time.perf_counter()\nrows=[json.loads(l) for l in open(sys.argv[1])]\n"
            "print(json.dumps({'seconds': time.perf_counter()-t, 'rss_kb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 'n': len(rows)}))")
    return json.loads(subprocess.run([PY, "-c", code, str(manifest)], capture_output=True, text=True, check=True).stdout)


def python_shard_reference(folder):
    code = ("import glob,json,sys,tarfile,time,resource\nt=time.perf_counter()\n"
            "rows=[(p,m.name,m.offset_data,m.size) for p in sorted(glob.glob(sys.argv[1]+'/shard-*.tar')) for m in tarfile.open(p).getmembers()]\n"
            "print(json.dumps({'seconds': time.perf_counter()-t, 'rss_kb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 'n': len(rows)}))")
    return json.loads(subprocess.run([PY, "-c", code, str(folder)], capture_output=True, text=True, check=True).stdout)


def shards_main(a, work):
    tiny = write_shards(work / "tiny", 8)
    base = {mode: start_daemon(a.build, work, tiny, mode, work / f"state-tiny-{mode}", "webdataset")[1]["VmRSS"]
            for mode in ("on", "off")}
    cold = drop_caches()
    results = {"cores": os.cpu_count(), "cold_cache": cold, "baseline_rss_kb": base, "sizes": {}}
    for n in map(int, a.sizes.split(",")):
        folder = work / f"shards-{n}"
        t0 = time.perf_counter()
        pattern = write_shards(folder, n)
        r = {"shards": len(list(folder.glob("*.tar"))), "bytes": sum(p.stat().st_size for p in folder.glob("*.tar")),
             "write_seconds": time.perf_counter() - t0}
        state = work / f"state-{n}"
        drop_caches()
        build_s, _ = start_daemon(a.build, work, pattern, "on", state, "webdataset")
        drop_caches()
        mapped_s, mapped_rss = start_daemon(a.build, work, pattern, "on", state, "webdataset")
        index_bytes = sum(p.stat().st_size for p in (state / "index").glob("*.mmfidx"))
        r["index_build_start_seconds"] = build_s
        r["index_on"] = {"start_seconds": mapped_s, "rss_kb": mapped_rss,
                         "bytes_per_sample": (mapped_rss["VmRSS"] - base["on"]) * 1024 / n,
                         "index_bytes_per_sample": index_bytes / n}
        drop_caches()
        eager_s, eager_rss = start_daemon(a.build, work, pattern, "off", state, "webdataset")
        r["index_off"] = {"start_seconds": eager_s, "rss_kb": eager_rss,
                          "bytes_per_sample": (eager_rss["VmRSS"] - base["off"]) * 1024 / n}
        drop_caches()
        py = python_shard_reference(folder)
        r["python_tarfile_list"] = {"start_seconds": py["seconds"], "rss_kb": py["rss_kb"],
                                    "bytes_per_sample": py["rss_kb"] * 1024 / n}
        results["sizes"][n] = r
        shutil.rmtree(folder)
        shutil.rmtree(state)
        print(json.dumps({n: r}), flush=True)
    print(json.dumps(results, indent=2))
    print(f"\n{'cold' if cold else 'warm'} page cache\n| samples | shards | index: on, first start (builds) | index: on, start | "
          "RSS/sample at start | index files/sample | index: off, start | RSS/sample | Python tarfile list | RSS/sample |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, r in results["sizes"].items():
        on, off, py = r["index_on"], r["index_off"], r["python_tarfile_list"]
        print(f"| {n:,} | {r['shards']} | {r['index_build_start_seconds']:.1f} s | {on['start_seconds']:.2f} s | "
              f"{max(0.0, on['bytes_per_sample']):.1f} B | {on['index_bytes_per_sample']:.1f} B | {off['start_seconds']:.1f} s | "
              f"{off['bytes_per_sample']:.0f} B | {py['start_seconds']:.1f} s | {py['bytes_per_sample']:.0f} B |")
    shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default="/tmp/mmfeed-catalog-bench")
    ap.add_argument("--sizes", default="1000000,10000000,100000000")
    ap.add_argument("--eager-max", type=int, default=10000000)
    ap.add_argument("--shards", action="store_true", help="tar shards instead of manifests")
    a = ap.parse_args()
    work = pathlib.Path(a.out)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if a.shards:
        if a.sizes == ap.get_default("sizes"):
            a.sizes = "100000,1000000"
        return shards_main(a, work)
    tiny = work / "tiny.jsonl"
    write_manifest(tiny, 8)
    base = {mode: start_daemon(a.build, work, tiny, mode, work / f"state-tiny-{mode}")[1]["VmRSS"] for mode in ("on", "off")}
    results = {"cores": os.cpu_count(), "baseline_rss_kb": base, "sizes": {}}
    for n in map(int, a.sizes.split(",")):
        manifest = work / f"m{n}.jsonl"
        t0 = time.perf_counter()
        write_manifest(manifest, n)
        r = {"manifest_bytes": manifest.stat().st_size, "write_seconds": time.perf_counter() - t0}
        state = work / f"state-{n}"
        build_s, build_rss = start_daemon(a.build, work, manifest, "on", state)
        log = (work / "daemon.log").read_text()
        mapped_s, mapped_rss = start_daemon(a.build, work, manifest, "on", state)
        r["index_build"] = {"start_seconds": build_s, "log": [l for l in log.splitlines() if "indexed" in l]}
        index_file = next((state / "index").glob("*.mmfidx"))
        r["index_on"] = {"start_seconds": mapped_s, "rss_kb": mapped_rss,
                         "bytes_per_sample": (mapped_rss["VmRSS"] - base["on"]) * 1024 / n,
                         "index_bytes_per_sample": index_file.stat().st_size / n}
        if n <= a.eager_max:
            eager_s, eager_rss = start_daemon(a.build, work, manifest, "off", state)
            r["index_off"] = {"start_seconds": eager_s, "rss_kb": eager_rss,
                              "bytes_per_sample": (eager_rss["VmRSS"] - base["off"]) * 1024 / n}
            py = python_reference(manifest)
            r["python_json_list"] = {"start_seconds": py["seconds"], "rss_kb": py["rss_kb"], "bytes_per_sample": py["rss_kb"] * 1024 / n}
        results["sizes"][n] = r
        manifest.unlink()
        shutil.rmtree(state)
        print(json.dumps({n: r}), flush=True)
    print(json.dumps(results, indent=2))
    print("\n| lines | manifest | index: on, first start (builds) | index: on, start | RSS/sample at start | index file/sample | "
          "index: off, start | RSS/sample | Python json list | RSS/sample |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, r in results["sizes"].items():
        off, py = r.get("index_off"), r.get("python_json_list")
        print(f"| {n:,} | {r['manifest_bytes'] / 1e9:.2f} GB | {r['index_build']['start_seconds']:.1f} s | "
              f"{r['index_on']['start_seconds']:.2f} s | {max(0.0, r['index_on']['bytes_per_sample']):.1f} B | "
              f"{r['index_on']['index_bytes_per_sample']:.1f} B | "
              + (f"{off['start_seconds']:.1f} s | {off['bytes_per_sample']:.0f} B | {py['start_seconds']:.1f} s | {py['bytes_per_sample']:.0f} B |"
                 if off else "- | - | - | - |"))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
