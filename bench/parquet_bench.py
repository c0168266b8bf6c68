#!/usr/bin/env python3
"""Parquet against WebDataset shards and a manifest with files (issue #62): the same 2,000
image-caption samples (scripts/make_dataset.py's, each image file made distinct) as a manifest
beside its JPEGs, as 8 tar
shards, and as a Hugging Face-style folder of 4 Parquet files with the images inside
(struct<bytes, path>, written by DuckDB, row groups of 2,048 rows: one a file), through the
canonical image-text pipeline (configs/demo.yaml: two consumer ranks, 224x224 float32 crops,
bytes tokenizer), 3 epochs a run. The three run in turn for --rounds rounds; the figures are
medians, the ratios medians of each round's. Also per format: the bytes the daemon read through
read(2)/pread(2) (/proc/PID/io rchar: page-cache hits included, so the bytes each format makes
the daemon read, not the disk's), and whether the three gave the same sample ids to each rank.

usage: parquet_bench.py --build BUILD --out DIR [--rounds R] [--count N]
"""
import argparse, io, json, os, pathlib, statistics, subprocess, sys, tarfile, threading, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = "/usr/bin/python3"
DUCKDB = ROOT / "build-tools/node_modules/@duckdb/node-api"


def make_data(out, count):
    """scripts/make_dataset.py's samples, each with an image file of its own (its photo with a
    JPEG comment naming the sample after the SOI marker: the same pixels, distinct bytes, so no
    format gains from repeated images), as a manifest, 8 tar shards and 4 Parquet files."""
    if (out / "hf" / "data").is_dir():
        return
    subprocess.run([PY, str(ROOT / "scripts/make_dataset.py"), str(out / "src"), "--count", str(count)], check=True)
    (out / "img").mkdir(exist_ok=True)
    lines = [json.loads(l) for l in (out / "src" / "manifest.jsonl").read_text().splitlines()]
    per_shard = (len(lines) + 7) // 8
    shards = [tarfile.open(out / f"shard-{k:02d}.tar", "w", format=tarfile.USTAR_FORMAT) for k in range(8)]
    with open(out / "manifest.jsonl", "w") as m:
        for i, l in enumerate(lines):
            jpg = (out / "src" / l["image"]).read_bytes()
            note = l["id"].encode()
            jpg = jpg[:2] + b"\xff\xfe" + (len(note) + 2).to_bytes(2, "big") + note + jpg[2:]
            (out / "img" / f"{l['id']}.jpg").write_bytes(jpg)
            m.write(json.dumps({"id": l["id"], "image": f"img/{l['id']}.jpg", "text": l["text"]}) + "\n")
            for ext, data in (("jpg", jpg), ("txt", l["text"].encode())):
                info = tarfile.TarInfo(f"{l['id']}.{ext}")
                info.size = len(data)
                shards[i // per_shard].addfile(info, io.BytesIO(data))
    for t in shards:
        t.close()
    (out / "hf" / "data").mkdir(parents=True)
    rows = f"""(SELECT m.id, m.text, {{'bytes': b.content, 'path': m.image}} AS image, m.n FROM
      (SELECT *, row_number() OVER () AS n FROM read_json('{out}/manifest.jsonl', format='newline_delimited',
        columns={{id: 'VARCHAR', image: 'VARCHAR', text: 'VARCHAR'}})) m
      JOIN read_blob('{out}/img/*') b ON b.filename = '{out}/' || m.image)"""
    per = (count + 3) // 4
    statements = [f"COPY (SELECT id, text, image FROM {rows} WHERE n > {k * per} AND n <= {(k + 1) * per} "
                  f"ORDER BY n) TO '{out}/hf/data/train-{k:05d}-of-00004.parquet' (FORMAT parquet)"
                  for k in range(4)]
    subprocess.run(["node", str(ROOT / "tests/data/parquet/duckdb_sql.mjs"), str(DUCKDB), *statements], check=True,
                   stdout=subprocess.DEVNULL)


def run(build, data, source):
    cfg = (ROOT / "configs/demo.yaml").read_text().replace(
        "source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 42, epochs: 1}",
        f"source: {{{source}, shuffle: true, seed: 42, epochs: 3}}")
    (data / "bench.yaml").write_text(cfg)
    sock = str(data / "bench.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    log = open(data / "daemon.log", "w")
    d = subprocess.Popen([f"{build}/bin/mmfeedd", "--config", str(data / "bench.yaml"), "--socket", sock], stderr=log)
    rchar = [0]

    def watch():  # the daemon's read bytes, last seen before it exits
        while d.poll() is None:
            try:
                for line in open(f"/proc/{d.pid}/io"):
                    if line.startswith("rchar:"):
                        rchar[0] = int(line.split()[1])
            except OSError:
                pass
            time.sleep(0.02)

    w = threading.Thread(target=watch)
    w.start()
    while not os.path.exists(sock):
        time.sleep(0.01)
    t0 = time.perf_counter()
    cs = [subprocess.Popen([f"{build}/bin/mmfeed-consume", "--socket", sock, "--rank", str(r), "--json"],
                           stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [json.loads(c.communicate()[0]) for c in cs]
    seconds = time.perf_counter() - t0
    d.wait()
    w.join()
    log.close()
    return {"samples": sum(o["samples"] for o in outs), "seconds": seconds,
            "ids": [o["sample_ids_sha256"] for o in outs], "rchar": rchar[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default="/tmp/mmfeed-parquet-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=2000)
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    make_data(out, a.count)
    formats = {"manifest": "type: manifest, path: manifest.jsonl",
               "shards": "type: webdataset, path: \"shard-{00..07}.tar\"",
               "parquet": "type: parquet, path: hf"}
    shards = sorted(out.glob("shard-*.tar"))
    rates = {f: [] for f in formats}
    ratios = {"parquet/shards": [], "parquet/manifest": []}
    results = {}
    for r in range(a.rounds):
        names = list(formats)[r % 3:] + list(formats)[:r % 3]
        got = {f: run(a.build, out, formats[f]) for f in names}
        for f, g in got.items():
            rates[f].append(g["samples"] / g["seconds"])
            results[f] = g
        ratios["parquet/shards"].append(rates["parquet"][-1] / rates["shards"][-1])
        ratios["parquet/manifest"].append(rates["parquet"][-1] / rates["manifest"][-1])
        print(f"round {r}: " + ", ".join(f"{f} {rates[f][-1]:.0f}/s" for f in formats), flush=True)
    same = len({tuple(g["ids"]) for g in results.values()}) == 1
    disk = {"manifest": sum(p.stat().st_size for p in (out / "img").iterdir()) + (out / "manifest.jsonl").stat().st_size,
            "shards": sum(p.stat().st_size for p in shards),
            "parquet": sum(p.stat().st_size for p in (out / "hf" / "data").glob("*.parquet"))}
    print(f"\n{a.count} samples x 3 epochs, configs/demo.yaml's pipeline, {a.rounds} rounds (medians)")
    print(f"{'format':10} {'samples/s':>10} {'MiB read/epoch':>15} {'MiB on disk':>12}")
    for f in formats:
        print(f"{f:10} {statistics.median(rates[f]):10.0f} {results[f]['rchar'] / 3 / 2**20:15.1f} "
              f"{disk[f] / 2**20:12.1f}")
    for k, v in ratios.items():
        print(f"{k}: {statistics.median(v):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in v)})")
    print(f"same sample ids per rank in all three: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
