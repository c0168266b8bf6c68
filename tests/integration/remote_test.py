#!/usr/bin/env python3
"""Shards in object storage (source/remote_store.h), read by the real daemon from real
servers on loopback that the tests start: nginx (Debian's nginx-light) serving a folder, and
s3rver (npm, installed by scripts/setup.sh) for the S3 API with signed requests. Faults: a server
killed mid-shard, 5xx answers, a truncated object, a shard that fails for good. Every sample is
delivered once per epoch or counted. Two daemons as two nodes of one job deal every sample once.

usage: remote_test.py --bin BUILD/bin --s3rver PATH
"""
import argparse, errno, io, json, os, pathlib, re, shutil, signal, socket, subprocess, sys, tarfile, textwrap, time, \
    unittest

import daemon_test
from daemon_test import Daemon, DaemonCase, captioned_ids, dumped_batches, finish
from cache_test import min_and_lru
from service_test import free_port

PHOTOS = daemon_test.PHOTOS
S3RVER = None
SHARDS, PER_SHARD = 6, 20

CONFIG = """pipeline: remote
source: {type: webdataset, path: "PATH", shuffle: true, seed: 5, epochs: EPOCHS, shuffle_window: 2, SOURCE}
consumers: CONSUMERS
stages:
  - {name: image, type: image, field: image, workers: 2,
     params: {crop: random_resized_crop, size: [32, 32], flip: 0.5, mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5],
              dtype: float32, layout: CHW}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 32}}
  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: 10}}
output: {ring_slots: 4}
on_error: skip
"""


def config(path, epochs=1, consumers=2, source="fetch_retries: 5"):
    return (CONFIG.replace("PATH", path).replace("EPOCHS", str(epochs)).replace("CONSUMERS", str(consumers))
            .replace("SOURCE", source))


