#!/usr/bin/env python3
"""Processed-sample caches (a stage's `cache:`, docs/design/cache.md): the real mmfeedd keeping stage
outputs across epochs, against uncached runs of the same config on the same files.

usage: cache_test.py --bin BUILD/bin
"""
import json, os, pathlib, re, subprocess, sys, time

import numpy as np

import daemon_test
from daemon_test import Daemon, DaemonCase, dumped_batches, finish, make_dataset

SAMPLES = 480
ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def kept_row(size=32):
    """A kept sample of the image stage: its output's byte count, then a float32 CHW image."""
    return 8 + 3 * size * size * 4


CONFIG = """pipeline: cache
source: {{type: manifest, path: manifest.jsonl, shuffle: true, seed: 3, epochs: {epochs}}}
consumers: {consumers}
stages:
  - {{name: image, type: image, field: image, workers: 2,{image_cache}
     params: {{crop: {crop}, size: [{size}, {size}], mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225],
              dtype: float32, layout: CHW{image_params}}}}}
  - {{name: text, type: text, field: text,{text_cache} params: {{tokenizer: bytes, max_len: 32}}}}
  - {{name: batch, type: batch, inputs: [image, text], params: {{batch_size: 16}}}}
output: {{ring_slots: 4}}
{extra}"""


def config(image_cache="", text_cache="", crop="center", epochs=3, consumers=2, extra="", size=32,
           image_params=""):
    return CONFIG.format(image_cache=image_cache, text_cache=text_cache, crop=crop, epochs=epochs,
                         consumers=consumers, extra=extra, size=size, image_params=image_params)


def cache_figures(log, stage):
    """The `<stage>: cache hits H, misses M (...)` line of the daemon's final profile."""
    m = re.findall(rf"^{stage}: cache hits (\d+), misses (\d+) .* (\d+) not kept$", log, re.M)
    assert m, f"no cache line for {stage} in the profile:\n" + log
    hits, misses, not_kept = (int(v) for v in m[-1])
    return hits, misses, not_kept


def min_and_lru(accesses, capacity, size=lambda x: 1, cost=None):
    """What Belady's MIN (with bypass: an item needed later than all it would displace is not
    kept) and LRU miss over `accesses`, each cache holding `capacity` (items, or what `size`
    counts): (MIN's, LRU's), summed in `cost` (default: `size`). Shared with the remote tests
    and bench/cache_bench.py."""
    cost = cost or size
    n = len(accesses)
    nexts, where = [0] * n, {}
    for t in range(n - 1, -1, -1):
        nexts[t] = where.get(accesses[t], n + 1)
        where[accesses[t]] = t
    held, used, mins = {}, 0, 0  # item -> its next use
    for i, x in enumerate(accesses):
        if x not in held:
            mins += cost(x)
            used += size(x)
        held[x] = nexts[i]
        while used > capacity:
            y = max(held, key=held.get)
            used -= size(y)
            del held[y]
    lru, used, lrus = {}, 0, 0  # insertion-ordered: least recent first
    for x in accesses:
        if x in lru:
            del lru[x]
        else:
            lrus += cost(x)
            used += size(x)
        lru[x] = True
        while used > capacity:
            y = next(iter(lru))
            used -= size(y)
            del lru[y]
    return mins, lrus


