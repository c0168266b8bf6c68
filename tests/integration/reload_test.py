#!/usr/bin/env python3
"""Hot reload: the real mmfeedd reloading its config (mmfeedctl reload, SIGHUP) while real
mmfeed-consume trainers take batches. Every reloading run is compared with uninterrupted runs
of the configs on the same data.

usage: reload_test.py --bin BUILD/bin
"""
import json, os, pathlib, re, signal, subprocess, time

import numpy as np

import daemon_test
from daemon_test import CONFIG, Daemon, DaemonCase, dumped_batches, finish, make_dataset

SAMPLES = 1200  # 2 ranks x 600 samples: 38 batches of 16 per rank and epoch


def config(**kw):
    args = dict(source_type="manifest", path="manifest.jsonl", seed=1, epochs=1, consumers=2, workers=2,
                batch=16, placement="")
    args.update(kw)
    return CONFIG.format(**args)


def ids_of(batches):
    return [i for meta, _ in batches for i in meta["ids"]]


class ReloadCase(DaemonCase):
    def setUp(self):
        super().setUp()
        make_dataset(self.dir, SAMPLES)

    def reference(self, text, name, ranks=2):
        """Per rank, the batches' ids of an uninterrupted run of `text`."""
        run = self.dir / name
        run.mkdir()
        for f in ("manifest.jsonl",):
            os.link(self.dir / f, run / f)
        for p in self.dir.glob("*.jpg"):
            os.link(p, run / p.name)
        d = Daemon(run, text)
        cs = [d.consume(r, "--json", "--dump", str(run / f"r{r}")) for r in range(ranks)]
        for c in cs:
            finish(c)
        self.assertEqual(d.wait(), 0, d.log())
        return [[meta["ids"] for meta, _ in dumped_batches(run / f"r{r}")] for r in range(ranks)]

    def start_slow(self, text, hold_ms=40):
        """The daemon on `text` and two trainers that take a batch every `hold_ms`."""
        d = Daemon(self.dir, text)
        cs = [d.consume(r, "--json", "--hold-ms", str(hold_ms), "--dump", str(self.dir / f"r{r}")) for r in (0, 1)]
        return d, cs

    def wait_batches(self, n, rank=0, timeout=30):
        deadline = time.time() + timeout
        while len(list((self.dir / f"r{rank}").glob("*/meta.json"))) < n:
            self.assertLess(time.time(), deadline, f"rank {rank} did not get {n} batches")
            time.sleep(0.01)

    def finish_all(self, d, cs):
        for c in cs:
            finish(c, timeout=120)
        self.assertEqual(d.wait(), 0, d.log())
        return [dumped_batches(self.dir / f"r{r}") for r in range(len(cs))]

    def check_rows(self, batches, max_len):
        """No torn batch: every row's text belongs to its id, every tensor has the batch's rows."""
        for meta, path in batches:
            text, lengths = np.load(path / "text.npy"), np.load(path / "text_lengths.npy")
            self.assertEqual(text.shape, (len(meta["ids"]), max_len))
            for k, sid in enumerate(meta["ids"]):
                want = f"caption {int(sid[1:])}".encode()[:max_len]
                self.assertEqual(bytes(text[k, :lengths[k]].astype(np.uint8)), want, f"{path} row {k}")