def make_shards(d):
    """SHARDS tar shards of PER_SHARD samples (sNNNN: a photo and "caption NNNN"); returns the ids."""
    d.mkdir(parents=True, exist_ok=True)
    photos = sorted(PHOTOS.glob("*.jpg"))
    ids = []
    for s in range(SHARDS):
        with tarfile.open(d / f"shard-{s:03d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(s * PER_SHARD, (s + 1) * PER_SHARD):
                ids.append(f"s{i:04d}")
                for ext, data in (("jpg", photos[i % len(photos)].read_bytes()), ("txt", f"caption {i:04d}".encode())):
                    info = tarfile.TarInfo(f"{ids[-1]}.{ext}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
    return ids


def wait_listening(port, proc, what, timeout=20):
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"{what} did not start on port {port}")
            time.sleep(0.05)


def flip_bytes_in_place(path, end):
    """Flips one byte in every 4 KiB of `path`'s first `end` bytes, in place (size, inode and
    trailer kept): what a disk's bit rot or a stray writer would do to a cached shard."""
    with open(path, "r+b") as fh:
        for at in range(700, end, 4096):
            fh.seek(at)
            b = fh.read(1)
            fh.seek(at)
            fh.write(bytes([b[0] ^ 0x55]))


class Nginx:
    """nginx serving `root` on 127.0.0.1:port, one process (killing it kills the server)."""

    def __init__(self, root, work, port=None, server="", http="", hosts=("127.0.0.1",), wrap=()):
        self.port = port or free_port()
        self.work = pathlib.Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        temps = "".join(f"  {k}_temp_path {self.work}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        conf = self.work / f"nginx-{self.port}.conf"
        conf.write_text(f"""{'user root;' if os.geteuid() == 0 else ''}
daemon off;
master_process off;
pid {self.work}/nginx-{self.port}.pid;
error_log {self.work}/nginx-error.log;
events {{ worker_connections 256; }}
http {{
  access_log {self.work}/nginx-access.log;
{temps}{http}
  server {{
{"".join(f"    listen {h}:{self.port};" + chr(10) for h in hosts)}    root {root};
{server}
  }}
}}
""")
        self.proc = subprocess.Popen([*wrap, "nginx", "-p", str(self.work), "-c", str(conf)],
                                     stderr=subprocess.DEVNULL)
        if not wrap:
            wait_listening(self.port, self.proc, "nginx")
        self.url = f"http://{hosts[0]}:{self.port}"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def storage_figures(log):
    """The storage_* figures of the daemon's final profile."""
    m = re.findall(r"^source: (storage_.*)$", log, re.M)
    assert m, "no storage line in the profile:\n" + log
    return {k: float(v) for k, v in (p.split(" ") for p in m[-1].split(", "))}


class RemoteCase(DaemonCase):
    def setUp(self):
        super().setUp()
        self.data = self.dir / "data"
        self.ids = make_shards(self.data)
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.kill()
        super().tearDown()

    def nginx(self, **kw):
        n = Nginx(self.data, self.dir / "nginx", **kw)
        self.servers.append(n)
        return n

    def build_index(self, url, state, source="fetch_retries: 5"):
        """Indexes the shards at `url` into `state` (mmfeedd --check reads the catalog), so that a
        later daemon starts without fetching them."""
        (self.dir / "c.yaml").write_text(config(url, source=source))
        r = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--check", str(self.dir / "c.yaml"), "--state-dir",
                            str(state)], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def indexed_then(self, **restart):
        """Indexes the shards from nginx on a fresh port into self.dir/state, then restarts
        nginx on that port with `restart` (Nginx's arguments); returns (the shards' URL pattern,
        the state dir, the server)."""
        state = self.dir / "state"
        port = free_port()
        url = f"http://127.0.0.1:{port}/shard-{{000..005}}.tar"
        n = self.nginx(port=port)
        self.build_index(url, state)
        n.kill()
        return url, state, self.nginx(port=port, **restart)

    def run_ranks(self, d, consumers=2, dump="dump"):
        """Consumes every rank to the end; returns the dump folders."""
        dumps = [self.dir / f"{dump}{r}" for r in range(consumers)]
        procs = [d.consume(r, "--json", "--dump", str(dumps[r])) for r in range(consumers)]
        for p in procs:
            finish(p, timeout=120)
        return dumps

    def run_nodes(self, urls, wraps=((), ()), config_of=None, ids=None, state=None):
        """Node k's daemon (under wraps[k]) reads the shards at urls[k] as node k of len(urls)
        (config_of(k, url), if given, is its config; a copy of `state` its --state-dir); two
        ranks each consume 2 epochs. Checks every epoch holds every sample (or `ids`) once over
        all the ranks; returns the daemons and the dump folders."""
        daemons, dumps, procs = [], [], []
        for k, (url, wrap) in enumerate(zip(urls, wraps)):
            node = self.dir / f"node{k}"
            node.mkdir()
            cfg = config_of(k, url) if config_of else config(
                url + "/shard-{000..005}.tar", epochs=2, source=f"node_rank: {k}, num_nodes: {len(urls)}")
            extra = ()
            if state:
                shutil.copytree(state, node / "state")
                extra = ("--state-dir", str(node / "state"))
            daemons.append(Daemon(node, cfg, wrap=wrap, extra=extra))
        for k, d in enumerate(daemons):
            for r in range(2):
                dumps.append(self.dir / f"n{k}r{r}")
                procs.append(d.consume(r, "--json", "--dump", str(dumps[-1])))
        for p in procs:
            finish(p, timeout=120)
        for d in daemons:
            self.assertEqual(d.wait(), 0, d.log())
        self.assertEveryEpochOnce(dumps, 2, ids)
        return daemons, dumps

    def profile_under_load(self, d, then=lambda: None):
        """Two ranks consume without end; after a second, a 4 s `mmfeedctl profile` is taken,
        then `then()`; returns (the profile's report, what `then` returned)."""
        procs = [d.consume(r, "--batches", "1000000") for r in range(2)]
        try:
            time.sleep(1.0)
            r = d.ctl("profile", "--seconds", "4", "--json")
            self.assertEqual(r.returncode, 0, r.stderr + d.log())
            return json.loads(r.stdout), then()
        finally:
            for p in procs:
                p.kill()
                p.communicate()

    def assertEveryEpochOnce(self, dumps, epochs, ids=None):
        """Per epoch, the ranks' batches hold every sample exactly once (each with its own text)."""
        ids = sorted(ids or self.ids)
        captioned_ids(self, dumps)
        for e in range(epochs):
            got = [i for dump in dumps for meta, _ in dumped_batches(dump) if meta["epoch"] == e for i in meta["ids"]]
            self.assertEqual(sorted(got), ids, f"epoch {e}")


class HttpTest(RemoteCase):
    def test_same_batches_as_local_shards_and_the_index_is_kept(self):
        n = self.nginx()
        local = Daemon(self.dir, config(str(self.data / "shard-{000..005}.tar"), epochs=2, source="index: on"))
        want = self.run_ranks(local, dump="local")
        self.assertEqual(local.wait(), 0, local.log())
        state = self.dir / "state"
        d = Daemon(self.dir, config(n.url + "/shard-{000..005}.tar", epochs=2), extra=("--state-dir", str(state)))
        got = self.run_ranks(d, dump="remote")
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEveryEpochOnce(got, 2)
        for w, g in zip(want, got):  # the same batches, byte for byte
            wb, gb = dumped_batches(w), dumped_batches(g)
            self.assertEqual([m["ids"] for m, _ in wb], [m["ids"] for m, _ in gb])
            for (_, wp), (_, gp) in zip(wb, gb):
                self.assertEqual((wp / "image.npy").read_bytes(), (gp / "image.npy").read_bytes())
        figures = storage_figures(d.log())
        self.assertEqual(figures["storage_failed_shards"], 0)
        self.assertGreaterEqual(figures["storage_shards_fetched"], SHARDS)
        self.assertIn(f"indexed {SHARDS} of {SHARDS} shards", d.log())
        self.assertEqual(len(list((state / "index").glob("shard-*.mmfidx"))), SHARDS)
        # The next start maps those indexes (a HEAD per shard) and deals the same batches.
        (state / "cursors.json").unlink()
        d = Daemon(self.dir, config(n.url + "/shard-{000..005}.tar", epochs=2), extra=("--state-dir", str(state)))
        again = self.run_ranks(d, dump="again")
        self.assertEqual(d.wait(), 0, d.log())
        self.assertNotIn("indexed", d.log())
        for g, a in zip(got, again):
            self.assertEqual([m["ids"] for m, _ in dumped_batches(g)], [m["ids"] for m, _ in dumped_batches(a)])

    def test_a_small_prefetch_budget_reads_members_by_range(self):
        n = self.nginx()
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        d = Daemon(self.dir, config(n.url + "/shard-{000..005}.tar",
                                    source=f"prefetch_bytes: {shard_bytes // 2}, fetch_concurrency: 1"))
        dumps = self.run_ranks(d)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEveryEpochOnce(dumps, 1)
        figures = storage_figures(d.log())
        self.assertEqual(figures["storage_shards_fetched"], SHARDS, "only the index build fetches whole shards")
        self.assertEqual(figures["storage_range_reads"], 2 * len(self.ids), "a shard over the budget: member reads")
        # An empty member is read without a request (a range of 0 bytes cannot be asked for).
        with tarfile.open(self.data / "empty.tar", "w", format=tarfile.USTAR_FORMAT) as t:
            for ext, data in (("jpg", sorted(PHOTOS.glob("*.jpg"))[0].read_bytes()), ("txt", b"")):
                info = tarfile.TarInfo(f"e0.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        d = Daemon(self.dir, config(n.url + "/empty.tar", consumers=1, source="prefetch_bytes: 1")
                   .replace("batch_size: 10", "batch_size: 1"))
        self.assertEqual(finish(d.consume(0, "--json"))["samples"], 1)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("samples skipped: 0", d.log())
        self.assertEqual(storage_figures(d.log())["storage_range_reads"], 1, "the image's; none for the empty text")

    def test_transient_5xx_are_retried(self):
        # nginx answers 503 to requests over 5 per second: the start's HEADs and whole fetches come
        # four at a time (fetch_concurrency), so most are refused at first and retried.
        n = self.nginx(http="  limit_req_zone $binary_remote_addr zone=slow:1m rate=5r/s;\n  limit_req_status 503;",
                       server="    limit_req zone=slow;")
        d = Daemon(self.dir, config(n.url + "/shard-{000..005}.tar", source="fetch_retries: 8"))
        dumps = self.run_ranks(d)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEveryEpochOnce(dumps, 1)
        self.assertGreater(storage_figures(d.log())["storage_retries"], 0)
        self.assertIn(" 503 ", (self.dir / "nginx" / "nginx-access.log").read_text())
        self.assertIn("samples skipped: 0", d.log())

    def test_server_killed_mid_shard_then_back(self):
        # Slow once indexed (the whole data takes ~3 s), killed 1 s into the run, back 1.5 s later.
        url, state, n = self.indexed_then(server="    limit_rate 400k;")
        d = Daemon(self.dir, config(url), extra=("--state-dir", str(state)))
        procs = [d.consume(r, "--json", "--dump", str(self.dir / f"dump{r}")) for r in range(2)]
        time.sleep(1.0)
        n.kill()
        time.sleep(1.5)
        self.nginx(port=n.port)
        for p in procs:
            finish(p, timeout=120)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEveryEpochOnce([self.dir / "dump0", self.dir / "dump1"], 1)
        self.assertGreater(storage_figures(d.log())["storage_retries"], 0)
        self.assertIn("samples skipped: 0", d.log())

    def test_a_shard_that_fails_for_good_is_counted_with_its_url(self):
        # HEAD works (the index is built from a whole GET made before), GETs of shard-002 fail.
        url, state, n = self.indexed_then(
            server="    location = /shard-002.tar { if ($request_method = GET) { return 503; } }")
        d = Daemon(self.dir, config(url, source="fetch_retries: 1"), extra=("--state-dir", str(state)))
        dumps = self.run_ranks(d)
        self.assertEqual(d.wait(), 0, d.log())
        bad = {f"s{i:04d}" for i in range(2 * PER_SHARD, 3 * PER_SHARD)}
        got = {i for dump in dumps for meta, _ in dumped_batches(dump) for i in meta["ids"]}
        self.assertFalse(got & bad)
        self.assertEqual(got | bad, set(self.ids), "every other sample delivered")
        for dump in dumps:  # refilled: every rank still gets its full batches
            self.assertEqual([len(m["ids"]) for m, _ in dumped_batches(dump)], [10] * 6)
        shard_url = f"{n.url}/shard-002.tar"
        self.assertIn(f"shard {shard_url} failed: {shard_url}: HTTP 503 (after 2 attempts)", d.log())
        self.assertIn(f"samples skipped: {PER_SHARD}", d.log())
        self.assertRegex(d.log(), re.escape(shard_url) + r":s00[45]\d")
        self.assertEqual(storage_figures(d.log())["storage_failed_shards"], 1)

    def test_truncated_and_missing_objects(self):
        cut = self.data / "shard-003.tar"
        cut.write_bytes(cut.read_bytes()[: cut.stat().st_size * 6 // 10])
        (self.data / "shard-005.tar").unlink()
        n = self.nginx()
        d = Daemon(self.dir, config(n.url + "/shard-{000..005}.tar", consumers=1))
        dumps = self.run_ranks(d, consumers=1)
        self.assertEqual(d.wait(), 0, d.log())
        got = {i for meta, _ in dumped_batches(dumps[0]) for i in meta["ids"]}
        kept_of_cut = {i for i in got if 60 <= int(i[1:]) < 80}
        self.assertTrue(8 <= len(kept_of_cut) < 20, kept_of_cut)
        self.assertEqual(got, {f"s{i:04d}" for i in range(60)} | kept_of_cut | {f"s{i:04d}" for i in range(80, 100)})
        self.assertRegex(d.log(), re.escape(n.url) + r"/shard-003.tar:s00\d\d.*tar truncated")
        self.assertIn(f"{n.url}/shard-005.tar: HTTP 404, no such object", d.log())

    def test_token_budgets_are_refused_with_window_mode(self):
        n = self.nginx()
        (self.dir / "b.yaml").write_text(config(n.url + "/shard-{000..005}.tar").replace(
            "params: {batch_size: 10}", "params: {batch_size: 10, max_tokens: 200}"))
        r = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--check", str(self.dir / "b.yaml")], capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("not available with source.shuffle_window", r.stdout + r.stderr)

    def test_io_bound_storage_is_named_in_the_profile(self):
        # 1 MB/s a connection (a shard in ~2 s), one at a time: storage decides the pace.
        url, state, _ = self.indexed_then(server="    limit_rate 1m;")
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        d = Daemon(self.dir, config(url, epochs=0, source=f"fetch_concurrency: 1, prefetch_bytes: {shard_bytes * 2}"),
                   extra=("--state-dir", str(state)))
        report, _ = self.profile_under_load(d)
        dx = report["diagnosis"]
        print(f"\n{self.id()}: {dx['stage']} ({dx['kind']}): {dx['evidence']}", file=sys.stderr)
        # The stages reading the shards wait: the busiest of them is named, with storage as the cause.
        self.assertEqual(dx["kind"], "io", json.dumps(report, indent=1))
        self.assertIn(dx["stage"], ("image", "text"), json.dumps(report, indent=1))
        self.assertIn("waited", dx["evidence"])
        self.assertIn("for object storage", dx["evidence"])
        self.assertIn("fetch_concurrency", dx["advice"])
        self.assertIn("a disk cache would read every epoch after the first from local disk: source.cache: "
                      "{dir: /a/local/disk, max_bytes: ", dx["advice"])
        self.assertGreater(report["storage"]["wait_share"], 0.5, json.dumps(report["storage"]))
        self.assertGreater(report["storage"]["read_bytes_per_s"], 100e3, json.dumps(report["storage"]))


def remove_while_written(folder):
    """rm -rf of a folder the daemon is writing into: a shard written between the listing and
    the rmdir leaves it not empty (one renamed away, a name gone), so it is tried again until
    one pass removes it."""
    for _ in range(100):
        if not folder.exists():
            return
        try:
            shutil.rmtree(folder)
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.ENOENT):
                raise
    raise AssertionError(f"{folder} could not be removed while the daemon wrote into it")


def shard_gets(access_log, since=0):
    """The whole-shard GETs (HTTP 200) nginx logged after byte `since` of its access log, in order."""
    text = pathlib.Path(access_log).read_text()[since:]
    return re.findall(r'"GET /(shard-\d+\.tar) HTTP/[\d.]+" 200 ', text)


class CacheTest(RemoteCase):
    """source.cache: shards kept on local disk (source/shard_cache.h). The prefetch budget holds
    two shards, so without a disk cache every epoch fetches every shard again."""

    def cached_config(self, url, cache="max_bytes: 1G", consumers=2, epochs=3):
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        return config(url, epochs=epochs, consumers=consumers,
                      source=f"prefetch_bytes: {shard_bytes * 5 // 2}, fetch_concurrency: 1, "
                             f"cache: {{dir: {self.dir / 'cache'}, {cache}}}")

    def access_log(self):
        return self.dir / "nginx" / "nginx-access.log"

    def run_and_count(self, url, state, cfg, dump, consumers=2):
        """A daemon on `cfg` consumed to the end; returns (its dumps, the shards it GET, its log)."""
        since = self.access_log().stat().st_size
        d = Daemon(self.dir, cfg, extra=("--state-dir", str(state)))
        dumps = self.run_ranks(d, consumers=consumers, dump=dump)
        self.assertEqual(d.wait(), 0, d.log())
        (state / "cursors.json").unlink()
        return dumps, shard_gets(self.access_log(), since), d.log()

    def assertSameBatches(self, want, got):
        for w, g in zip(want, got):
            wb, gb = dumped_batches(w), dumped_batches(g)
            self.assertEqual([m["ids"] for m, _ in wb], [m["ids"] for m, _ in gb])
            for (_, wp), (_, gp) in zip(wb, gb):
                self.assertEqual((wp / "image.npy").read_bytes(), (gp / "image.npy").read_bytes())

    def test_shards_are_fetched_once_then_read_from_disk_across_epochs_and_restarts(self):
        url, state, n = self.indexed_then()
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        uncached = config(url, epochs=3, source=f"prefetch_bytes: {shard_bytes * 5 // 2}, fetch_concurrency: 1")
        want, gets, _ = self.run_and_count(url, state, uncached, "plain")
        self.assertGreater(len(gets), 2 * SHARDS, "without a cache, later epochs fetch again")
        got, gets, log = self.run_and_count(url, state, self.cached_config(url), "cached")
        self.assertEveryEpochOnce(got, 3)
        self.assertSameBatches(want, got)
        self.assertEqual(sorted(gets), sorted(f"shard-{k:03d}.tar" for k in range(SHARDS)), "each fetched once")
        figures = storage_figures(log)
        self.assertGreater(figures["storage_cache_hits"], 0)
        self.assertEqual(figures["storage_cache_damaged"], 0)
        self.assertEqual(len(list((self.dir / "cache").glob("*.shard"))), SHARDS)
        # A restart reads everything from disk; a truncated file and a planted one are not served:
        # the truncated shard is fetched again, the stranger removed.
        files = sorted((self.dir / "cache").glob("*.shard"))
        os.truncate(files[0], files[0].stat().st_size - 100)
        again, gets, log = self.run_and_count(url, state, self.cached_config(url), "again")
        self.assertSameBatches(want, again)
        self.assertEqual(len(gets), 1, gets)
        self.assertIn("truncated or damaged (no valid trailer); removed, fetching it again", log)
        self.assertEqual(storage_figures(log)["storage_cache_damaged"], 1)
        _, gets, _ = self.run_and_count(url, state, self.cached_config(url), "third")
        self.assertEqual(gets, [])
        n.kill()

    def test_bytes_edited_in_place_are_never_served(self):
        """Cached shards edited in place, their size and trailer kept (one byte in every 4 KiB of
        the shard's bytes): every one is caught by its checksums, counted damaged, removed and
        fetched again; the batches equal the uncached run's (all rows were wrong before)."""
        url, state, n = self.indexed_then()
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        uncached = config(url, epochs=3, source=f"prefetch_bytes: {shard_bytes * 5 // 2}, fetch_concurrency: 1")
        want, _, _ = self.run_and_count(url, state, uncached, "plain")
        self.run_and_count(url, state, self.cached_config(url), "cached")
        files = sorted((self.dir / "cache").glob("*.shard"))
        self.assertEqual(len(files), SHARDS)
        smallest = min((self.data / f"shard-{k:03d}.tar").stat().st_size for k in range(SHARDS))
        for f in files:
            size = f.stat().st_size
            flip_bytes_in_place(f, smallest)
            self.assertEqual(f.stat().st_size, size)
        got, gets, log = self.run_and_count(url, state, self.cached_config(url), "tampered")
        self.assertSameBatches(want, got)
        self.assertEqual(sorted(gets), sorted(f"shard-{k:03d}.tar" for k in range(SHARDS)), "each fetched again")
        self.assertEqual(storage_figures(log)["storage_cache_damaged"], SHARDS, log)
        self.assertIn("differ from those written (checksum); removed, fetching it again", log)
        _, gets, log = self.run_and_count(url, state, self.cached_config(url), "after")
        self.assertEqual(gets, [], "the copies fetched again are good")
        self.assertEqual(storage_figures(log)["storage_cache_damaged"], 0)
        n.kill()

    def test_bytes_edited_while_the_daemon_holds_them_are_never_served(self):
        """Cached shards edited in place while the daemon runs on them, after it checked them:
        it holds a private copy of what it checked (a descriptor of the file itself would see
        the edit: the stateful test's seed 2 once stopped on a tar header it read that way), so
        the batches equal the uncached run's."""
        url, state, n = self.indexed_then()
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        uncached = config(url, epochs=3, source=f"prefetch_bytes: {shard_bytes * 5 // 2}, fetch_concurrency: 1")
        want, _, _ = self.run_and_count(url, state, uncached, "plain")
        self.run_and_count(url, state, self.cached_config(url), "cached")
        smallest = min((self.data / f"shard-{k:03d}.tar").stat().st_size for k in range(SHARDS))
        d = Daemon(self.dir, self.cached_config(url), extra=("--state-dir", str(state)))
        procs = [d.consume(r, "--json", "--hold-ms", "15", "--dump", str(self.dir / f"held{r}")) for r in range(2)]
        edited = set()
        while any(p.poll() is None for p in procs):
            for f in (self.dir / "cache").glob("*.shard"):
                try:
                    ino = f.stat().st_ino
                    if ino in edited:
                        continue
                    flip_bytes_in_place(f, smallest)
                    edited.add(ino)
                except FileNotFoundError:
                    pass  # removed meanwhile (damaged, or evicted)
            time.sleep(0.03)
        for p in procs:
            finish(p, timeout=120)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertGreaterEqual(len(edited), SHARDS, "every cached shard was edited while the daemon ran")
        self.assertSameBatches(want, [self.dir / f"held{r}" for r in range(2)])
        n.kill()

    def test_a_cache_folder_swapped_for_a_symlink_sends_nothing_elsewhere(self):
        """source.cache.dir renamed away and a symlink to a victim put in its place while the
        daemon runs: shards go on into the folder it opened, none into the victim; a symlink
        given at the start is refused by --check, naming it."""
        url, state, n = self.indexed_then(server="    limit_rate 2m;")
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        uncached = config(url, epochs=3, source=f"prefetch_bytes: {shard_bytes * 5 // 2}, fetch_concurrency: 1")
        want, _, _ = self.run_and_count(url, state, uncached, "plain")
        victim, cache = self.dir / "victim", self.dir / "cache"
        victim.mkdir()
        d = Daemon(self.dir, self.cached_config(url), extra=("--state-dir", str(state)))
        procs = [d.consume(r, "--json", "--dump", str(self.dir / f"swapped{r}")) for r in range(2)]
        deadline = time.time() + 60
        while not list(cache.glob("*.shard")):
            self.assertLess(time.time(), deadline, d.log())
            time.sleep(0.02)
        cache.rename(self.dir / "cache-moved")
        cache.symlink_to(victim)
        for p in procs:
            finish(p, timeout=120)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertSameBatches(want, [self.dir / f"swapped{r}" for r in range(2)])
        self.assertEqual(list(victim.iterdir()), [], "nothing written into the victim")
        self.assertGreater(len(list((self.dir / "cache-moved").glob("*.shard"))), 1)
        (self.dir / "c.yaml").write_text(self.cached_config(url))
        r = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--check", str(self.dir / "c.yaml")], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(f"source.cache.dir {cache} is a symbolic link: refused", r.stdout + r.stderr)
        self.assertEqual(list(victim.iterdir()), [])
        n.kill()

    def test_indexing_fills_the_cache_and_reads_from_it(self):
        """A first start indexes every shard from a whole GET: that GET fills the cache, so the
        epochs fetch nothing more; a start whose indexes are gone indexes from the cache."""
        n = self.nginx()
        url = n.url + "/shard-{000..005}.tar"
        dumps, gets, log = self.run_and_count(url, self.dir / "state", self.cached_config(url), "first")
        self.assertEveryEpochOnce(dumps, 3)
        self.assertIn(f"indexed {SHARDS} of {SHARDS} shards", log)
        self.assertEqual(sorted(gets), sorted(f"shard-{k:03d}.tar" for k in range(SHARDS)))
        shutil.rmtree(self.dir / "state")
        again, gets, log = self.run_and_count(url, self.dir / "state", self.cached_config(url), "again")
        self.assertIn(f"indexed {SHARDS} of {SHARDS} shards", log)
        self.assertEqual(gets, [])
        self.assertSameBatches(dumps, again)

    def test_a_cache_of_half_the_data_fetches_what_min_would(self):
        """Three epochs through a cache of three of the six shards: the fetches equal what Belady's
        MIN needs on the same sequence of shard reads (taken from a run without a cache), fewer
        than LRU's."""
        url, state, n = self.indexed_then()
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        uncached = config(url, epochs=3, consumers=1,
                          source=f"prefetch_bytes: {shard_bytes * 5 // 2}, fetch_concurrency: 1")
        _, reads, _ = self.run_and_count(url, state, uncached, "plain", consumers=1)
        mins, lrus = min_and_lru(reads, 3)
        room = f"max_bytes: {shard_bytes * 3 + 3 * 300}"  # three files with their trailers
        _, gets, log = self.run_and_count(url, state, self.cached_config(url, cache=room, consumers=1), "half",
                                          consumers=1)
        print(f"\n{self.id()}: reads {len(reads)}, fetched {len(gets)}, MIN {mins}, LRU {lrus}", file=sys.stderr)
        self.assertLessEqual(len(gets), mins + 1, (reads, gets))
        self.assertLess(len(gets), lrus, (reads, gets))
        self.assertLessEqual(sum(f.stat().st_size for f in (self.dir / "cache").glob("*.shard")),
                             shard_bytes * 3 + 900)

    def test_a_mixtures_remote_source_evicts_by_its_order_too(self):
        """The same with the shards as one source of a mixture (3:1 with a local manifest, one
        node): the store is told the mixture's order, and fetches what MIN would."""
        url, state, n = self.indexed_then()
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        notes = self.dir / "notes.jsonl"
        notes.write_text("".join(json.dumps({"id": f"m{i:04d}", "text": f"caption {i:04d}"}) + "\n"
                                 for i in range(40)))
        def mix(extra):
            return (MIX_CONFIG.replace("URL", url).replace("NOTES", str(notes))
                    .replace("fetch_retries: 5", f"prefetch_bytes: {shard_bytes * 5 // 2}, fetch_concurrency: 1{extra}")
                    .replace("epochs: 2", "epochs: 3").replace("node_rank: NODE, num_nodes: 2", "node_rank: 0")
                    .replace("consumers: 2", "consumers: 1"))
        _, reads, _ = self.run_and_count(url, state, mix(""), "plain", consumers=1)
        mins, lrus = min_and_lru(reads, 3)
        room = f", cache: {{dir: {self.dir / 'cache'}, max_bytes: {shard_bytes * 3 + 900}}}"
        _, gets, _ = self.run_and_count(url, state, mix(room), "half", consumers=1)
        print(f"\n{self.id()}: reads {len(reads)}, fetched {len(gets)}, MIN {mins}, LRU {lrus}", file=sys.stderr)
        self.assertLessEqual(len(gets), mins + 1, (reads, gets))
        self.assertLess(len(gets), lrus, (reads, gets))

    def test_a_deleted_folder_and_a_full_disk_slow_the_job_never_fail_it(self):
        url, state, n = self.indexed_then(server="    limit_rate 4m;")
        want, _, _ = self.run_and_count(url, state, self.cached_config(url), "first")
        # The folder deleted while the next run reads from it: made again, the shards fetched again.
        shutil.rmtree(self.dir / "cache")
        (self.dir / "cache").mkdir()
        d = Daemon(self.dir, self.cached_config(url), extra=("--state-dir", str(state)))
        procs = [d.consume(r, "--json", "--hold-ms", "40", "--dump", str(self.dir / f"gone{r}")) for r in range(2)]
        time.sleep(1.0)
        remove_while_written(self.dir / "cache")
        for p in procs:
            finish(p, timeout=120)
        self.assertEqual(d.wait(), 0, d.log())
        (state / "cursors.json").unlink()
        self.assertSameBatches(want, [self.dir / f"gone{r}" for r in range(2)])
        self.assertTrue(list((self.dir / "cache").glob("*.shard")), "the folder is made again")
        # A disk smaller than one shard: every write fails, shards come through memory.
        small = self.dir / "small"
        small.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)],
                          capture_output=True).returncode != 0:
            self.skipTest("cannot mount a small tmpfs here (needs root): the full-disk case is not run")
        try:
            full, gets, log = self.run_and_count(
                url, state, self.cached_config(url).replace(str(self.dir / "cache"), str(small)), "full")
        finally:
            subprocess.run(["umount", "-l", str(small)])
        self.assertSameBatches(want, full)
        self.assertIn("cannot write (No space left on device): fetching shards into memory", log)
        self.assertGreaterEqual(len(gets), SHARDS)

    def test_the_profile_and_metrics_say_whether_more_cache_would_help(self):
        """Storage-bound (1 MB/s a connection) with a cache of two of the six shards: the
        diagnosis names the cache as smaller than the data and the max_bytes that would hold it;
        /metrics counts fetches, hits and misses."""
        import service_test
        url, state, _ = self.indexed_then(server="    limit_rate 1m;")
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        port = free_port()
        cfg = self.cached_config(url, cache=f"max_bytes: {shard_bytes * 2 + 600}", epochs=0) + \
            f'metrics: {{listen: "127.0.0.1:{port}"}}\n'
        d = Daemon(self.dir, cfg, extra=("--state-dir", str(state)))
        report, (text, metrics) = self.profile_under_load(d, lambda: (
            d.ctl("profile", "--seconds", "1").stdout, service_test.samples(service_test.scrape(port)[2])))
        dx = report["diagnosis"]
        self.assertEqual(dx["kind"], "io", json.dumps(report, indent=1))
        total = sum(p.stat().st_size for p in self.data.glob("shard-*.tar"))
        self.assertIn(f"is smaller than the data ({total / 1e6:.0f} MB): max_bytes: "
                      f"{-(-total // (1 << 20))}M would read every epoch after the first from disk", dx["advice"])
        self.assertEqual(report["storage"]["data_bytes"], total)
        self.assertIn("disk cache:", text)
        self.assertGreater(metrics["mmfeed_storage_fetched_bytes_total"], 0)
        self.assertGreater(metrics["mmfeed_shard_cache_misses_total"], 0)
        self.assertIn("mmfeed_shard_cache_hits_total", metrics)
        self.assertEqual(metrics['mmfeed_shard_cache_bytes{of="max"}'], shard_bytes * 2 + 600)

    def test_two_daemons_share_one_cache_folder(self):
        n = self.nginx()
        state = self.dir / "state"
        self.build_index(n.url + "/shard-{000..005}.tar", state)
        cache = self.dir / "cache"
        cfg = lambda k, url: config(url + "/shard-{000..005}.tar", epochs=2,
                                    source=f"node_rank: {k}, num_nodes: 2, cache: {{dir: {cache}, max_bytes: 4M}}")
        daemons, _ = self.run_nodes([n.url] * 2, config_of=cfg, state=state)
        for d in daemons:
            self.assertEqual(storage_figures(d.log())["storage_cache_damaged"], 0, d.log())
        self.assertLessEqual(sum(f.stat().st_size for f in cache.glob("*.shard")), 4 << 20)
        self.assertTrue(list(cache.glob("*.shard")))