class CacheTest(DaemonCase):
    def setUp(self):
        super().setUp()
        make_dataset(self.dir, SAMPLES)

    def run_dumps(self, text, name, consumers=2):
        d = Daemon(self.dir, text)
        cs = [d.consume(r, "--json", "--dump", str(self.dir / f"{name}{r}")) for r in range(consumers)]
        for c in cs:
            finish(c, timeout=180)
        self.assertEqual(d.wait(), 0, d.log())
        return [dumped_batches(self.dir / f"{name}{r}") for r in range(consumers)], d.log()

    def test_cached_epochs_are_byte_identical_and_decode_nothing_after_the_first(self):
        want, _ = self.run_dumps(config(), "plain")
        got, log = self.run_dumps(config(image_cache=" cache: {},", text_cache=" cache: {},",
                                         extra="cache_budget: 64M\n"), "cached")
        for w, g in zip(want, got):
            self.assertEqual([m["ids"] for m, _ in w], [m["ids"] for m, _ in g])
            self.assertEqual(len(w), 3 * SAMPLES // 2 // 16)
            for (_, wp), (_, gp) in zip(w, g):
                for t in ("image", "text", "text_lengths"):
                    self.assertEqual((wp / f"{t}.npy").read_bytes(), (gp / f"{t}.npy").read_bytes(), f"{gp} {t}")
        for stage in ("image", "text"):
            self.assertMadeOnce(log, stage, got)

    def test_a_random_crop_keeps_decoded_images_and_equals_dct_scaling_off(self):
        """random_resized_crop + flip: a new crop every epoch, from the kept full-size decode."""
        random = dict(crop="random_resized_crop", image_params=", flip: 0.5")
        want, _ = self.run_dumps(config(crop="random_resized_crop", image_params=", flip: 0.5, dct_scaling: off"),
                                 "off")
        got, log = self.run_dumps(config(**random, image_cache=" cache: {max_bytes: 256M},"), "cached")
        for w, g in zip(want, got):
            self.assertSameBatches(w, g)
        self.assertMadeOnce(log, "image", got)
        # The crops differ from epoch to epoch: the same sample's rows are not equal.
        rows = {}
        for meta, path in got[0]:
            image = np.load(path / "image.npy")
            for k, sid in enumerate(meta["ids"]):
                rows.setdefault(sid, []).append(image[k].tobytes())
        self.assertTrue(all(len(set(r)) == len(r) for r in rows.values() if len(r) > 1))

    def test_a_random_audio_window_keeps_the_waveform_and_equals_uncached(self):
        tone = ROOT / "tests" / "data" / "audio" / "tone.wav"
        with open(self.dir / "audio.jsonl", "w") as m:
            for i in range(12):
                ext = ("wav", "flac", "mp3")[i % 3]
                out = self.dir / f"a{i}.{ext}"
                subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(tone), str(out)], check=True)
                m.write(json.dumps({"id": f"a{i}", "audio": out.name, "text": f"clip {i}"}) + "\n")
        text = self.shipped("audio-text.yaml", ("path: manifest.jsonl", "path: audio.jsonl"),
                            ("max_seconds: 30, crop: head", "max_seconds: 1, crop: random"))
        want, _ = self.run_dumps(text, "plain", 1)
        got, log = self.run_dumps(text.replace("workers: 2,", "workers: 2, cache: {max_bytes: 64M},"), "cached", 1)
        self.assertSameBatches(want[0], got[0])
        self.assertMadeOnce(log, "audio", got)
        windows = {}
        for meta, path in got[0]:
            feats = np.load(path / "audio.npy")
            for k, sid in enumerate(meta["ids"]):
                windows.setdefault(sid, set()).add(feats[k].tobytes())
        self.assertGreater(sum(len(w) for w in windows.values()), 12, "the window moves from epoch to epoch")

    def test_video_frames_sampled_alike_every_epoch_are_kept(self):
        for i in range(6):
            ext, codec = (("mp4", "libx264"), ("mkv", "libx264"))[i % 2]
            subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                            f"testsrc2=size=160x120:rate=25:duration={2 + i % 3}", "-c:v", codec, "-pix_fmt", "yuv420p",
                            str(self.dir / f"v{i}.{ext}")], check=True)
        (self.dir / "video.jsonl").write_text("".join(
            json.dumps({"id": f"v{i}", "video": f"v{i}.{('mp4', 'mkv')[i % 2]}", "text": f"video {i}"}) + "\n"
            for i in range(6)))
        text = self.shipped("video-text.yaml", ("path: manifest.jsonl", "path: video.jsonl"),
                            ("size: [224, 224]", "size: [64, 64]"))
        want, _ = self.run_dumps(text, "plain", 1)
        cached = text.replace("field: video, workers: 2,", "field: video, workers: 2, cache: {max_bytes: 64M},")
        got, log = self.run_dumps(cached, "cached", 1)
        self.assertSameBatches(want[0], got[0])
        self.assertMadeOnce(log, "video", got)
        p = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        (self.dir / "p.yaml").write_text(cached.replace("sampling: uniform", "sampling: clip, fps: 8"))
        p = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("stage 'video' (video) cannot be cached: clip_start: random draws a new clip every epoch",
                      p.stderr)

    def shipped(self, name, *replacements):
        """configs/`name` for 3 epochs, with each (old, new) of `replacements` made."""
        text = (ROOT / "configs" / name).read_text()
        for old, new in (("epochs: 1", "epochs: 3"), *replacements):
            self.assertIn(old, text)
            text = text.replace(old, new)
        return text

    def assertMadeOnce(self, log, stage, dumps):
        """Every sample of `dumps` (one per rank) made at its first read, then copied: each
        read a hit or a miss, none refused. A sample still being made when its next read comes
        (an epoch no longer than what is in flight) is made again: a few more misses."""
        ids = [i for dump in dumps for meta, _ in dump for i in meta["ids"]]
        hits, misses, not_kept = cache_figures(log, stage)
        self.assertEqual((hits + misses, not_kept), (len(ids), 0), stage)
        self.assertGreaterEqual(misses, len(set(ids)), stage)
        self.assertLessEqual(misses, len(set(ids)) + max(2, len(ids) // 50), stage)

    def assertSameBatches(self, want, got):
        """Equal ids and every tensor's bytes, batch by batch."""
        self.assertEqual([m["ids"] for m, _ in want], [m["ids"] for m, _ in got])
        for (_, wp), (_, gp) in zip(want, got):
            names = sorted(p.name for p in wp.glob("*.npy"))
            self.assertEqual(names, sorted(p.name for p in gp.glob("*.npy")))
            for n in names:
                self.assertEqual((wp / n).read_bytes(), (gp / n).read_bytes(), f"{gp} {n}")

    def qwen_config(self, name, cached):
        """A shipped Qwen config on this test's files, 3 epochs, small images; `cached`: every
        stage but the batch with `cache: {}` under a cache_budget."""
        text = self.shipped(name, ("../tests/data/tokenizer/qwen3-tokenizer.json.gz",
                                   str(ROOT / "tests" / "data" / "tokenizer" / "qwen3-tokenizer.json.gz")))
        text = re.sub(r"max_pixels: \d+", "max_pixels: 262144", text)
        if cached:
            text = re.sub(r"(- \{name: (?!batch)\w+, type: \w+, field: \w+,)", r"\1 cache: {},", text)
            text += "cache_budget: 512M\n"
        return text

    def test_the_qwen_configs_cached_equal_uncached_a_mixture_too(self):
        sys.path.insert(0, str(ROOT / "scripts"))
        import make_photos
        photos = make_photos.make(self.dir, 6, 200, 400, seed=5)
        subprocess.run(f"ffmpeg -v error -y -f lavfi -i testsrc2=size=192x144:rate=10 -t 2 "
                       f"-c:v libx264 -pix_fmt yuv420p {self.dir / 'clip0.mp4'}", shell=True, check=True)
        rows = [{"id": f"c{i}", "image": photos[i % 6]["name"], "video": [], "text": f"Describe {i}.",
                 "answer": f"Photo {i}."} for i in range(12)]
        for name, lines in [("manifest", rows), ("captions", rows),
                            ("video_qa", [{"id": f"v{i}", "clip": "clip0.mp4", "question": f"What {i}?",
                                           "reply": "Colours."} for i in range(3)]),
                            ("chat", [{"id": f"t{i}", "text": f"Say {i}.", "answer": f"{i}."} for i in range(5)])]:
            (self.dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        for name, stages in [("qwen3.5-vl.yaml", ("pixel_values", "input_ids")),
                             ("qwen3.5-vl-mix.yaml", ("pixel_values", "pixel_values_videos", "input_ids"))]:
            with self.subTest(config=name):
                want, _ = self.run_dumps(self.qwen_config(name, False), f"{name}-plain", 1)
                got, log = self.run_dumps(self.qwen_config(name, True), f"{name}-cached", 1)
                self.assertSameBatches(want[0], got[0])
                for stage in stages:
                    self.assertMadeOnce(log, stage, got)

    def test_half_a_cache_hits_within_5_percent_of_min_and_more_than_lru(self):
        capacity = SAMPLES // 2
        got, log = self.run_dumps(
            config(image_cache=f" cache: {{max_bytes: {capacity * kept_row()}}},", epochs=4, consumers=1), "half", 1)
        reads = [i for meta, _ in got[0] for i in meta["ids"]]
        self.assertEqual(len(reads), 4 * SAMPLES)
        hits, misses, _ = cache_figures(log, "image")
        self.assertEqual(hits + misses, len(reads))
        min_misses, lru_misses = min_and_lru(reads, capacity)
        best, lru = len(reads) - min_misses, len(reads) - lru_misses
        self.assertGreaterEqual(hits, 0.95 * best, f"MIN {best}, LRU {lru}")
        self.assertGreater(hits, lru, f"MIN {best}")

    def test_a_disk_tier_keeps_what_memory_cannot_damage_and_all(self):
        """Memory for a few decoded images, a disk tier for all: every sample decoded once
        (misses), the rest read back from disk, byte-identical to uncached; files truncated,
        scribbled on or deleted while it runs are made again, never served; the tier's folder
        goes with the daemon."""
        random = dict(crop="random_resized_crop", consumers=1)
        want, _ = self.run_dumps(config(**random, image_params=", flip: 0.5, dct_scaling: off"), "off", 1)
        tier = self.dir / "tier"
        # Another daemon's folder (its lock held by a living process) stays; a dead one's goes.
        for name in ("mmfeed-samples-1-0", "mmfeed-samples-2-0"):
            (tier / name).mkdir(parents=True)
            (tier / name / ".lock").touch()
            (tier / name / "5").write_bytes(b"old")
        holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                                   f"f = open('{tier}/mmfeed-samples-1-0/.lock')\n"
                                   "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)"],
                                  stdout=subprocess.PIPE, text=True)
        self.addCleanup(holder.stdout.close)
        self.addCleanup(holder.wait)
        self.addCleanup(holder.kill)
        self.assertEqual(holder.stdout.readline().strip(), "held")
        cached = config(**random, image_params=", flip: 0.5", image_cache=f" cache: {{max_bytes: 1M, disk: {{dir: {tier}, max_bytes: 1G}}}},")
        d = Daemon(self.dir, cached)
        c = d.consume(0, "--json", "--dump", str(self.dir / "cached0"), "--hold-ms", "50")
        deadline, damaged = time.time() + 120, []
        while c.poll() is None and not damaged:  # once epoch 0's samples are on disk
            self.assertLess(time.time(), deadline, d.log())
            status = json.loads(d.ctl("status", "--json").stdout or "{}")
            disk = next((s["cache"]["disk"] for s in status.get("profile", {}).get("stages", [])
                         if s["name"] == "image"), {"samples": 0})
            if disk["samples"] >= SAMPLES:
                files = sorted(f for f in tier.glob("mmfeed-samples-*/*") if f.name.isdigit())
                for k, f in enumerate(files[:30]):
                    if k % 3 == 0:
                        os.truncate(f, f.stat().st_size // 2)
                    elif k % 3 == 1:
                        with open(f, "r+b") as w:
                            w.seek(f.stat().st_size // 2)
                            w.write(b"\xff\x00\xff")
                    else:
                        f.unlink()
                damaged = files[:30]
            time.sleep(0.05)
        finish(c, timeout=180)
        self.assertEqual(d.wait(), 0, d.log())
        got = dumped_batches(self.dir / "cached0")
        self.assertSameBatches(want[0], got)
        log = d.log()
        self.assertEqual(len(damaged), 30, "the run ended before epoch 0's samples were on disk")
        ids = [i for meta, _ in got for i in meta["ids"]]
        hits, misses, _ = cache_figures(log, "image")
        self.assertEqual(hits + misses, len(ids))
        self.assertLessEqual(misses, SAMPLES + 30 + 10, "decoded once, and again where damaged")
        m = re.findall(r"^image: cache disk hits (\d+), (\d+) samples in .* (\d+) damaged, (\d+) failed writes$",
                       log, re.M)
        self.assertTrue(m, log)
        disk_hits, _, bad, failed = (int(v) for v in m[-1])
        self.assertGreater(disk_hits, SAMPLES, log)
        self.assertGreaterEqual(bad, 1, "a damaged file was read and refused")
        self.assertLessEqual(bad, 30)
        self.assertEqual(failed, 0)
        self.assertEqual(list(tier.glob("mmfeed-samples-*")), [tier / "mmfeed-samples-1-0"],
                         "the daemon removed its folder and the dead one's, not the living one's")

    def test_folders_swapped_for_symlinks_send_nothing_elsewhere(self):
        """The disk tier's folder, its `dir` and --state-dir each swapped for a symlink to a victim
        folder while the daemon runs (renamed away, a link in its place): the daemon goes on
        through the folders it opened and writes nothing into the victims (it once wrote 251
        sample files into one and left them). A symlink given at the start is refused, naming
        it."""
        random = dict(crop="random_resized_crop", consumers=1)
        want, _ = self.run_dumps(config(**random, image_params=", flip: 0.5, dct_scaling: off"), "off", 1)
        tier, state = self.dir / "tier", self.dir / "state"
        victims = [self.dir / f"victim{k}" for k in range(3)]
        for v in victims:
            v.mkdir()
        cached = config(**random, image_params=", flip: 0.5",
                        image_cache=f" cache: {{max_bytes: 1M, disk: {{dir: {tier}, max_bytes: 1G}}}},")
        d = Daemon(self.dir, cached, extra=("--state-dir", str(state)))
        c = d.consume(0, "--json", "--dump", str(self.dir / "cached0"), "--hold-ms", "20")
        deadline = time.time() + 60
        while not [f for f in tier.glob("mmfeed-samples-*/*") if f.name.isdigit()]:
            self.assertLess(time.time(), deadline, d.log())
            time.sleep(0.02)
        folder = next(tier.glob("mmfeed-samples-*"))
        folder.rename(tier / "moved")
        folder.symlink_to(victims[0])
        time.sleep(0.3)
        tier.rename(self.dir / "tier-moved")
        tier.symlink_to(victims[1])
        time.sleep(0.3)
        state.rename(self.dir / "state-moved")
        state.symlink_to(victims[2])
        finish(c, timeout=180)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertSameBatches(want[0], dumped_batches(self.dir / "cached0"))
        for v in victims:
            self.assertEqual(list(v.iterdir()), [], f"nothing written into {v}")
        self.assertTrue((self.dir / "state-moved" / "cursors.json").exists(), "the cursors went on being saved")
        # At the start: a symlink is refused, naming it (--check for the config's folder).
        (self.dir / "p.yaml").write_text(cached)
        r = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertRegex(r.stderr, r"p\.yaml:5:\d+: cache\.disk\.dir \S+/tier is a symbolic link: refused")
        tier.unlink()
        r = subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket",
                            str(self.dir / "again.sock"), "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"--state-dir: {state} is a symbolic link: refused", r.stderr)
        for v in victims:
            self.assertEqual(list(v.iterdir()), [])

    def test_status_shows_the_fill_and_a_smaller_cache_gives_memory_back(self):
        # 48 KiB kept per sample: glibc gives a freed cache of rows that size back whole.
        text = config(image_cache=" cache: {max_bytes: 64M},", epochs=0, consumers=1, size=64)
        d = Daemon(self.dir, text)
        c = d.consume(0, "--batches", "1000000", "--hold-ms", "5")
        try:
            def image_cache():
                status = json.loads(d.ctl("status", "--json").stdout)
                return next(s["cache"] for s in status["profile"]["stages"] if s["name"] == "image")
            deadline = time.time() + 60
            while image_cache()["samples"] < SAMPLES:  # every sample kept, then epochs of hits
                self.assertLess(time.time(), deadline, d.log())
                time.sleep(0.2)
            while image_cache()["hits"] < SAMPLES:
                self.assertLess(time.time(), deadline, d.log())
                time.sleep(0.2)
            full = image_cache()
            self.assertEqual(full["bytes"], SAMPLES * kept_row(64))
            self.assertEqual(full["max_bytes"], 64 << 20)
            self.assertAlmostEqual(full["fill"], SAMPLES * kept_row(64) / (64 << 20))
            self.assertGreater(full["hit_rate"], 0.4)
            libs = subprocess.run(["ldd", f"{daemon_test.BIN}/mmfeedd"], capture_output=True, text=True).stdout
            def anon_kib():  # the daemon's private memory (its rings are shared memory)
                with open(f"/proc/{d.proc.pid}/status") as f:
                    return int(re.search(r"^RssAnon:\s+(\d+)", f.read(), re.M)[1])
            before = anon_kib()
            (self.dir / "p.yaml").write_text(text.replace("max_bytes: 64M", "max_bytes: 1M"))
            r = d.ctl("reload")
            self.assertEqual(r.returncode, 0, r.stderr + d.log())
            self.assertIn("cache", r.stdout + d.log())
            time.sleep(1)
            small = image_cache()
            self.assertLessEqual(small["bytes"], 1 << 20)
            # Under AddressSanitizer freed memory sits in its quarantine: RSS says nothing there.
            if "libasan" not in libs:
                self.assertLess(anon_kib(), before - SAMPLES * kept_row(64) // 1024 // 2,
                                "the old cache's memory went back to the system")
        finally:
            c.kill()
            c.communicate()

    def test_a_cache_that_cannot_work_is_refused_naming_the_line(self):
        def check(text):
            (self.dir / "p.yaml").write_text(text)
            return subprocess.run([f"{daemon_test.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")],
                                  capture_output=True, text=True)
        p = check(config(image_cache=" cache: {max_bytes: 1G},", crop="random_resized_crop",
                         image_params=", dct_scaling: on"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertRegex(p.stderr, r"p\.yaml:5:\d+: stage 'image' \(image\) cannot be cached: crop: random_resized_crop "
                                   r"draws a new crop every epoch; with dct_scaling: auto or off, a cache keeps")
        p = check(config(text_cache=" cache: {},"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertRegex(p.stderr, r"p\.yaml:8:\d+: stage 'text': cache needs max_bytes .* or a top-level cache_budget")
        p = check(config(text_cache=" cache: {max_bytes: 2G},", extra="cache_budget: 1G\n"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("cache_budget 1073741824 is less than the stages' own cache max_bytes", p.stderr)
        p = check(config(text_cache=" cache: {max_bytes: 64T},"))
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("the stages' caches up to 65536.00 GiB", p.stderr)
        self.assertIn("cache_budget", p.stderr)
        p = check(config(text_cache=" cache: {max_bytes: 16M},", image_cache=" cache: {},", extra="cache_budget: 48M\n"))
        self.assertEqual(p.returncode, 0, p.stderr)
        p = check(config(image_cache=" cache: {max_bytes: 1G, disk: {dir: tier}},"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertRegex(p.stderr, r"p\.yaml:5:\d+: cache\.disk needs a 'dir' .* and 'max_bytes'")
        (self.dir / "afile").write_text("")
        p = check(config(image_cache=" cache: {max_bytes: 1G, disk: {dir: afile/tier, max_bytes: 1G}},"))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertRegex(p.stderr, r"p\.yaml:5:\d+: cache\.disk\.dir \S*/afile/tier: \S*/afile is not a folder")
        p = check(config(image_cache=" cache: {max_bytes: 1G, disk: {dir: tier, max_bytes: 1G}},"))
        self.assertEqual(p.returncode, 0, p.stderr)


if __name__ == "__main__":
    daemon_test.main()
