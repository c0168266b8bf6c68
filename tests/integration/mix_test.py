#!/usr/bin/env python3
"""Data mixtures (issue #30): `sources:` and `mix:` through the real mmfeedd and mmfeed-consume
processes. Two manifests with different keys (one mapped with `fields:`), weighted and epochs
mode, exact shares per epoch, smooth shares along each rank's stream, resumes after a killed
trainer and a killed daemon equal to an uninterrupted run, reloads of the weights, and the plan
--check prints.

usage: mix_test.py --bin BUILD/bin
"""
import collections, json, pathlib, signal, subprocess, sys, time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import daemon_test as dt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

CAPTIONS, QA = 300, 100


def mix_config(mix="{seed: 7, epochs: 2, samples_per_epoch: 800}", captions="weight: 3", qa="weight: 1",
               batch=10):
    return f"""pipeline: mix
sources:
  - {{name: captions, type: manifest, path: captions.jsonl, {captions}}}
  - {{name: qa, type: manifest, path: qa.jsonl, {qa}, fields: {{text: question}}}}
mix: {mix}
consumers: 2
stages:
  - {{name: text, type: text, field: text, params: {{tokenizer: bytes, max_len: 24}}}}
  - {{name: batch, type: batch, inputs: [text], params: {{batch_size: {batch}}}}}
output: {{ring_slots: 4}}
"""