class ReloadTest(ReloadCase):
    def test_workers_and_crop_size_change_under_traffic(self):
        want = self.reference(config(), "ref")
        d, cs = self.start_slow(config())
        self.wait_batches(4)
        new = config(workers=1).replace("size: [64, 64]", "size: [48, 48]")
        (self.dir / "new.yaml").write_text(new)
        r = d.ctl("reload", "--config", str(self.dir / "new.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr + d.log())
        reply = json.loads(r.stdout)
        self.assertEqual(reply["applied"], "now")
        self.assertEqual(reply["changes"]["workers"], [{"stage": "image", "from": 2, "to": 1}])
        self.assertEqual(reply["changes"]["stages_changed"], [{"stage": "image", "what": "params"}])
        got = self.finish_all(d, cs)
        self.assertIn("reload of", d.log())
        for rank in (0, 1):
            self.assertEqual([m["ids"] for m, _ in got[rank]], want[rank], f"rank {rank}")
            sizes = [np.load(p / "image.npy").shape[2] for _, p in got[rank]]
            self.assertEqual(sizes[0], 64)
            self.assertEqual(sizes[-1], 48, "the batches after the swap have the new crop")
            switch = sizes.index(48)
            self.assertEqual(sizes[switch:], [48] * (len(sizes) - switch), "one switch, never back")
            self.assertEqual(sizes[:switch], [64] * switch)
            self.check_rows(got[rank], 32)

    def test_a_bad_reload_during_traffic_changes_nothing(self):
        want = self.reference(config(), "ref")
        d, cs = self.start_slow(config())
        self.wait_batches(3)
        bad = config().replace("type: text,", "type: txet,")
        (self.dir / "bad.yaml").write_text(bad)
        r = d.ctl("reload", "--config", str(self.dir / "bad.yaml"))
        self.assertEqual(r.returncode, 1)
        self.assertRegex(r.stderr, r"bad\.yaml:\d+:\d+: unknown stage type 'txet'")
        # Parsed and valid, but a stage cannot be built: a missing tokenizer file.
        (self.dir / "bad2.yaml").write_text(config().replace("tokenizer: bytes", "tokenizer: missing.json"))
        r = d.ctl("reload", "--config", str(self.dir / "bad2.yaml"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("missing.json", r.stderr)
        # What the running rings cannot serve: told, not half-applied.
        (self.dir / "more.yaml").write_text(config().replace("ring_slots: 4", "ring_slots: 8"))
        r = d.ctl("reload", "--config", str(self.dir / "more.yaml"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("output.ring_slots 4 -> 8 changes the rings; restart the daemon", r.stderr)
        status = json.loads(d.ctl("status", "--json").stdout)
        self.assertEqual(status["reloads"], {"ok": 0, "failed": 3, "pending": False, "pending_at": "",
                                             "waiting_for_ranks": ""})
        got = self.finish_all(d, cs)
        self.assertIn("refused, the running pipeline is unchanged", d.log())
        for rank in (0, 1):
            self.assertEqual([m["ids"] for m, _ in got[rank]], want[rank])
            self.assertEqual({np.load(p / "image.npy").shape[2] for _, p in got[rank]}, {64})

    def test_a_larger_crop_moves_the_ranks_to_larger_rings(self):
        want = self.reference(config(), "ref")
        # Rank 0's trainer is attached at the reload; rank 1's only comes afterwards.
        d = Daemon(self.dir, config())
        c0 = d.consume(0, "--json", "--hold-ms", "40", "--dump", str(self.dir / "r0"))
        self.wait_batches(4)
        before = json.loads(d.ctl("status", "--json").stdout)["rings"]["bytes"]
        (self.dir / "big.yaml").write_text(config().replace("size: [64, 64]", "size: [96, 96]"))
        r = d.ctl("reload", "--config", str(self.dir / "big.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr + d.log())
        reply = json.loads(r.stdout)
        self.assertEqual(reply["applied"], "now")
        self.assertEqual(reply["rings"], "re-made larger; trainers attach to them by themselves")
        self.assertGreater(json.loads(d.ctl("status", "--json").stdout)["rings"]["bytes"], before)
        c1 = d.consume(1, "--json", "--dump", str(self.dir / "r1"))
        got = self.finish_all(d, [c0, c1])
        self.assertIn("moved to a new ring", d.log())
        sizes_of = {}
        for rank in (0, 1):
            self.assertEqual([m["ids"] for m, _ in got[rank]], want[rank], f"rank {rank}")
            sizes = [np.load(p / "image.npy").shape[2] for _, p in got[rank]]
            self.assertEqual(sizes[-1], 96)
            switch = sizes.index(96)
            self.assertEqual(sizes, [64] * switch + [96] * (len(sizes) - switch))
            self.check_rows(got[rank], 32)
            sizes_of[rank] = sizes
        self.assertGreater(sizes_of[0].index(96), 0, "rank 0 drained its old ring, then moved")
        self.assertGreater(sizes_of[1].index(96), 0,
                           "rank 1, attached after the move, was served its old ring's batches first")

    def test_the_reply_says_when_each_change_reaches_the_trainers(self):
        """Issue #60: a crop reload replied "applied now" while the trainer saw it 7 batches
        later; a reload of crop plus batch size waited for the epoch boundary without saying
        so; the rings were said to be "re-made larger" when they shrank."""
        d, cs = self.start_slow(config(epochs=2), hold_ms=30)
        self.wait_batches(4)
        (self.dir / "p.yaml").write_text(config(epochs=2).replace("max_len: 32", "max_len: 8"))
        r = d.ctl("reload", "--config", str(self.dir / "p.yaml"))
        self.assertEqual(r.returncode, 0, r.stderr + d.log())
        m = re.search(r"applied now; the first batch made with it is seq rank 0 (\d+) \(after (\d+) in its ring\), "
                      r"rank 1 (\d+)", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        first = [int(m.group(1)), int(m.group(3))]
        # Crop plus batch size: the whole reload waits for the epoch boundary, and says so; the
        # rings are re-made (160 sample ids need a larger header than the slots have) smaller
        # (160 rows of 8x8 float32 images: 130 kB a batch, against 16 rows of 64x64: 790 kB).
        both = config(epochs=2, batch=160).replace("max_len: 32", "max_len: 8").replace("size: [64, 64]", "size: [8, 8]")
        (self.dir / "b.yaml").write_text(both)
        r = d.ctl("reload", "--config", str(self.dir / "b.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr + d.log())
        reply = json.loads(r.stdout)
        self.assertTrue(reply["applied"].startswith("at the next epoch boundary"), reply)
        self.assertIn("from batch 0 of epoch 1, for every rank at once, because the batches per epoch or the "
                      "ranks change; the other changes (stages, workers) wait for that boundary too", reply["when"])
        self.assertEqual(reply["boundary"]["epoch"], 1)
        self.assertEqual(reply["rings"], "re-made smaller; trainers attach to them by themselves")
        self.assertLess(reply["ring_bytes"]["after"], reply["ring_bytes"]["before"])
        got = self.finish_all(d, cs)
        for rank in (0, 1):
            metas = [(meta, np.load(p / "text.npy").shape[1], np.load(p / "image.npy").shape[2]) for meta, p in got[rank]]
            # The first batch of max_len 8 is the one the reply named.
            self.assertEqual(next(meta["seq"] for meta, n, _ in metas if n == 8), first[rank], f"rank {rank}")
            # The crop changes with the first batch of epoch 1, not before.
            crops = [(meta["epoch"], size) for meta, _, size in metas]
            self.assertEqual({s for e, s in crops if e == 0}, {64})
            self.assertEqual({s for e, s in crops if e == 1}, {8})

    def test_sighup_reloads_a_new_max_len(self):
        want = self.reference(config(), "ref")
        d, cs = self.start_slow(config())
        self.wait_batches(4)
        (self.dir / "p.yaml").write_text(config().replace("max_len: 32", "max_len: 8"))
        d.proc.send_signal(signal.SIGHUP)
        got = self.finish_all(d, cs)
        self.assertIn("text: params; applied now", d.log())
        for rank in (0, 1):
            self.assertEqual([m["ids"] for m, _ in got[rank]], want[rank])
            lens = [np.load(p / "text.npy").shape[1] for _, p in got[rank]]
            switch = lens.index(8)
            self.assertGreater(switch, 0)
            self.check_rows(got[rank][:switch], 32)
            self.check_rows(got[rank][switch:], 8)

    def test_a_new_seed_takes_effect_at_the_next_epoch(self):
        a, b = config(epochs=2), config(epochs=2, seed=2)
        want_a, want_b = self.reference(a, "ref_a"), self.reference(b, "ref_b")
        d, cs = self.start_slow(a, hold_ms=25)
        self.wait_batches(3)
        (self.dir / "b.yaml").write_text(b)
        r = d.ctl("reload", "--config", str(self.dir / "b.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["applied"], "at the next epoch boundary")
        self.assertTrue(json.loads(d.ctl("status", "--json").stdout)["reloads"]["pending"])
        got = self.finish_all(d, cs)
        per_epoch = len(want_a[0]) // 2
        for rank in (0, 1):
            ids = [m["ids"] for m, _ in got[rank]]
            self.assertEqual(ids[:per_epoch], want_a[rank][:per_epoch], "epoch 0: the old seed")
            self.assertEqual(ids[per_epoch:], want_b[rank][per_epoch:], "epoch 1: the new seed")
            self.assertNotEqual(want_a[rank][per_epoch:], want_b[rank][per_epoch:])

    def test_a_new_batch_size_switches_every_rank_at_one_epoch_and_survives_a_restart(self):
        a, b = config(epochs=3), config(epochs=3, batch=24)
        want_a, want_b = self.reference(a, "ref_a"), self.reference(b, "ref_b")
        per_a, per_b = len(want_a[0]) // 3, len(want_b[0]) // 3  # 38 and 25 batches per epoch
        state = self.dir / "state"
        d = Daemon(self.dir, a, extra=("--state-dir", str(state)))
        # Rank 1's trainer is slower: rank 0 waits for it at the boundary.
        cs = [d.consume(r, "--json", "--reconnect", "60", "--hold-ms", str(hold), "--dump", str(self.dir / f"r{r}"))
              for r, hold in ((0, 10), (1, 30))]
        self.wait_batches(3)
        reply = self.reload_at_boundary(d, b)
        self.assertEqual(reply["rings"], "re-made larger; trainers attach to them by themselves")
        # Both ranks well into the new batch size's numbering, then the daemon is killed and
        # restarted on the new config: it goes on from the saved cursors.
        for rank in (0, 1):
            self.wait_batches(per_a + 4, rank, timeout=120)
        time.sleep(0.5)  # the acknowledged cursors are saved every 100 ms
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        saved = json.loads((state / "cursors.json").read_text())
        self.assertEqual({k: saved["origin"][k] for k in ("epoch", "batch", "seq")},
                         {"epoch": 1, "batch": 0, "seq": per_a}, saved)
        self.assertNotEqual(saved["origin"]["stream"], saved["origin"]["previous_stream"])  # a new stream tag
        (self.dir / "p.yaml").write_text(b)
        d2 = Daemon(self.dir, b, extra=("--state-dir", str(state)))
        for c in cs:
            finish(c, timeout=120)
        self.assertEqual(d2.wait(), 0, d2.log())
        self.assertIn("continuing from the saved cursors", d2.log())
        for rank in (0, 1):
            by_seq = {}
            for meta, path in dumped_batches(self.dir / f"r{rank}"):
                by_seq.setdefault(meta["seq"], (meta, path))  # a batch delivered again after the kill
            self.assertEqual(sorted(by_seq), list(range(per_a + 2 * per_b)), f"rank {rank}: no gap")
            metas = [by_seq[k][0] for k in sorted(by_seq)]
            self.assertEqual([m["ids"] for m in metas], want_a[rank][:per_a] + want_b[rank][per_b:],
                             f"rank {rank}: epoch 0 of the old batch size, then epochs 1-2 of the new")
            self.assertEqual([m["epoch"] for m in metas], [0] * per_a + [1] * per_b + [2] * per_b)
            self.check_rows([by_seq[k] for k in sorted(by_seq)], 32)

    def reload_at_boundary(self, d, text):
        """Reloads `text`, which must apply at the next epoch boundary for every rank at once."""
        (self.dir / "b.yaml").write_text(text)
        r = d.ctl("reload", "--config", str(self.dir / "b.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr + d.log())
        reply = json.loads(r.stdout)
        self.assertTrue(reply["applied"].startswith("at the next epoch boundary, for every rank at once"), reply)
        return reply

    def reload_at_epoch(self, d, text, ranks_note):
        reply = self.reload_at_boundary(d, text)
        self.assertTrue(reply["rings"].startswith(ranks_note), reply)
        self.assertEqual(reply["changes"]["settings"], ["consumers"])

    def test_a_token_budget_added_by_reload_switches_every_rank_at_one_epoch(self):
        """Fixed batches of 16, then a token budget of 120 (captions of 9-12 bytes: about 10
        samples a batch, the count planned per epoch): every rank switches at one boundary, to
        exactly the batches an uninterrupted budgeted run makes from that epoch on."""
        a, b = config(epochs=3), config(epochs=3, batch="16, max_tokens: 120")
        want_a = self.reference(a, "ref_a")
        self.reference(b, "ref_b")
        per_a = len(want_a[0]) // 3
        want_b = [[(m["epoch"], m["ids"]) for m, _ in dumped_batches(self.dir / "ref_b" / f"r{r}")] for r in (0, 1)]
        d, cs = self.start_slow(a, hold_ms=20)
        self.wait_batches(3)
        self.reload_at_boundary(d, b)
        got = self.finish_all(d, cs)
        for rank in (0, 1):
            tail = [ids for epoch, ids in want_b[rank] if epoch >= 1]
            self.assertEqual(len(tail), len([1 for epoch, _ in want_b[1 - rank] if epoch >= 1]),
                             "both ranks have as many budgeted batches")
            self.assertEqual([m["ids"] for m, _ in got[rank]], want_a[rank][:per_a] + tail, f"rank {rank}")
            self.assertEqual([m["seq"] for m, _ in got[rank]], list(range(per_a + len(tail))))
            for meta, path in got[rank][per_a:]:
                self.assertLessEqual(int(np.load(path / "text_lengths.npy").sum()), 120, meta)
            self.check_rows(got[rank], 32)

    def test_a_third_consumer_rank_joins_at_the_next_epoch(self):
        a, b = config(epochs=2), config(epochs=2, consumers=3)
        want_a, want_b = self.reference(a, "ref_a"), self.reference(b, "ref_b", ranks=3)
        per_a, per_b = len(want_a[0]) // 2, len(want_b[0]) // 2
        d, cs = self.start_slow(a, hold_ms=25)
        self.wait_batches(3)
        self.reload_at_epoch(d, b, "re-made for 3 consumer rank(s)")
        deadline = time.time() + 60
        while json.loads(d.ctl("status", "--json").stdout)["reloads"]["pending"]:
            self.assertLess(time.time(), deadline, d.log())
            time.sleep(0.05)
        cs.append(d.consume(2, "--json", "--dump", str(self.dir / "r2")))
        got = self.finish_all(d, cs)
        for rank in (0, 1, 2):
            ids = [m["ids"] for m, _ in got[rank]]
            self.assertEqual(ids, (want_a[rank][:per_a] if rank < 2 else []) + want_b[rank][per_b:], f"rank {rank}")
            first = per_a if rank == 2 else 0  # the new rank's numbering starts at the boundary too
            self.assertEqual([m["seq"] for m, _ in got[rank]], list(range(first, per_a + per_b)))

    def test_a_removed_consumer_rank_ends_at_the_next_epoch_and_loses_nothing(self):
        a, b = config(epochs=2), config(epochs=2, consumers=1)
        want_a, want_b = self.reference(a, "ref_a"), self.reference(b, "ref_b", ranks=1)
        per_a, per_b = len(want_a[0]) // 2, len(want_b[0]) // 2
        # Rank 1's trainer takes its time: the batches its ring holds at the switch are its own.
        d = Daemon(self.dir, a)
        cs = [d.consume(r, "--json", "--hold-ms", str(hold), "--dump", str(self.dir / f"r{r}"))
              for r, hold in ((0, 10), (1, 60))]
        self.wait_batches(3)
        self.reload_at_epoch(d, b, "re-made for 1 consumer rank(s)")
        got = self.finish_all(d, cs)
        self.assertEqual([m["ids"] for m, _ in got[0]], want_a[0][:per_a] + want_b[0][per_b:])
        self.assertEqual([m["ids"] for m, _ in got[1]], want_a[1][:per_a], "rank 1: its epoch 0, then the end")
        self.assertIn("rank 1 is no longer served", d.log())

    def test_ten_reloads_in_a_row_leak_no_threads_fds_or_memory(self):
        # Endless data and trainers that keep taking: the reloads all happen under traffic
        # however slow the machine (the ids across reloads are checked by the tests above).
        d = Daemon(self.dir, config(epochs=0), extra=("--drain-timeout", "1"))
        cs = [d.consume(r, "--hold-ms", "20", "--batches", "1000000") for r in (0, 1)]
        proc = pathlib.Path(f"/proc/{d.proc.pid}")

        def fd_targets():
            """The daemon's fds, less the sample files a worker has open at that instant."""
            targets = []
            for f in (proc / "fd").iterdir():
                try:
                    targets.append(os.readlink(f))
                except OSError:  # closed meanwhile
                    pass
            return sorted(t for t in targets if not t.endswith(".jpg"))

        def counts():
            rss = int([l for l in (proc / "status").read_text().splitlines() if l.startswith("VmRSS:")][0].split()[1])
            return len(list((proc / "task").iterdir())), len(fd_targets()), rss

        (self.dir / "v0.yaml").write_text(config(epochs=0, workers=1))
        (self.dir / "v1.yaml").write_text(config(epochs=0, workers=2))
        self.assertEqual(d.ctl("reload", "--config", str(self.dir / "v1.yaml")).returncode, 0)
        # Settled: every worker has taken an item (each thread opens its schedstat once) and
        # the control connections are closed.
        time.sleep(1)
        before, fds_before = counts(), fd_targets()
        for i in range(10):
            r = d.ctl("reload", "--config", str(self.dir / f"v{i % 2}.yaml"))
            self.assertEqual(r.returncode, 0, r.stderr)
        deadline = time.time() + 10  # threads and connections wind down on a loaded machine
        while time.time() < deadline:
            time.sleep(0.5)
            after = counts()
            if after[:2] == before[:2]:
                break
        self.assertEqual(after[0], before[0], "threads (the last config has the same workers)")
        self.assertEqual(after[1], before[1], f"fds: {fds_before} then {fd_targets()}")
        # Under AddressSanitizer freed memory sits in its quarantine, so RSS says nothing; there
        # LeakSanitizer checks the daemon's exit instead (the exit status below).
        libs = subprocess.run(["ldd", f"{daemon_test.BIN}/mmfeedd"], capture_output=True, text=True).stdout
        if "libasan" not in libs:
            self.assertLess(after[2] - before[2], 64 * 1024, f"RSS grew from {before[2]} to {after[2]} KiB")
        status = json.loads(d.ctl("status", "--json").stdout)
        self.assertEqual(status["reloads"]["ok"], 11)
        self.assertTrue(all(r["attached"] for r in status["consumers"]))
        for c in cs:
            self.assertIsNone(c.poll(), "the trainers went on through every reload")
            c.kill()
            c.communicate()
        d.proc.send_signal(signal.SIGTERM)
        self.assertIn(d.wait(), (0, 3))


if __name__ == "__main__":
    daemon_test.main()