class FaultyServer:
    """An HTTP server whose first GET of each object in `faults` fails as it says ("reset":
    headers and half the body, then the connection is closed; "stall": headers and half the
    body, then nothing); other GETs and every HEAD are served whole."""

    def __init__(self, root, faults):
        import http.server, threading
        self.gets = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def headers_for(self, body):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", '"v1"')
                self.end_headers()

            def do_HEAD(self):
                self.headers_for((root / self.path.lstrip("/")).read_bytes())

            def do_GET(self):
                body = (root / self.path.lstrip("/")).read_bytes()
                n = server.gets[self.path] = server.gets.get(self.path, 0) + 1
                fault = faults.get(self.path)
                self.headers_for(body)
                if n > 1 or not fault:
                    self.wfile.write(body)
                    return
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                if fault == "stall":
                    server.stop.wait(30)
                self.close_connection = True

        self.stop = threading.Event()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def kill(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class FaultyServerTest(RemoteCase):
    def test_reset_and_stalled_transfers_are_retried(self):
        faults = {"/shard-000.tar": "reset", "/shard-003.tar": "reset", "/shard-001.tar": "stall"}
        server = FaultyServer(self.data, faults)
        self.servers.append(server)
        state = self.dir / "state"
        url = server.url + "/shard-{000..005}.tar"
        # A stall is noticed after fetch_timeout_s of (curl's moving ~5 s average of) no progress.
        t0 = time.time()
        self.build_index(url, state, source="fetch_timeout_s: 1")
        self.assertLess(time.time() - t0, 30)
        self.assertEqual(server.gets, {f"/shard-{s:03d}.tar": 2 if f"/shard-{s:03d}.tar" in faults else 1
                                       for s in range(SHARDS)})
        d = Daemon(self.dir, config(url), extra=("--state-dir", str(state)))
        dumps = self.run_ranks(d)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEveryEpochOnce(dumps, 1)


class StalledStoreTest(RemoteCase):
    def test_a_store_down_from_the_start_fails_the_start_and_is_not_waited_for(self):
        """Nothing listens at the URL: --check fails after its retries, naming the URL, rather
        than waiting for a store that never answered (the wait is for one that did)."""
        port = free_port()
        (self.dir / "c.yaml").write_text(config(f"http://127.0.0.1:{port}/shard-{{000..005}}.tar",
                                                source="fetch_retries: 1, fetch_timeout_s: 1"))
        t0 = time.time()
        r = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--check", str(self.dir / "c.yaml")], capture_output=True,
                           text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"http://127.0.0.1:{port}/shard-000.tar", r.stdout + r.stderr)
        self.assertLess(time.time() - t0, 60)

    def test_a_store_that_hangs_is_named_trainers_are_told_and_the_job_goes_on_exactly(self):
        """nginx stopped (SIGSTOP: connections are accepted, nothing answers) a second into the
        run, each sample's deadline 3 s: samples once timed out one after another, skipped, and
        no trainer heard of it. Now they wait for the store; past fetch_stall_s the status, the
        profile and a trainer's next() with a timeout name the storage and the failing requests;
        continued (SIGCONT), every sample of every epoch arrives once, none skipped."""
        url, state, n = self.indexed_then(server="    limit_rate 1m;")
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        cfg = config(url, epochs=2, source=f"prefetch_bytes: {shard_bytes * 5 // 2}, fetch_retries: 2, "
                                           "fetch_timeout_s: 1, fetch_stall_s: 2") + "sample_timeout_s: 3\n"
        d = Daemon(self.dir, cfg, extra=("--state-dir", str(state)))
        told = self.dir / "told.txt"
        told.write_text("")
        # Rank 1's trainer: mmfeed-consume lives with --timeout 2 (each ends at a timeout with
        # the client's message, the next resumes from its cursor), until the end of the data.
        import threading
        lives = []

        def rank1():
            while True:
                p = d.consume(1, "--timeout", "2", "--cursor", str(self.dir / "cursor1.json"), "--dump",
                              str(self.dir / f"dump1-{len(lives):03d}"))
                lives.append(p)
                out, err = p.communicate(timeout=300)
                if p.returncode == 0:
                    return
                with open(told, "a") as f:
                    f.write(err)
                if "no batch within" not in err:
                    return  # another failure: the assertions below say which

        trainer = threading.Thread(target=rank1, daemon=True)
        trainer.start()
        first = d.consume(0, "--json", "--dump", str(self.dir / "dump0"))
        time.sleep(1.0)
        n.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.time() + 90
            while True:
                status = json.loads(d.ctl("status", "--json").stdout)
                if status["state"] == "storage stalled":
                    break
                self.assertLess(time.time(), deadline, "no stall reported:\n" + d.log())
                time.sleep(0.2)
            stalled = status["storage_stalled"]
            self.assertGreaterEqual(stalled["stalled_seconds"], 2)
            self.assertTrue(any(re.search(r"/shard-00\d\.tar$", r["url"]) for r in stalled["requests"]), stalled)
            self.assertIn("storage stalled: no request answered for", d.ctl("status").stdout)
            while "the daemon's storage has answered no request for" not in (told.read_text() if told.exists() else ""):
                self.assertLess(time.time(), deadline, "the trainer was not told:\n" + d.log())
                time.sleep(0.2)
            self.assertRegex(told.read_text(), r"no batch within 2\.0 s: the daemon's storage has answered no request "
                                               r"for \d+ s; http://127\.0\.0\.1:\d+/shard-00\d\.tar: ")
            r = d.ctl("profile", "--seconds", "0.5", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            diagnosis = json.loads(r.stdout)["diagnosis"]
            self.assertEqual(diagnosis["kind"], "io")
            self.assertIn("storage stalled: object storage has answered no request for", diagnosis["evidence"])
            self.assertIn("storage stalled: no request answered for", d.log())
        finally:
            n.proc.send_signal(signal.SIGCONT)
        finish(first, timeout=180)
        trainer.join(300)
        self.assertFalse(trainer.is_alive())
        self.assertEqual(lives[-1].returncode, 0, told.read_text()[-2000:])
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("storage answers again after", d.log())
        self.assertIn("samples skipped: 0", d.log())
        # Rank 1's batches over its lives, each once (a life's last batch may come again in the
        # next when it timed out between the batch and its cursor: the same batch, kept once).
        rank1 = {}
        for life in sorted(self.dir.glob("dump1-*")):
            for meta, _ in dumped_batches(life):
                rank1.setdefault(meta["seq"], meta)
        self.assertEqual(sorted(rank1), list(range(len(rank1))), "rank 1: no batch missing")
        for e in range(2):
            got = [i for meta, _ in dumped_batches(self.dir / "dump0") if meta["epoch"] == e for i in meta["ids"]]
            got += [i for meta in rank1.values() if meta["epoch"] == e for i in meta["ids"]]
            self.assertEqual(sorted(got), sorted(self.ids), f"epoch {e}: every sample once")


HUGE = 100 * 10**9


class LyingServer:
    """Serves HEADs and whole GETs honestly; range GETs of the shards in `lies` are answered
    wrongly: "shift" sends the bytes 1024 further on under the asked-for Content-Range (another
    member's bytes), "range" sends the right bytes' neighbours under their own Content-Range.
    A "huge" shard's HEAD says 100 GB, and its GET sends the shard over and over, endlessly."""

    def __init__(self, root, lies):
        import http.server, threading

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                body = (root / self.path.lstrip("/")).read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(HUGE if lies.get(self.path) == "huge" else len(body)))
                self.end_headers()

            def do_GET(self):
                body = (root / self.path.lstrip("/")).read_bytes()
                if lies.get(self.path) == "huge":  # its HEAD's 100 GB, as long as anyone reads
                    self.send_response(200)
                    self.send_header("Content-Length", str(HUGE))
                    self.end_headers()
                    try:
                        while True:
                            self.wfile.write(body)
                    except OSError:
                        return
                want = self.headers.get("Range")
                if not want:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                first, last = (int(x) for x in want.split("=")[1].split("-"))
                lie = lies.get(self.path)
                shift = 1024 if lie == "shift" else 0
                a, b = (first + 1, last + 1) if lie == "range" else (first, last)
                part = body[a + shift:b + 1 + shift]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {a}-{a + len(part) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                self.wfile.write(part)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def kill(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class LyingServerTest(RemoteCase):
    def test_members_answered_with_other_bytes_are_failed_never_fed(self):
        lies = {"/shard-002.tar": "shift", "/shard-004.tar": "range"}
        server = LyingServer(self.data, lies)
        self.servers.append(server)
        shard_bytes = (self.data / "shard-000.tar").stat().st_size
        d = Daemon(self.dir, config(server.url + "/shard-{000..005}.tar",
                                    source=f"prefetch_bytes: {shard_bytes // 2}, fetch_concurrency: 1"))
        dumps = self.run_ranks(d)
        self.assertEqual(d.wait(), 0, d.log())
        ids = captioned_ids(self, dumps)  # every row's text is its own sample's
        liars = {f"s{i:04d}" for s in (2, 4) for i in range(s * PER_SHARD, (s + 1) * PER_SHARD)}
        self.assertFalse(liars & set(ids), "a sample of a lying shard was fed")
        self.assertEqual(set(ids), set(self.ids) - liars)
        log = d.log()
        self.assertRegex(log, r"shard-002\.tar: member s00[45]\d\.(jpg|txt) at offset \d+: .*the server answered "
                              r"with other bytes")
        self.assertIn("shard-004.tar: asked for bytes", log)


    def test_a_shard_claiming_100_gb_is_refused_before_it_is_read(self):
        """A HEAD of 100 GB with an endless body: over source.max_shard_bytes (64 GiB), refused
        with the key to raise, and the other shards are fed; what the index of a shard keeps
        while it streams is its headers only (WebDatasetTest.IndexingAStreamKeepsItsHeadersNotItsData)."""
        server = LyingServer(self.data, {"/shard-003.tar": "huge"})
        self.servers.append(server)
        t0 = time.time()
        d = Daemon(self.dir, config(server.url + "/shard-{000..005}.tar"))
        dumps = self.run_ranks(d)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertLess(time.time() - t0, 60)
        self.assertIn("shard-003.tar (source): the server says the shard is 100000000000 bytes, over "
                      "source.max_shard_bytes (68719476736)", d.log())
        huge = {f"s{i:04d}" for i in range(3 * PER_SHARD, 4 * PER_SHARD)}
        self.assertEqual(set(captioned_ids(self, dumps)), set(self.ids) - huge)


    def test_other_shards_of_equal_sizes_from_a_server_without_etags_are_another_stream(self):
        """A server that sends no ETag nor Last-Modified: a reload to other shards of the same
        sizes (ids s -> t) changes the data, so it switches at the epoch boundary (it used to
        apply at once, mixing both shard sets in one epoch)."""
        other = self.dir / "other"
        other.mkdir()
        for shard in sorted(self.data.glob("shard-*.tar")):
            with tarfile.open(shard) as src, tarfile.open(other / shard.name, "w", format=tarfile.USTAR_FORMAT) as dst:
                for m in src.getmembers():
                    data = src.extractfile(m).read()
                    m.name = "t" + m.name[1:]
                    dst.addfile(m, io.BytesIO(data))
            self.assertEqual((other / shard.name).stat().st_size, shard.stat().st_size)
        server = LyingServer(self.dir, {})
        self.servers.append(server)
        d = Daemon(self.dir, config(server.url + "/data/shard-{000..005}.tar", epochs=2))
        c = d.consume(0, "--batches", "1")
        finish(c)
        (self.dir / "b.yaml").write_text(config(server.url + "/other/shard-{000..005}.tar", epochs=2))
        r = d.ctl("reload", "--config", str(self.dir / "b.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(json.loads(r.stdout)["applied"].startswith("at the next epoch boundary"), r.stdout)
        d.proc.kill()
        d.proc.wait()


class S3Test(RemoteCase):
    def setUp(self):
        super().setUp()
        if not S3RVER or not os.access(S3RVER, os.X_OK):
            self.fail(f"s3rver not found at {S3RVER}: scripts/setup.sh installs it from npm")
        self.port = free_port()
        self.s3 = subprocess.Popen([S3RVER, "-d", str(self.dir / "s3"), "-a", "127.0.0.1", "-p", str(self.port),
                                    "--silent"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(self.port, self.s3, "s3rver")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # A bucket created by the test, objects uploaded with signed requests (s3rver's own key).
        self.signed("PUT", "/mmfeed-it")
        for s in range(SHARDS):
            self.signed("PUT", f"/mmfeed-it/wds/shard-{s:03d}.tar", self.data / f"shard-{s:03d}.tar")

    def tearDown(self):
        self.s3.kill()
        self.s3.wait()
        super().tearDown()

    def signed(self, method, path, upload=None, key="S3RVER"):
        cmd = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--aws-sigv4", "aws:amz:us-east-1:s3",
               "--user", f"{key}:S3RVER", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-X", method]
        if upload:
            cmd += ["-T", str(upload)]
        r = subprocess.run(cmd + [self.endpoint + path], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout, "200", f"{method} {path}: {r.stdout} {r.stderr}")

    def start(self, s3, env):
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update({k: v for k, v in env.items() if v is not None})
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
        try:
            return Daemon(self.dir, config("s3://mmfeed-it/wds/shard-{000..005}.tar",
                                           source=f"s3: {{endpoint: '{self.endpoint}', {s3}}}"))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_signed_reads_with_keys_from_the_environment_or_a_credentials_file(self):
        d = self.start("region: us-east-1", {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"})
        dumps = self.run_ranks(d)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEveryEpochOnce(dumps, 1)
        (self.dir / "credentials").write_text("[default]\naws_access_key_id = NOBODY\naws_secret_access_key = x\n"
                                              "[train]\naws_access_key_id = S3RVER\naws_secret_access_key = S3RVER\n")
        shutil.rmtree(self.dir / "dump0"), shutil.rmtree(self.dir / "dump1")
        d = self.start("credentials_file: credentials, profile: train",
                       {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None})
        dumps = self.run_ranks(d)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEveryEpochOnce(dumps, 1)

    def test_unknown_key_is_refused_with_the_reason(self):
        saved = dict(os.environ)
        os.environ.update({"AWS_ACCESS_KEY_ID": "NOBODY", "AWS_SECRET_ACCESS_KEY": "x"})
        (self.dir / "p.yaml").write_text(config("s3://mmfeed-it/wds/shard-{000..005}.tar",
                                                source=f"s3: {{endpoint: '{self.endpoint}'}}"))
        try:
            r = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket",
                                str(self.dir / "x.sock")], capture_output=True, text=True, timeout=60)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("s3://mmfeed-it/wds/shard-000.tar: HTTP 403", r.stderr + r.stdout)
        self.assertIn("no usable samples", r.stderr + r.stdout)


class MultiNodeTest(RemoteCase):
    def test_two_nodes_deal_every_sample_once(self):
        n = self.nginx()
        _, dumps = self.run_nodes([n.url] * 2)
        for dump in dumps:  # 120 samples / 2 nodes / 2 ranks = 3 batches of 10 per epoch
            self.assertEqual(len(dumped_batches(dump)), 6)


MIX_CONFIG = """pipeline: remote-mix
sources:
  - {name: web, type: webdataset, path: "URL", weight: 3, shuffle_window: 2, fetch_retries: 5}
  - {name: notes, type: manifest, path: NOTES, weight: 1}
mix: {seed: 5, epochs: 2, samples_per_epoch: 160, node_rank: NODE, num_nodes: 2}
consumers: 2
""" + CONFIG.split("consumers: CONSUMERS\n")[1]


class MixTest(RemoteCase):
    def test_a_remote_source_mixes_with_a_local_one_and_each_node_fetches_its_part(self):
        """Shards from nginx (120 samples, weight 3) and a local text-only manifest (40, weight 1)
        on two nodes: every epoch holds every sample once over the nodes; a node fetches only
        the windows of its own part of the shard order (4 of the 6 shards)."""
        n = self.nginx()
        state = self.dir / "state"
        self.build_index(n.url + "/shard-{000..005}.tar", state)  # the fetches counted: windows read
        notes = self.dir / "notes.jsonl"
        notes.write_text("".join(json.dumps({"id": f"m{i:04d}", "text": f"caption {i:04d}"}) + "\n"
                                 for i in range(40)))
        daemons, dumps = self.run_nodes(
            [n.url] * 2, config_of=lambda k, url: MIX_CONFIG.replace("URL", url + "/shard-{000..005}.tar")
            .replace("NOTES", str(notes)).replace("NODE", str(k)),
            ids=self.ids + [f"m{i:04d}" for i in range(40)], state=state)
        for k, d in enumerate(daemons):
            self.assertIn("web: 120 samples, 75.00% of the stream, 120 draws an epoch (1 passes)", d.log())
            self.assertIn("web is read in windows of 2 shard(s) (shuffle_window), each node its own part of the "
                          "shard order, fetched ahead within its prefetch_bytes", d.log())
            figures = storage_figures(d.log())
            self.assertEqual(figures["storage_failed_shards"], 0)
            # Its half of each epoch's shard order: 2 windows of 2 shards an epoch (fewer when the
            # next epoch's are still held), none of the other node's half.
            self.assertTrue(4 <= figures["storage_shards_fetched"] <= 8, f"node {k}: {figures}")
            for e in range(2):
                web = {i for dump in dumps[2 * k:2 * k + 2] for meta, _ in dumped_batches(dump)
                       if meta["epoch"] == e for i in meta["ids"] if i[0] == "s"}
                self.assertEqual(len(web), 60)
                self.assertLessEqual(len({int(i[1:]) // PER_SHARD for i in web}), 4, f"node {k}, epoch {e}")


class Namespaces:
    """A store namespace and one namespace per node, each node joined to the store by a veth
    pair: node k is 10.213.k.2, the store 10.213.k.1 on that link. Made by the test, removed
    after it."""

    def __init__(self, nodes):
        tag = f"mmf{os.getpid() % 100000}"
        self.store, self.nodes, self.links = f"{tag}s", [f"{tag}n{k}" for k in range(nodes)], []
        try:
            for ns in [self.store, *self.nodes]:
                self.ip("netns", "add", ns)
            self.ip("-n", self.store, "link", "set", "lo", "up")
            for k, ns in enumerate(self.nodes):
                a, b = f"{tag}a{k}", f"{tag}b{k}"
                self.ip("link", "add", a, "netns", self.store, "type", "veth", "peer", "name", b, "netns", ns)
                self.ip("-n", self.store, "addr", "add", f"10.213.{k}.1/24", "dev", a)
                self.ip("-n", ns, "addr", "add", f"10.213.{k}.2/24", "dev", b)
                for n, dev in ((self.store, a), (ns, b), (ns, "lo")):
                    self.ip("-n", n, "link", "set", dev, "up")
        except (OSError, subprocess.CalledProcessError) as e:
            self.remove()
            raise unittest.SkipTest(f"cannot make network namespaces here ({e}): the two-node test in one namespace "
                                    "still runs")

    @staticmethod
    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    def exec(self, ns):
        return ["ip", "netns", "exec", ns]

    def remove(self):
        for ns in [self.store, *self.nodes]:  # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


class NetnsTest(RemoteCase):
    def test_nodes_in_their_own_network_namespaces_deal_every_sample_once(self):
        if os.geteuid() != 0:
            self.skipTest("network namespaces need root")
        ns = Namespaces(2)
        self.addCleanup(ns.remove)
        n = Nginx(self.data, self.dir / "nginx", port=8080, hosts=("10.213.0.1", "10.213.1.1"),
                  wrap=ns.exec(ns.store))
        self.servers.append(n)
        for k, node in enumerate(ns.nodes):  # the store answers each node on its own link
            deadline = time.time() + 20
            while subprocess.run([*ns.exec(node), "curl", "-sfI", "-o", "/dev/null", f"http://10.213.{k}.1:8080/"
                                  "shard-000.tar"], timeout=30).returncode != 0:
                self.assertLess(time.time(), deadline, "nginx did not answer in the store namespace")
                time.sleep(0.1)
        # No namespace reaches the others' links, nor the host's loopback.
        self.assertNotEqual(subprocess.run([*ns.exec(ns.nodes[0]), "curl", "-sf", "-m", "2", "-o", "/dev/null",
                                            "http://10.213.1.1:8080/shard-000.tar"], timeout=30).returncode, 0)
        # Consumers attach from the host namespace: the control socket is a file.
        self.run_nodes([f"http://10.213.{k}.1:8080" for k in range(2)], [ns.exec(node) for node in ns.nodes])


def main():
    global S3RVER
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--s3rver")
    a, rest = ap.parse_known_args()
    daemon_test.BIN = os.path.abspath(a.bin)
    S3RVER = a.s3rver
    unittest.main(module="__main__", argv=[sys.argv[0], "-v", *rest])


if __name__ == "__main__":
    main()