class MixCase(dt.DaemonCase):
    def setUp(self):
        super().setUp()
        with open(self.dir / "captions.jsonl", "w") as f:
            for i in range(CAPTIONS):
                f.write(json.dumps({"id": f"c{i:04d}", "text": f"caption {i}"}) + "\n")
        with open(self.dir / "qa.jsonl", "w") as f:  # another schema: the text is `question`
            for i in range(QA):
                f.write(json.dumps({"id": f"q{i:04d}", "question": f"question {i}"}) + "\n")

    def run_all(self, config, name="r", extra=()):
        """Both ranks to the end of the data; per rank its batches (meta, folder) in order."""
        d = dt.Daemon(self.dir, config, extra=extra)
        cs = [d.consume(r, "--json", "--dump", str(self.dir / f"{name}{r}")) for r in (0, 1)]
        for c in cs:
            dt.finish(c)
        self.assertEqual(d.wait(), 0, d.log())
        return [dt.dumped_batches(self.dir / f"{name}{r}") for r in (0, 1)], d

    def reload_while_running(self, first, then):
        """Runs `first` with two slow trainers, reloads `then` (a change of the mixture: at the
        next epoch boundary) and runs to the end; the ids delivered, by epoch."""
        d = dt.Daemon(self.dir, first)
        cs = [d.consume(r, "--json", "--hold-ms", "5", "--dump", str(self.dir / f"r{r}")) for r in (0, 1)]
        (self.dir / "b.yaml").write_text(then)
        r = d.ctl("reload", "--config", str(self.dir / "b.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        reply = json.loads(r.stdout)
        self.assertIn("sources", reply["changes"]["settings"])
        self.assertTrue(reply["applied"].startswith("at the next epoch boundary"), reply["applied"])
        for c in cs:
            dt.finish(c)
        self.assertEqual(d.wait(), 0, d.log())
        by_epoch = collections.defaultdict(list)
        for rank in (0, 1):
            for meta, _ in dt.dumped_batches(self.dir / f"r{rank}"):
                by_epoch[meta["epoch"]].extend(meta["ids"])
        return by_epoch

    def check_resumes(self, config):
        """Runs `config` whole, then again with a trainer killed at batch 13 and the daemon killed
        after rank 1's batch 21, both resumed from their cursors and --state-dir: every rank's
        batches equal the uninterrupted run's."""
        want, _ = self.run_all(config, "ref")
        state = self.dir / "state"
        d = dt.Daemon(self.dir, config, extra=("--state-dir", str(state)))
        args = lambda r, life: ("--json", "--cursor", str(self.dir / f"c{r}"), "--reconnect", "60", "--dump",
                                str(self.dir / f"r{r}_{life}"))
        d.consume(0, *args(0, "a"), "--abort-after", "13").wait(timeout=60)  # dies holding batch 13
        dt.finish(d.consume(1, *args(1, "a"), "--batches", "21"))
        time.sleep(0.3)  # the state is written every 100 ms
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        d2 = dt.Daemon(self.dir, config, extra=("--state-dir", str(state)))
        cs = [d2.consume(r, *args(r, "b")) for r in (0, 1)]
        for c in cs:
            dt.finish(c)
        self.assertEqual(d2.wait(), 0, d2.log())
        for r in (0, 1):
            by_seq = {}
            for dump in sorted(self.dir.glob(f"r{r}_*")):
                for meta, _ in dt.dumped_batches(dump):
                    self.assertEqual(by_seq.setdefault(meta["seq"], meta["ids"]), meta["ids"])
            self.assertEqual([by_seq[k] for k in sorted(by_seq)], [m["ids"] for m, _ in want[r]], f"rank {r}")

    def check_rows(self, batches):
        """Every row's text is its own id's: captions from `text`, questions from `question`."""
        for meta, path in batches:
            text, lengths = np.load(path / "text.npy"), np.load(path / "text_lengths.npy")
            for k, sid in enumerate(meta["ids"]):
                want = f"caption {int(sid[1:])}" if sid[0] == "c" else f"question {int(sid[1:])}"
                self.assertEqual(bytes(text[k, :lengths[k]].astype(np.uint8)).decode(), want, sid)


class WeightedTest(MixCase):
    def test_each_epoch_deals_each_source_its_share_exactly_and_smoothly(self):
        got, d = self.run_all(mix_config())
        self.assertIn("captions: 300 samples, 75.00% of the stream, 600 draws an epoch (2 passes)", d.log())
        self.assertIn("sources: captions 1200 (75%, planned 75%, 0 failed); qa 400 (25%, planned 25%, 0 failed)",
                      d.log())
        for e in (0, 1):
            ids = [i for rank in got for meta, _ in rank if meta["epoch"] == e for i in meta["ids"]]
            counts = collections.Counter(ids)
            self.assertEqual(len(ids), 800, f"epoch {e}")
            # 600 captions = every caption twice (two passes), 200 questions = each twice
            self.assertEqual(set(counts.values()), {2}, f"epoch {e}: each sample once a pass")
            self.assertEqual(sum(1 for i in counts if i[0] == "c"), CAPTIONS)
            self.assertEqual(sum(1 for i in counts if i[0] == "q"), QA)
        for rank in got:
            self.check_rows(rank)
            stream = [i for meta, _ in rank for i in meta["ids"]]
            for start in range(0, len(stream) - 100):  # every window of 100 of the rank's stream
                window = stream[start:start + 100]
                self.assertLessEqual(abs(sum(1 for i in window if i[0] == "q") - 25), 2, f"window at {start}")

    def test_a_killed_trainer_and_a_killed_daemon_resume_to_the_uninterrupted_stream(self):
        self.check_resumes(mix_config())

    def test_a_reload_of_the_weights_switches_at_the_next_epoch_boundary(self):
        by_epoch = self.reload_while_running(mix_config(), mix_config(captions="weight: 1", qa="weight: 1"))
        shares = {e: sum(1 for i in ids if i[0] == "q") / len(ids) for e, ids in by_epoch.items()}
        self.assertEqual(shares[0], 0.25, "epoch 0 in the old weights")
        self.assertEqual(shares[max(shares)], 0.5, "the last epoch in the new ones")
        for e, share in shares.items():
            self.assertIn(share, (0.25, 0.5), f"epoch {e} is one mixture or the other")


    def test_token_budget_batches_deal_the_same_mixture(self):
        config = mix_config().replace("batch_size: 10}", "batch_size: 16, max_tokens: 120}")
        got, d = self.run_all(config)
        self.assertIn("within max_tokens 120", d.log())
        for e in (0, 1):
            ids = [i for rank in got for meta, _ in rank if meta["epoch"] == e for i in meta["ids"]]
            self.assertEqual(collections.Counter(i[0] for i in ids), {"c": 600, "q": 200}, f"epoch {e}")
        for rank in got:
            self.check_rows(rank)
            for meta, path in rank:
                self.assertLessEqual(int(np.load(path / "text_lengths.npy").sum()), 120)


    def test_status_and_metrics_count_each_sources_samples(self):
        import service_test
        BrokenSourceTest.break_questions(self, set(range(0, QA, 5)))  # 20 name missing files
        port = service_test.free_port()
        config = mix_config(mix="{seed: 7, epochs: 0, samples_per_epoch: 800}") + \
            f'metrics: {{listen: "127.0.0.1:{port}"}}\n'
        d = dt.Daemon(self.dir, config)
        for r in (0, 1):
            dt.finish(d.consume(r, "--batches", "40"))  # epoch 0 of each rank
        deadline = time.time() + 10
        while True:  # the rings fill behind the trainers: at least 80 batches are committed
            status = json.loads(d.ctl("status", "--json").stdout)
            got = {s["name"]: s for s in status["sources"]}
            if sum(s["samples"] for s in got.values()) >= 800 or time.time() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual([s["name"] for s in status["sources"]], ["captions", "qa"])
        self.assertEqual([got["captions"]["index"], got["qa"]["index"]], [0, 1], "batch['source'] values")
        self.assertEqual(got["captions"]["planned_share"], 0.75)
        self.assertEqual((got["captions"]["errors"], got["captions"]["errors_by_reason"]), (0, {}))
        self.assertGreater(got["qa"]["errors"], 0)
        self.assertEqual(got["qa"]["errors_by_reason"], {"not_found": got["qa"]["errors"]})
        self.assertAlmostEqual(got["captions"]["passes"], got["captions"]["samples"] / CAPTIONS)
        total = got["captions"]["samples"] + got["qa"]["samples"]
        self.assertGreaterEqual(total, 800)
        self.assertLessEqual(abs(got["qa"]["samples"] - total / 4), 4, got)
        deadline = time.time() + 10
        while True:  # the page is rendered every 500 ms
            page = service_test.scrape(port)[2]
            if 'mmfeed_source_errors_by_reason_total{reason=' in page or time.time() > deadline:
                break
            time.sleep(0.1)
        self.assertIn('mmfeed_source_samples_total{source="captions"}', page)
        self.assertIn('mmfeed_source_errors_total{source="captions"} 0', page)
        self.assertRegex(page, r'mmfeed_source_errors_by_reason_total\{reason="not_found",source="qa"\} [1-9]')
        self.assertRegex(page, r'mmfeed_source_passes\{source="captions"\} [1-9]')
        d.proc.send_signal(signal.SIGTERM)
        d.wait()


class WeightsAtBatchTest(MixCase):
    """`mmfeedctl reload --at batch` with only the weights changed: every rank switches at one
    batch boundary, each source going on from where it stood, exactly through kills."""

    def switched_run(self, name, state=None, kill=False):
        """Both ranks take 20 batches and leave (the rings then hold batches 20-23, so the
        switch is at batch 24), the weights go from 3:1 to 1:1 at a batch boundary, and the
        ranks run to the end; with `kill`, trainer 0 dies holding batch 33 and the daemon is
        SIGKILLed after rank 1's batch 40, then both resume from --state-dir and their cursors.
        Per rank, the ids of each batch by seq."""
        extra = ("--state-dir", str(state)) if state else ()
        d = dt.Daemon(self.dir, mix_config(), extra=extra)
        cursor = lambda r: ("--json", "--cursor", str(self.dir / f"{name}c{r}"), "--reconnect", "60")
        dump = lambda r, life: ("--dump", str(self.dir / f"{name}{r}_{life}"))
        for c in [d.consume(r, *cursor(r), *dump(r, "a"), "--batches", "20") for r in (0, 1)]:
            dt.finish(c)
        deadline = time.time() + 20
        while [c["published"] for c in json.loads(d.ctl("status", "--json").stdout)["consumers"]] != [24, 24]:
            self.assertLess(time.time(), deadline, "the rings did not fill")
            time.sleep(0.05)
        # More than weights (another seed) is refused and changes nothing.
        (self.dir / "p.yaml").write_text(mix_config(mix="{seed: 8, epochs: 2, samples_per_epoch: 800}"))
        r = d.ctl("reload", "--at", "batch")
        self.assertEqual(r.returncode, 1)
        self.assertIn("reload at a batch boundary refused: it changes more than a weighted mixture's weights",
                      r.stderr)
        (self.dir / "p.yaml").write_text(mix_config(captions="weight: 1", qa="weight: 1"))
        r = d.ctl("reload", "--at", "batch", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(json.loads(r.stdout)["applied"].startswith("at the next batch boundary"), r.stdout)
        if not kill:
            for c in [d.consume(r, *cursor(r), *dump(r, "b")) for r in (0, 1)]:
                dt.finish(c)
            self.assertEqual(d.wait(), 0, d.log())
        else:
            d.consume(0, *cursor(0), *dump(0, "b"), "--abort-after", "13").wait(timeout=60)
            dt.finish(d.consume(1, *cursor(1), *dump(1, "b"), "--batches", "21"))
            time.sleep(0.3)  # the state is written every 100 ms
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            saved = json.loads((state / "cursors.json").read_text())
            self.assertEqual(saved["mix_switches"], [{"epoch": 0, "position": 240, "weights": [3.0, 1.0]}])
            d = dt.Daemon(self.dir, (self.dir / "p.yaml").read_text(), extra=extra)
            for c in [d.consume(r, *cursor(r), *dump(r, "c")) for r in (0, 1)]:
                dt.finish(c)
            self.assertEqual(d.wait(), 0, d.log())
            self.assertIn("continuing from the saved cursors", d.log())
        self.assertIn("weights before position 240 of epoch 0: 3:1", d.log())
        out = []
        for r in (0, 1):
            by_seq = {}
            for dump_dir in sorted(self.dir.glob(f"{name}{r}_*")):
                for meta, _ in dt.dumped_batches(dump_dir):
                    self.assertEqual(by_seq.setdefault(meta["seq"], meta["ids"]), meta["ids"], f"batch {meta['seq']}")
            self.assertEqual(sorted(by_seq), list(range(80)), f"rank {r}: every batch")
            out.append([by_seq[k] for k in range(80)])
        return out, d

    def test_a_reload_of_the_weights_at_a_batch_boundary_goes_on_exactly_through_kills(self):
        got, d = self.switched_run("s")
        self.assertIn("the mixture's weights change at batch 24 (epoch 0, position 240 of each rank)", d.log())
        before, _ = self.run_all(mix_config(), "old")
        for r in (0, 1):
            self.assertEqual(got[r][:24], [m["ids"] for m, _ in before[r][:24]], f"rank {r}: the old weights' stream")
            questions = lambda batches: sum(1 for b in batches for i in b if i[0] == "q")
            self.assertLessEqual(abs(questions(got[r][:24]) - 60), 2, "3:1 before the switch")
            self.assertLessEqual(abs(questions(got[r][24:40]) - 80), 2, "1:1 after it")
            self.assertEqual(questions(got[r][40:]), 200, "epoch 1: 1:1 exactly")
        # No sample repeats within a pass: in epoch 0 (520 caption draws of 300, 280 question
        # draws of 100) none is drawn more often than the passes the draws span.
        counts = collections.Counter(i for rank in got for b in rank[:40] for i in b)
        for source, size in (("c", CAPTIONS), ("q", QA)):
            drawn = sum(n for i, n in counts.items() if i[0] == source)
            self.assertEqual(max(n for i, n in counts.items() if i[0] == source), -(-drawn // size), source)
        killed, _ = self.switched_run("k", state=self.dir / "state", kill=True)
        self.assertEqual(killed, got, "a killed trainer and daemon resume to the same stream")
        # A forged list of switches is refused, naming it.
        saved = json.loads((self.dir / "state" / "cursors.json").read_text())
        saved["mix_switches"] = [{"epoch": 0, "position": 240, "weights": "3:1"}]
        (self.dir / "state" / "cursors.json").write_text(json.dumps(saved))
        r = subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket",
                            str(self.dir / "x.sock"), "--state-dir", str(self.dir / "state")],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn('mix_switches[0] is not {"epoch", "position", "weights"}', r.stderr)


    def test_a_switch_after_a_renumbering_reload_is_where_the_new_numbering_puts_it(self):
        """batch_size 10 -> 20 at the end of epoch 0 (seq 40: the new numbering's origin), then
        the weights at batch 44: epoch 1's batch 4, position 80 of each rank."""
        d = dt.Daemon(self.dir, mix_config())
        cursor = lambda r, life: ("--json", "--cursor", str(self.dir / f"c{r}"), "--dump",
                                  str(self.dir / f"r{r}_{life}"))

        def take(n, published):
            for c in [d.consume(r, *cursor(r, published), "--batches", str(n)) for r in (0, 1)]:
                dt.finish(c)
            deadline = time.time() + 20
            while [c["published"] for c in json.loads(d.ctl("status", "--json").stdout)["consumers"]] != [published] * 2:
                self.assertLess(time.time(), deadline, "the rings did not fill")
                time.sleep(0.05)

        take(20, 24)
        (self.dir / "p.yaml").write_text(mix_config(batch=20))
        r = d.ctl("reload", "--json")
        self.assertTrue(json.loads(r.stdout)["applied"].startswith("at the next epoch boundary, for every rank"), r.stdout)
        take(20, 44)  # epoch 0's last batches: the swap, then epoch 1's first four batches of 20
        (self.dir / "p.yaml").write_text(mix_config(batch=20, captions="weight: 1", qa="weight: 1"))
        r = d.ctl("reload", "--at", "batch")
        self.assertEqual(r.returncode, 0, r.stderr)
        for c in [d.consume(r, *cursor(r, "end")) for r in (0, 1)]:
            dt.finish(c)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("the mixture's weights change at batch 44 (epoch 1, position 80 of each rank)", d.log())
        for r in (0, 1):
            batches = {m["seq"]: m for life in self.dir.glob(f"r{r}_*") for m, _ in dt.dumped_batches(life)}
            self.assertEqual(sorted(batches), list(range(60)), f"rank {r}")
            questions = lambda seqs: sum(1 for q in seqs for i in batches[q]["ids"] if i[0] == "q")
            self.assertEqual((batches[44]["epoch"], len(batches[44]["ids"])), (1, 20))
            self.assertLessEqual(abs(questions(range(40, 44)) - 20), 2, "3:1 before the switch")
            self.assertLessEqual(abs(questions(range(44, 60)) - 160), 2, "1:1 after it")


class SourceKindsTest(MixCase):
    def shares_per_epoch(self, got):
        out = []
        for e in (0, 1):
            ids = [i for rank in got for meta, _ in rank if meta["epoch"] == e for i in meta["ids"]]
            out.append(collections.Counter(ids))
        return out

    def test_an_indexed_manifest_and_local_tar_shards_mix_like_parsed_manifests(self):
        # the questions as two shards of 50, their text in .txt members
        dt.text_shards(self.dir, "qa", 2, 50, lambda i: f"q{i:04d}", lambda i: f"question {i}")
        config = mix_config(captions="weight: 3, index: on").replace(
            "{name: qa, type: manifest, path: qa.jsonl, weight: 1, fields: {text: question}}",
            '{name: qa, type: webdataset, path: "qa-{0..1}.tar", weight: 1, fields: {text: [txt]}}')
        got, d = self.run_all(config, extra=("--state-dir", str(self.dir / "state")))
        self.assertTrue(list((self.dir / "state" / "index").glob("captions.jsonl-*.mmfidx")), "captions indexed")
        for counts in self.shares_per_epoch(got):
            self.assertEqual(sum(n for i, n in counts.items() if i[0] == "c"), 600)
            self.assertEqual(sum(n for i, n in counts.items() if i[0] == "q"), 200)
            self.assertEqual(set(counts.values()), {2})
        for rank in got:
            self.check_rows(rank)

    def test_a_source_read_in_shard_windows_deals_each_window_whole_and_resumes_exactly(self):
        dt.text_shards(self.dir, "qa", 10, 10, lambda i: f"q{i:04d}", lambda i: f"question {i}")
        config = mix_config().replace(
            "{name: qa, type: manifest, path: qa.jsonl, weight: 1, fields: {text: question}}",
            '{name: qa, type: webdataset, path: "qa-{0..9}.tar", weight: 1, fields: {text: [txt]}, '
            'index: on, shuffle_window: 1}')
        got, d = self.run_all(config)
        self.assertIn("qa: 100 samples, 25.00% of the stream, 200 draws an epoch (2 passes)", d.log())
        self.assertIn("qa is read in windows of 1 shard(s) (shuffle_window), each node its own part of the shard "
                      "order\n", d.log())
        for counts in self.shares_per_epoch(got):
            self.assertEqual(sum(n for i, n in counts.items() if i[0] == "c"), 600)
            self.assertEqual(set(n for i, n in counts.items() if i[0] == "q"), {2}, "each question once a pass")
        # Rank r's c-th question of epoch e is draw e x 200 + 2c + r; each window of 10 draws is one
        # shard's 10 questions (a window of one shard), in another order each pass.
        windows = collections.defaultdict(list)
        for r, rank in enumerate(got):
            qs = collections.defaultdict(list)
            for meta, _ in rank:
                qs[meta["epoch"]].extend(i for i in meta["ids"] if i[0] == "q")
            for e, ids in qs.items():
                for c, sid in enumerate(ids):
                    windows[(e * 200 + 2 * c + r) // 10].append(int(sid[1:]))
        self.assertEqual(len(windows), 40)
        for w, members in windows.items():
            self.assertEqual(sorted(members), list(range(members[0] // 10 * 10, members[0] // 10 * 10 + 10)),
                             f"window {w}")
        self.assertNotEqual([windows[w] for w in range(10)], [windows[w] for w in range(10, 20)])
        for rank in got:
            self.check_rows(rank)
        self.check_resumes(config)

    def test_a_reload_from_one_source_to_a_mixture_switches_at_an_epoch_boundary(self):
        one = mix_config().split("sources:")[0] + (
            "source: {type: manifest, path: captions.jsonl, shuffle: true, seed: 7, epochs: 3}\n"
            + "consumers: 2" + mix_config().split("consumers: 2")[1])
        by_epoch = self.reload_while_running(one, mix_config(mix="{seed: 7, epochs: 3, samples_per_epoch: 800}"))
        self.assertEqual(sorted(by_epoch[0]), sorted(f"c{i:04d}" for i in range(CAPTIONS)), "epoch 0: one source")
        last = by_epoch[max(by_epoch)]
        self.assertEqual(collections.Counter(i[0] for i in last), {"c": 600, "q": 200}, "the last: the mixture")


class BrokenSourceTest(MixCase):
    def break_questions(self, broken):
        """Questions whose index is in `broken` name a file that does not exist."""
        with open(self.dir / "qa.jsonl", "w") as f:
            for i in range(QA):
                q = {"path": f"gone/{i}.txt"} if i in broken else f"question {i}"
                f.write(json.dumps({"id": f"q{i:04d}", "question": q}) + "\n")

    def test_failed_samples_are_refilled_from_their_own_source(self):
        self.break_questions(set(range(0, QA, 5)))  # 20 of the 100
        got, d = self.run_all(mix_config())
        for e in (0, 1):
            ids = [i for rank in got for meta, _ in rank if meta["epoch"] == e for i in meta["ids"]]
            self.assertEqual(collections.Counter(i[0] for i in ids), {"c": 600, "q": 200}, f"epoch {e}")
            self.assertFalse({i for i in ids if i[0] == "q" and int(i[1:]) % 5 == 0}, "no broken question")
        for rank in got:
            self.check_rows(rank)
        self.assertRegex(d.log(), r"qa 400 \(25%, planned 25%, [1-9]\d* failed\)")

    def test_an_entirely_broken_source_leaves_the_run_to_the_others(self):
        self.break_questions(set(range(QA)))
        got, d = self.run_all(mix_config())
        ids = [i for rank in got for meta, _ in rank for i in meta["ids"]]
        self.assertEqual(len(ids), 1600)
        self.assertEqual({i[0] for i in ids}, {"c"})
        self.assertIn("their rows refilled from their source or, failing that, the mix", d.log())
        self.assertRegex(d.log(), r"qa 0 \(0%, planned 25%, [1-9]\d* failed\)")


class EpochsModeTest(MixCase):
    def test_each_source_gives_repeat_times_its_samples_an_epoch(self):
        config = mix_config(mix="{mode: epochs, seed: 3, epochs: 2}", captions="repeat: 1", qa="repeat: 0.5")
        got, _ = self.run_all(config)
        seen_q = []
        for e in (0, 1):
            ids = [i for rank in got for meta, _ in rank if meta["epoch"] == e for i in meta["ids"]]
            self.assertEqual(sorted(i for i in ids if i[0] == "c"), [f"c{i:04d}" for i in range(CAPTIONS)])
            q = [i for i in ids if i[0] == "q"]
            self.assertEqual(len(q), QA // 2)
            self.assertEqual(len(set(q)), QA // 2)
            seen_q += q
        self.assertEqual(sorted(seen_q), [f"q{i:04d}" for i in range(QA)], "two half epochs cover the source once")


class QwenMixTest(dt.DaemonCase):
    def test_the_shipped_qwen_mix_config_deals_images_videos_and_text_only_chat(self):
        """configs/qwen3.5-vl-mix.yaml on 10 image, 4 video and 6 text-only samples (one pass
        each an epoch at 5:2:3): every sample once, each with its own modality's patches and
        vision tokens, none failed."""
        import subprocess
        sys.path.insert(0, str(ROOT / "scripts"))
        import make_photos
        photos = make_photos.make(self.dir, 5, 200, 400, seed=3)
        for k in range(2):
            subprocess.run(f"ffmpeg -v error -y -f lavfi -i testsrc2=size=192x144:rate=10 -t {2 + k} "
                           f"-c:v libx264 -pix_fmt yuv420p {self.dir / f'clip{k}.mp4'}", shell=True, check=True)
        lines = {
            "captions": [{"id": f"c{i}", "image": photos[i % 5]["name"], "video": [], "text": f"Describe {i}.",
                          "answer": f"Photo {i}."} for i in range(10)],
            # A modality a sample lacks: an empty list (captions' video) or no key at all.
            "video_qa": [{"id": f"v{i}", "clip": f"clip{i % 2}.mp4", "question": f"What moves {i}?",
                          "reply": "Colours."} for i in range(4)],
            "chat": [{"id": f"t{i}", "text": f"Say {i}.", "answer": f"{i}."} for i in range(6)],
        }
        for name, rows in lines.items():
            (self.dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        config = (ROOT / "configs" / "qwen3.5-vl-mix.yaml").read_text()
        for old, new in [("../tests/data/tokenizer/qwen3-tokenizer.json.gz",
                          str(ROOT / "tests" / "data" / "tokenizer" / "qwen3-tokenizer.json.gz")),
                         ("max_pixels: 1003520", "max_pixels: 262144"), ("max_pixels: 786432", "max_pixels: 262144")]:
            self.assertIn(old, config)
            config = config.replace(old, new)
        d = dt.Daemon(self.dir, config)
        dt.finish(d.consume(0, "--json", "--dump", str(self.dir / "dump")), timeout=300)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("sources: captions 10 (50%, planned 50%, 0 failed); video_qa 4 (20%, planned 20%, 0 failed); "
                      "chat 6 (30%, planned 30%, 0 failed)", d.log())
        seen = []
        for meta, path in dt.dumped_batches(self.dir / "dump"):
            # The grids have a row per image (video) in the batch, in the order of the rows.
            images, videos = np.load(path / "image_grid_thw.npy"), np.load(path / "video_grid_thw.npy")
            self.assertEqual(len(images), sum(1 for i in meta["ids"] if i[0] == "c"), meta["ids"])
            self.assertEqual(len(videos), sum(1 for i in meta["ids"] if i[0] == "v"), meta["ids"])
            ids, source = np.load(path / "input_ids.npy"), np.load(path / "source.npy")
            for k, sid in enumerate(meta["ids"]):
                seen.append(sid)
                self.assertEqual(int(source[k]), "cvt".index(sid[0]), sid)
                self.assertEqual(bool((ids[k] == 151655).any()), sid[0] == "c", f"{sid}: <|image_pad|>")
                self.assertEqual(bool((ids[k] == 151656).any()), sid[0] == "v", f"{sid}: <|video_pad|>")
        self.assertEqual(sorted(seen), sorted(r["id"] for rows in lines.values() for r in rows))


class ColumnsTest(MixCase):
    """What a trainer sees of the mixture in each batch: `source` (each row's index in
    `sources:`) and, for a source whose samples lack a field, zero rows and a 0 in
    `<stage>_present`."""

    IMAGE_MIX = """pipeline: image-mix
sources:
  - {name: photos, type: manifest, path: photos.jsonl, weight: 1}
  - {name: chat, type: manifest, path: chat.jsonl, weight: 1}
mix: {seed: 3, epochs: 1}
stages:
  - {name: image, type: image, field: image, params: {size: [32, 32]}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 16}}
  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: 5}}
output: {ring_slots: 3}
"""

    def test_each_row_names_its_source(self):
        got, _ = self.run_all(mix_config())
        rows = 0
        for rank in got:
            for meta, path in rank:
                source = np.load(path / "source.npy")
                self.assertEqual(source.dtype, np.int32)
                self.assertEqual(source.tolist(), [0 if i[0] == "c" else 1 for i in meta["ids"]], meta["ids"])
                self.assertEqual(np.load(path / "text_present.npy").tolist(), [1] * len(meta["ids"]))
                rows += len(meta["ids"])
        self.assertEqual(rows, 1600)

    def test_samples_without_a_field_get_zero_rows_and_a_present_mask(self):
        photos = dt.make_dataset(self.dir, 24)  # manifest.jsonl: image + text
        (self.dir / "manifest.jsonl").rename(self.dir / "photos.jsonl")
        with open(self.dir / "chat.jsonl", "w") as f:  # text only: no image key at all
            for i in range(24):
                f.write(json.dumps({"id": f"t{i:02d}", "text": f"say {i}"}) + "\n")
        d = dt.Daemon(self.dir, self.IMAGE_MIX)
        dt.finish(d.consume(0, "--json", "--dump", str(self.dir / "dump")))
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("chat lacks 'image' in 100% of 24 samples looked at", d.log())
        self.assertIn("0 failed); chat 24 (50%, planned 50%, 0 failed)", d.log())
        seen = []
        for meta, path in dt.dumped_batches(self.dir / "dump"):
            image, present = np.load(path / "image.npy"), np.load(path / "image_present.npy")
            source, text_present = np.load(path / "source.npy"), np.load(path / "text_present.npy")
            for k, sid in enumerate(meta["ids"]):
                seen.append(sid)
                photo = sid[0] == "s"
                self.assertEqual(int(present[k]), int(photo), sid)
                self.assertEqual(int(source[k]), 0 if photo else 1, sid)
                self.assertEqual(int(text_present[k]), 1, sid)
                # A photo's pixels; a text-only sample's image is zeros, whatever the slot held
                # (rows alternate between the sources, and 3 slots of 5 rows put each row of a
                # slot's next batch on the other source).
                self.assertEqual(bool(image[k].any()), photo, sid)
        self.assertEqual(sorted(seen), sorted(photos + [f"t{i:02d}" for i in range(24)]))

    def test_a_field_no_source_has_is_refused_naming_it(self):
        dt.make_dataset(self.dir, 8)
        (self.dir / "manifest.jsonl").rename(self.dir / "photos.jsonl")
        (self.dir / "chat.jsonl").write_text('{"id": "t0", "text": "hello"}\n')
        (self.dir / "p.yaml").write_text(self.IMAGE_MIX.replace("field: image", "field: picture"))
        import subprocess
        r = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("no source of the mixture has field 'picture'", r.stderr)


class CheckTest(MixCase):
    def check(self, config):
        (self.dir / "p.yaml").write_text(config)
        import subprocess
        return subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")], capture_output=True,
                              text=True)

    def test_check_prints_the_plan(self):
        r = self.check(mix_config())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("the mixture, per epoch:", r.stdout)
        self.assertIn("qa: 100 samples, 25.00% of the stream, 200 draws an epoch (2 passes)", r.stdout)
        self.assertIn("an epoch: 400 positions per rank x 2 rank(s)", r.stdout)

    def test_a_source_without_a_usable_sample_is_refused_by_name(self):
        (self.dir / "qa.jsonl").write_text('{"id": "x", "answer": "no question"}\n')
        r = self.check(mix_config())
        self.assertEqual(r.returncode, 2)
        self.assertIn("source 'qa'", r.stderr)
        self.assertIn("has no usable samples", r.stderr)

    def test_a_weight_too_small_for_the_epoch_is_refused_by_name(self):
        r = self.check(mix_config(qa="weight: 0.0001"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("mix: source 'qa' would never be drawn", r.stderr)


if __name__ == "__main__":
    dt.main()
