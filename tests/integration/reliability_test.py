#!/usr/bin/env python3
"""Reliability, round 3: the stream position through reloads, restarts and forged input, one
test per finding of the hostile round (the randomized sequences are stateful_test.py's). Real
mmfeedd, mmfeedctl and mmfeed-consume processes on real shared memory.

usage: reliability_test.py --bin BUILD/bin
"""
import json, os, pathlib, re, signal, socket, subprocess, sys, time, urllib.error, urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import daemon_test as dt  # noqa: E402
import contracts_test as ct  # noqa: E402
import reload_test  # noqa: E402
from reload_test import ReloadCase, config  # noqa: E402


def by_epoch(dumps):
    """{epoch: [ids]} over the batches of every dump folder, each seq counted once per folder
    set (a batch delivered again after a kill is the same batch)."""
    seen, out = {}, {}
    for dump in dumps:
        for meta, _ in dt.dumped_batches(dump):
            key = (dump.name.split("_")[0], meta["seq"])
            if key in seen:
                assert seen[key] == meta["ids"], f"{key} delivered twice with different ids"
                continue
            seen[key] = meta["ids"]
            out.setdefault(meta["epoch"], []).extend(meta["ids"])
    return out


class PositionTest(ReloadCase):
    reload_at_boundary = reload_test.ReloadTest.reload_at_boundary

    def assert_exact_epochs(self, epochs, n_epochs, samples=1200):
        for e in range(n_epochs):
            ids = epochs.get(e, [])
            self.assertEqual(len(ids), len(set(ids)), f"epoch {e}: ids delivered twice")
            self.assertEqual(len(ids), samples, f"epoch {e}: ids missing")

    def test_a_reload_after_a_renumbering_keeps_the_new_numbering(self):
        """batch_size 16 -> 24 (the batches per epoch change at epoch 1), then a workers-only
        reload: the second pipeline numbers from the first one's origin, not from seq 0."""
        a, b = config(epochs=3), config(epochs=3, batch=24)
        want_a, want_b = self.reference(a, "ref_a"), self.reference(b, "ref_b")
        per_a, per_b = len(want_a[0]) // 3, len(want_b[0]) // 3
        d, cs = self.start_slow(a, hold_ms=15)
        self.wait_batches(3)
        self.reload_at_boundary(d, b)
        for rank in (0, 1):
            self.wait_batches(per_a + 3, rank, timeout=120)
        (self.dir / "c.yaml").write_text(config(epochs=3, batch=24, workers=1))
        r = d.ctl("reload", "--config", str(self.dir / "c.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["applied"], "now")
        got = self.finish_all(d, cs)
        for rank in (0, 1):
            self.assertEqual([m["ids"] for m, _ in got[rank]], want_a[rank][:per_a] + want_b[rank][per_b:])
            self.assertEqual([m["seq"] for m, _ in got[rank]], list(range(per_a + 2 * per_b)))

    def test_a_lagging_rank_switches_order_at_the_same_epoch_as_the_others(self):
        """Rank 0's trainer is stopped while rank 1 runs into epoch 1; a new seed then applies
        at the furthest rank's boundary (epoch 2) for both: every epoch is one order."""
        a, b = config(epochs=3), config(epochs=3, seed=2)
        want_a, want_b = self.reference(a, "ref_a"), self.reference(b, "ref_b")
        per = len(want_a[0]) // 3
        d = dt.Daemon(self.dir, a)
        cs = [d.consume(0, "--json", "--hold-ms", "5", "--dump", str(self.dir / "r0")),
              d.consume(1, "--json", "--hold-ms", "20", "--dump", str(self.dir / "r1"))]
        self.wait_batches(2, 0)
        cs[0].send_signal(signal.SIGSTOP)
        self.wait_batches(per + 3, 1, timeout=120)
        (self.dir / "b.yaml").write_text(b)
        r = d.ctl("reload", "--config", str(self.dir / "b.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        cs[0].send_signal(signal.SIGCONT)
        got = self.finish_all(d, cs)
        self.assertIn("ranks at batch 76 76", d.log())
        for rank in (0, 1):
            ids = [m["ids"] for m, _ in got[rank]]
            self.assertEqual(ids, want_a[rank][:2 * per] + want_b[rank][2 * per:], f"rank {rank}")
        self.assert_exact_epochs(by_epoch([self.dir / "r0", self.dir / "r1"]), 3)

    def test_a_restart_on_an_edited_config_continues_the_stream_the_trainers_are_in(self):
        """A new seed is reloaded, the daemon is killed before the epoch boundary and restarted
        on the edited file: epoch 0 ends in the old order, epochs 1-2 are the new one's."""
        a, b = config(epochs=3), config(epochs=3, seed=2)
        want_a, want_b = self.reference(a, "ref_a"), self.reference(b, "ref_b")
        per = len(want_a[0]) // 3
        state = self.dir / "state"
        d = dt.Daemon(self.dir, a, extra=("--state-dir", str(state)))
        cs = [d.consume(r, "--json", "--reconnect", "60", "--hold-ms", "30", "--cursor", str(self.dir / f"c{r}"),
                        "--dump", str(self.dir / f"r{r}")) for r in (0, 1)]
        self.wait_batches(3)
        (self.dir / "p.yaml").write_text(b)
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while "applied at the next epoch boundary" not in d.log():
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        saved = json.loads((state / "cursors.json").read_text())
        self.assertIn("seed: 1", saved["config"]["text"])
        d2 = dt.Daemon(self.dir, b, extra=("--state-dir", str(state)))
        got = self.finish_all(d2, cs)
        self.assertIn("continuing the stream with that config", d2.log())
        for rank in (0, 1):
            by_seq = {}
            for meta, _ in got[rank]:
                self.assertEqual(by_seq.setdefault(meta["seq"], meta["ids"]), meta["ids"])
            self.assertEqual(sorted(by_seq), list(range(3 * per)), f"rank {rank}: no gap")
            self.assertEqual([by_seq[k] for k in sorted(by_seq)], want_a[rank][:per] + want_b[rank][per:])


    def test_a_reload_after_a_restart_waits_for_trainers_past_the_saved_cursors(self):
        """The daemon is killed before its state caught up (it is written once a tick): rank
        1's trainer finished 8 batches, 4 of them in epoch 1, that the saved cursor does not
        know of. After the restart rank 1's ring (4 slots) fills up to the end of epoch 0, and
        a new seed is reloaded before that trainer is back: it must not switch at epoch 1 (that
        fed the trainer the rest of epoch 1 in the new order: ids twice in one epoch); the
        boundary is chosen once the trainer said where it is, at epoch 2. Found by
        stateful_test in CI (seed 3)."""
        a, b = config(epochs=3), config(epochs=3, seed=2)
        want_a, want_b = self.reference(a, "ref_a"), self.reference(b, "ref_b")
        per = len(want_a[0]) // 3
        state, cursors = self.dir / "state", [self.dir / "c0", self.dir / "c1"]
        d = dt.Daemon(self.dir, a, extra=("--state-dir", str(state)))

        def consume(daemon, rank, life, *args):
            return daemon.consume(rank, "--json", "--cursor", str(cursors[rank]), "--dump",
                                  str(self.dir / f"r{rank}_{life}"), *args)

        dt.finish(consume(d, 0, "a", "--batches", "2"))
        dt.finish(consume(d, 1, "a", "--batches", str(per - 4)))
        deadline = time.time() + 10
        while json.loads((state / "cursors.json").read_text())["ranks"][1]["seq"] != per - 4:
            self.assertLess(time.time(), deadline, "the state did not reach rank 1's cursor")
            time.sleep(0.02)
        lagging = (state / "cursors.json").read_bytes()
        dt.finish(consume(d, 1, "b", "--batches", "8"))  # seqs per-4..per+3, old order
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        (state / "cursors.json").write_bytes(lagging)  # the kill came before the next write

        d2 = dt.Daemon(self.dir, a, extra=("--state-dir", str(state)))
        self.assertIn(f"ranks at batch 2 {per - 4}", d2.log())
        deadline = time.time() + 10  # rank 1's ring filled up to the end of epoch 0
        while json.loads(d2.ctl("status", "--json").stdout)["consumers"][1]["published"] < 4:
            self.assertLess(time.time(), deadline, "rank 1's ring did not fill")
            time.sleep(0.02)
        (self.dir / "b.yaml").write_text(b)
        r = d2.ctl("reload", "--config", str(self.dir / "b.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("chosen once the trainers of rank(s) 0, 1 are back", json.loads(r.stdout)["applied"])
        # Rank 0 finishes epoch 0 before rank 1's trainer is back: with the boundary chosen at
        # the reload, the old pipeline would have ended there.
        dt.finish(consume(d2, 0, "b", "--batches", str(per - 2)))
        status = json.loads(d2.ctl("status", "--json").stdout)
        self.assertEqual(status["reloads"]["waiting_for_ranks"], "1")
        cs = [consume(d2, 0, "c", "--reconnect", "60"), consume(d2, 1, "c", "--reconnect", "60")]
        for c in cs:
            dt.finish(c, timeout=120)
        self.assertEqual(d2.wait(), 0, d2.log())
        self.assertIn("every rank's trainer is back after the restart", d2.log())
        for rank in (0, 1):
            by_seq = {}
            for dump in sorted(self.dir.glob(f"r{rank}_*")):
                for meta, _ in dt.dumped_batches(dump):
                    self.assertEqual(by_seq.setdefault(meta["seq"], meta["ids"]), meta["ids"])
            self.assertEqual(sorted(by_seq), list(range(3 * per)), f"rank {rank}: no gap")
            self.assertEqual([by_seq[k] for k in sorted(by_seq)], want_a[rank][:2 * per] + want_b[rank][2 * per:],
                             f"rank {rank}: epochs 0-1 in the old order, 2 in the new one")
        self.assert_exact_epochs(by_epoch(sorted(self.dir.glob("r[01]_*"))), 3)

    def test_a_restart_on_an_edited_config_whose_old_data_is_gone_starts_fresh(self):
        state = self.dir / "state"
        d = dt.Daemon(self.dir, config(epochs=1), extra=("--state-dir", str(state)))
        dt.finish(d.consume(0, "--batches", "3"))
        time.sleep(0.3)  # saved every 100 ms
        d.proc.kill()
        d.proc.wait()
        os.rename(self.dir / "manifest.jsonl", self.dir / "moved.jsonl")
        d2 = dt.Daemon(self.dir, config(epochs=1, path="moved.jsonl"), extra=("--state-dir", str(state)))
        self.assertIn("the saved stream cannot be continued", d2.log())
        got = [dt.finish(c) for c in [d2.consume(r, "--json") for r in (0, 1)]]
        self.assertEqual(d2.wait(), 0, d2.log())
        self.assertEqual(sum(g["samples"] for g in got), 1200)


class StateDirTest(dt.DaemonCase):
    """--state-dir is input like any other: refused with the reason, never followed or crashed on."""

    def start(self, state, **kw):
        ct.make_texts(self.dir, 100)
        (self.dir / "p.yaml").write_text(ct.CONFIG.format(consumers=2, slots=4, epochs=1))
        return subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket",
                               str(self.dir / "s.sock"), "--state-dir", str(state)], capture_output=True, text=True,
                              timeout=60, **kw)

    def saved_state(self):
        """A real state file: a run stopped after rank 0 took a few batches."""
        state = self.dir / "state"
        ct.make_texts(self.dir, 100)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=2, slots=4, epochs=1), extra=("--state-dir", str(state)))
        dt.finish(d.consume(0, "--batches", "3"))
        time.sleep(0.3)  # saved every 100 ms
        d.proc.kill()
        d.proc.wait()
        return state, json.loads((state / "cursors.json").read_text())

    def test_a_folder_named_cursors_json_is_refused_with_exit_2(self):
        state = self.dir / "state"
        (state / "cursors.json").mkdir(parents=True)
        r = self.start(state)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("cursors.json is not a regular file", r.stderr)

    def test_symlinks_in_the_state_dir_are_never_followed(self):
        state = self.dir / "state"
        state.mkdir()
        victim = self.dir / "victim"
        victim.write_text("precious\n")
        os.symlink(victim, state / "cursors.json.tmp")  # the temporary file's name until round 3
        ct.make_texts(self.dir, 100)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=1), extra=("--state-dir", str(state)))
        dt.finish(d.consume(0))
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual(victim.read_text(), "precious\n")
        self.assertTrue((state / "cursors.json").is_file() and not (state / "cursors.json").is_symlink())
        # A symlink as the state file itself is refused, not read.
        (state / "cursors.json").unlink()
        os.symlink(victim, state / "cursors.json")
        r = self.start(state)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("is a symbolic link", r.stderr)
        self.assertEqual(victim.read_text(), "precious\n")

    def test_forged_saved_cursors_are_refused_naming_the_rank(self):
        state, saved = self.saved_state()
        for seq, why in ((1_000_000, "past the end of the data"), (2**63, "past the end of the data"),
                         (2**64 - 1, "past the end of the data")):
            forged = dict(saved)
            forged["ranks"] = [dict(saved["ranks"][0]), {"epoch": 0, "batch": 0, "seq": seq}]
            (state / "cursors.json").write_text(json.dumps(forged))
            r = self.start(state)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("rank 1: cursor seq", r.stderr)
            self.assertIn(why, r.stderr)
        # A cursor whose epoch label disagrees with its seq.
        forged = dict(saved)
        forged["ranks"] = [{"epoch": 7, "batch": 0, "seq": saved["ranks"][0]["seq"]}, saved["ranks"][1]]
        (state / "cursors.json").write_text(json.dumps(forged))
        r = self.start(state)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("is not where seq", r.stderr)
        (state / "cursors.json").write_text("{not json")
        r = self.start(state)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("not valid JSON", r.stderr)


class AttachTest(dt.DaemonCase):
    config = ct.ContractsTest.config
    uninterrupted = ct.ContractsTest.uninterrupted

    def test_a_forged_resume_is_refused_and_moves_nothing(self):
        ct.make_texts(self.dir, 400)
        for epochs in (1, 0):
            with self.subTest(epochs=epochs):
                d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=2, slots=4, epochs=epochs))
                for seq in (2**64 - 1, 2**63, 10**15):
                    s, reply, fds = ct.raw_attach(d.socket, 0, {"seq": seq})
                    s.close()
                    self.assertFalse(reply["ok"], reply)
                    self.assertIn("resume refused", reply["error"])
                status = json.loads(d.ctl("status", "--json").stdout)
                self.assertEqual(status["consumers"][0]["acked"]["seq"], 0, "the rank's position is unchanged")
                # The honest trainer then gets the rank's stream from its start.
                c = d.consume(0, "--json", "--batches", "5", "--dump", str(self.dir / f"r{epochs}"))
                dt.finish(c)
                self.assertEqual(ct.seqs_of(self.dir / f"r{epochs}"), [0, 1, 2, 3, 4])
                d.proc.kill()
                d.proc.wait()

    def test_a_cursor_of_another_stream_is_refused(self):
        """A trainer's cursor names its stream: a daemon started fresh on another seed refuses it
        (it used to serve the cursor's seq of another order), the same config accepts it.
        (Python's resume=: PythonClientTest; cursors across reloads and restarts are accepted:
        stateful_test.py.)"""
        ct.make_texts(self.dir, 400)
        seed11 = ct.CONFIG.format(consumers=1, slots=4, epochs=3)
        seed12 = seed11.replace("seed: 11", "seed: 12")
        cursor = self.dir / "cursor.json"

        def attach(text, *extra):
            d = dt.Daemon(self.dir, text, extra=extra)
            c = d.consume(0, "--json", "--batches", "3", "--cursor", str(cursor), "--dump", str(self.dir / "dump"))
            out, err = c.communicate(timeout=60)
            d.proc.kill()
            d.proc.wait()
            return c.returncode, err

        self.assertEqual(attach(seed11)[0], 0)
        saved = json.loads(cursor.read_text())
        self.assertEqual(saved["seq"], 3)
        self.assertIn("stream", saved)
        rc, err = attach(seed12)
        self.assertNotEqual(rc, 0)
        self.assertIn("rank 0: resume refused: the cursor (batch 3) is of stream", err)
        self.assertIn("the cursor was saved in another run or with another config", err)
        self.assertEqual(json.loads(cursor.read_text()), saved, "the refused run moved nothing")
        self.assertEqual(attach(seed11)[0], 0)  # the same stream: batches 3-5
        self.assertEqual(json.loads(cursor.read_text())["seq"], 6)

    def test_a_half_closed_then_closed_connection_frees_the_rank(self):
        """The process lives on (it is this test) but closed its attach connection fully."""
        ct.make_texts(self.dir, 200)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=1))
        s, reply, fds = ct.raw_attach(d.socket, 0)
        self.assertTrue(reply["ok"], reply)
        s.shutdown(socket.SHUT_WR)
        time.sleep(0.3)
        s.close()
        for fd in fds:
            os.close(fd)
        deadline = time.time() + 10
        while "the rank is free" not in d.log():
            self.assertLess(time.time(), deadline, d.log())
            time.sleep(0.05)
        r = dt.finish(d.consume(0, "--json"))
        self.assertEqual(r["samples"], 200)

    def test_a_dead_scribblers_garbage_does_not_cut_off_the_next_trainer(self):
        """A trainer scribbles over its control area and dies at once: the next trainer of the
        rank resumes from the cursor and gets the rank's exact stream."""
        ct.make_texts(self.dir, 400)
        want = self.uninterrupted()
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=2, slots=4, epochs=1))
        other = d.consume(1, "--dump", str(self.dir / "r1"))
        cursor = self.dir / "c0"
        dt.finish(d.consume(0, "--batches", "5", "--cursor", str(cursor), "--dump", str(self.dir / "r0a")))
        scribbler = f"""
import json, mmap, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({d.socket!r})
s.sendall((json.dumps({{"cmd": "attach", "rank": 0, "resume": json.load(open({str(cursor)!r}))}}) + "\\n").encode())
msg, fds, _, _ = socket.recv_fds(s, 65536, 4)
assert json.loads(msg.decode().splitlines()[0])["ok"], msg
ctl = mmap.mmap(fds[1], 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
ctl[:] = b"\\x34" * 4096
os._exit(9)
"""
        p = subprocess.run([sys.executable, "-c", scribbler], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 9, p.stderr)
        dt.finish(d.consume(0, "--cursor", str(cursor), "--dump", str(self.dir / "r0b")))
        dt.finish(other)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual(ct.ids_of(self.dir / "r0a") + ct.ids_of(self.dir / "r0b"), want[0])
        self.assertEqual(ct.ids_of(self.dir / "r1"), want[1])
        # The scribbler itself may be cut off (when a tick reads its garbage before its death is
        # seen); the trainers before and after it never are.
        log = d.log()
        gens = re.findall(r"rank 0 attached \(pid \d+, generation (\d+)\)", log)
        cut = re.findall(r"cutting off pid \d+: the reader of generation (\d+)", log)
        self.assertTrue(set(cut) <= {gens[1]}, log)


class ExitTest(dt.DaemonCase):
    """What a new user or a script sees when something is wrong: the reason and exit 2."""

    def run_daemon(self, text, *extra, socket_path=None):
        (self.dir / "p.yaml").write_text(text)
        return subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket",
                               socket_path or str(self.dir / "s.sock"), *extra], capture_output=True, text=True,
                              timeout=120)

    def test_a_socket_path_too_long_is_a_clear_error(self):
        ct.make_texts(self.dir, 10)
        long_path = str(self.dir / ("x" * 150))
        r = self.run_daemon(ct.CONFIG.format(consumers=1, slots=4, epochs=1), socket_path=long_path)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("a unix socket path has 1 to 107 characters", r.stderr)

    def test_data_with_no_usable_sample_exits_2(self):
        with open(self.dir / "manifest.jsonl", "w") as m:
            for i in range(100):
                m.write(json.dumps({"id": f"b{i}", "text": {"path": f"missing/{i}.txt"}}) + "\n")
        (self.dir / "p.yaml").write_text(ct.CONFIG.format(consumers=1, slots=4, epochs=1))
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=1))
        c = d.consume(0)
        c.communicate(timeout=120)
        self.assertEqual(d.wait(120), 2, d.log())
        self.assertIn("no usable sample", d.log())

    def test_check_refuses_rings_that_cannot_fit(self):
        ct.make_texts(self.dir, 10)
        text = ct.CONFIG.format(consumers=8, slots=64, epochs=1).replace("max_len: 24", "max_len: 16000000")
        (self.dir / "p.yaml").write_text(text)
        r = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("the rings need", r.stderr)

    def test_an_unbindable_metrics_address_exits_2(self):
        ct.make_texts(self.dir, 10)
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = self.run_daemon(ct.CONFIG.format(consumers=1, slots=4, epochs=1) +
                            f'metrics: {{listen: "127.0.0.1:{port}"}}\n')
        taken.close()
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("cannot serve /metrics", r.stderr)

    def test_a_consumer_of_a_stopped_daemon_times_out_with_timeout(self):
        ct.make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=0))
        cursor = self.dir / "c0"
        c = d.consume(0, "--timeout", "1", "--cursor", str(cursor))
        while not cursor.exists():
            time.sleep(0.01)
        d.proc.send_signal(signal.SIGSTOP)
        try:
            _, err = c.communicate(timeout=60)
            self.assertEqual(c.returncode, 1, err)
            self.assertIn("no batch within", err)
        finally:
            d.proc.send_signal(signal.SIGCONT)


class DrainTest(dt.DaemonCase):
    def test_a_stage_stuck_past_the_drain_timeout_does_not_hold_the_exit(self):
        """Every read takes 60 s and sample_timeout_s is 0: SIGTERM with --drain-timeout 1
        exits 3 (the drain timed out) within the bound, logging the timeout once."""
        (self.dir / "t").mkdir()
        with open(self.dir / "manifest.jsonl", "w") as m:
            for i in range(100):
                (self.dir / "t" / f"{i}.txt").write_text(f"caption {i}")
                m.write(json.dumps({"id": f"s{i}", "text": {"path": f"t/{i}.txt"}}) + "\n")
        text = ct.CONFIG.format(consumers=1, slots=4, epochs=0) + \
            "sample_timeout_s: 0\nfaults: {stage: text, read_delay_ms: 60000}\n"
        d = dt.Daemon(self.dir, text, extra=("--drain-timeout", "1", "--allow-faults"))
        time.sleep(0.5)  # the workers are inside their reads
        t0 = time.time()
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.wait(60), 3, d.log())
        self.assertLess(time.time() - t0, 30)
        self.assertEqual(d.log().count("drain timed out after"), 1)
        self.assertIn("exiting without them", d.log())


class SlowStorageTest(dt.DaemonCase):
    def test_a_reload_waiting_on_storage_does_not_freeze_the_control_plane(self):
        """The reloaded config's shards are on a server that accepts and never answers: status,
        a second reload and stop are answered meanwhile, and stop is not held by the reload."""
        import threading
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        held = []
        stop = threading.Event()

        def accept():
            while not stop.is_set():
                try:
                    held.append(silent.accept()[0])
                except OSError:
                    return
        threading.Thread(target=accept, daemon=True).start()
        ct.make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=1))
        c = d.consume(0, "--hold-ms", "50")
        port = silent.getsockname()[1]
        (self.dir / "remote.yaml").write_text(ct.CONFIG.format(consumers=1, slots=4, epochs=1).replace(
            "source: {type: manifest, path: manifest.jsonl,",
            f'source: {{type: webdataset, path: "http://127.0.0.1:{port}/s-{{000..001}}.tar", '
            "fields: {text: [txt]}, fetch_timeout_s: 60,"))
        first = subprocess.Popen([f"{dt.BIN}/mmfeedctl", "--socket", d.socket, "--timeout", "600", "reload",
                                  "--config", str(self.dir / "remote.yaml")], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 10
            while not held:
                self.assertLess(time.time(), deadline, "the reload did not reach the server")
                time.sleep(0.05)
            for _ in range(3):
                r = d.ctl("--timeout", "2", "status", "--json")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertTrue(all(x["attached"] for x in json.loads(r.stdout)["consumers"]))
            r = d.ctl("--timeout", "2", "reload")
            self.assertEqual(r.returncode, 1)
            self.assertIn("still building its pipeline", r.stderr)
            t0 = time.time()
            self.assertEqual(d.ctl("--timeout", "2", "stop").returncode, 0)
            self.assertEqual(d.wait(60), 0, d.log())
            self.assertLess(time.time() - t0, 40)
            self.assertIn("a reload was still building its pipeline: exiting without it", d.log())
        finally:
            stop.set()
            silent.close()
            first.kill()
            first.communicate()
            c.kill()
            c.communicate()
            for h in held:
                h.close()


class ControlSocketTest(dt.DaemonCase):
    def test_idle_connections_cannot_lock_out_status_attach_and_stop(self):
        ct.make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=0), extra=("--drain-timeout", "1"))
        idle = []
        for _ in range(300):  # more than the 256 the daemon keeps
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.socket)
            idle.append(s)
        r = d.ctl("--timeout", "10", "status", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        dt.finish(d.consume(0, "--batches", "3"))
        self.assertIn("closing the oldest idle one", d.log())
        for s in idle:
            s.close()
        self.assertEqual(d.ctl("stop").returncode, 0)
        self.assertIn(d.wait(), (0, 3))

    def test_clients_that_never_read_do_not_stall_the_control_thread(self):
        ct.make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=0))
        stuck = []
        for _ in range(100):  # each asks for far more replies than its socket buffer holds
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(d.socket)
            s.setblocking(False)
            try:
                s.send(b'{"cmd": "status"}\n' * 2000)
            except BlockingIOError:
                pass
            stuck.append(s)
        self.assertEqual(d.ctl("--timeout", "60", "status").returncode, 0)  # their first replies
        # Each of those used to stall the control thread up to a second once its buffer was full:
        # another client's status took seconds; it takes milliseconds when nothing blocks.
        for _ in range(5):
            r = d.ctl("--timeout", "1", "status", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
        dt.finish(d.consume(0, "--batches", "3"))
        for s in stuck:
            s.close()


class PythonClientTest(dt.DaemonCase):
    def python(self, code, **kw):
        env = dict(os.environ, PYTHONPATH=str(pathlib.Path(dt.BIN).parent / "python"))
        return subprocess.Popen(["/usr/bin/python3", "-c", code], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, **kw)

    def setUp(self):
        super().setUp()
        if not (pathlib.Path(dt.BIN).parent / "python" / "mmfeed").is_dir():
            self.skipTest("the Python module was not built (pybind11 missing)")

    def test_bad_resume_values_are_value_errors_and_a_forged_one_is_refused(self):
        ct.make_texts(self.dir, 100)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=0))
        code = f"""
import mmfeed
for resume in (-1, 2**64, "7", 1.5, {{"epoch": 0}}):
    try:
        mmfeed.Client({d.socket!r}, rank=0, resume=resume)
        print("accepted", resume)
    except ValueError as e:
        print("ValueError", e)
try:
    mmfeed.Client({d.socket!r}, rank=0, resume=2**64 - 1)
    print("accepted forged")
except RuntimeError as e:
    print("RuntimeError", e)
"""
        p = self.python(code)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out.count("ValueError"), 5, out)
        self.assertIn("RuntimeError", out)
        self.assertIn("resume refused", out)

    def test_a_cursor_dict_names_its_stream(self):
        ct.make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=3))
        code = f"""
import mmfeed
c = mmfeed.Client({d.socket!r}, rank=0)
cursor = [next(c) for _ in range(3)][-1].cursor
del c
for stream in (cursor["stream"], cursor["stream"] ^ 2):
    try:
        print("served", next(mmfeed.Client({d.socket!r}, rank=0, resume=dict(cursor, stream=stream))).seq)
    except mmfeed.AttachError as e:
        print("refused", e)
"""
        p = self.python(code)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        lines = out.splitlines()
        self.assertEqual(lines[0], "served 3")
        self.assertIn("refused attach rank 0: rank 0: resume refused: the cursor (batch 3) is of stream", lines[1])

    def test_a_trainer_holding_its_last_batch_crosses_an_order_changing_reload(self):
        """mmfeed.torch's dataset and to_device keep the last batch while they ask for the next:
        a reload of the seed (switching at the epoch boundary) must not wait for its release."""
        ct.make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=3))
        code = f"""
import sys, time, mmfeed
c = mmfeed.Client({d.socket!r}, rank=0, timeout_s=30)
held, seqs = None, []
for b in c:
    seqs.append(b.seq)
    if len(seqs) == 3:
        print("reload", flush=True)
        sys.stdin.readline()
    held = b.torch()  # the previous batch's tensors live on while next() waits
    time.sleep(0.01)
print(seqs == list(range(len(seqs))), len(seqs))
"""
        p = self.python(code, stdin=subprocess.PIPE)
        self.assertEqual(p.stdout.readline().strip(), "reload")
        (self.dir / "b.yaml").write_text(ct.CONFIG.format(consumers=1, slots=4, epochs=3).replace("seed: 11", "seed: 12"))
        r = d.ctl("reload", "--config", str(self.dir / "b.yaml"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("at the next epoch boundary", json.loads(r.stdout)["applied"])
        p.stdin.write("\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out.split(), ["True", "150"])
        self.assertEqual(d.wait(), 0, d.log())

    def test_ctrl_c_interrupts_a_blocking_next(self):
        ct.make_texts(self.dir, 100)
        d = dt.Daemon(self.dir, ct.CONFIG.format(consumers=1, slots=4, epochs=0))
        code = f"""
import mmfeed, sys
c = mmfeed.Client({d.socket!r}, rank=0)
batches = 0
try:
    while c.next() is not None:
        batches += 1
        print("batch", flush=True)
    print("end", flush=True)
except KeyboardInterrupt:
    print("interrupted after", batches, flush=True)
"""
        # Batches flow, then the daemon is stopped: next() waits until Ctrl-C.
        p = self.python(code)
        self.assertEqual(p.stdout.readline(), "batch\n")
        d.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(1.5)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=30)
        finally:
            d.proc.send_signal(signal.SIGCONT)
        self.assertIn("interrupted after", out, err)


class MetricsTest(dt.DaemonCase):
    def test_the_metrics_page_is_never_an_empty_200(self):
        ct.make_texts(self.dir, 100)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        text = ct.CONFIG.format(consumers=1, slots=4, epochs=0) + f'metrics: {{listen: "127.0.0.1:{port}"}}\n'
        (self.dir / "p.yaml").write_text(text)
        log = open(self.dir / "daemon.log", "w")
        proc = subprocess.Popen([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket",
                                 str(self.dir / "s.sock")], stdout=log, stderr=log)
        try:
            codes = []
            deadline = time.time() + 20
            while time.time() < deadline and len(codes) < 200:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        body = r.read()
                        self.assertGreater(len(body), 0, "an empty 200")
                        codes.append(r.status)
                except urllib.error.HTTPError as e:
                    self.assertEqual(e.code, 503)
                    codes.append(503)
                except urllib.error.URLError:
                    pass  # not listening yet
            self.assertIn(200, codes)
            # 100 clients trickling their request headers (slowloris) keep no scrape out.
            slow = []
            for _ in range(100):
                c = socket.create_connection(("127.0.0.1", port))
                c.send(b"GET /metrics HTTP/1.1\r\nX-a: ")
                slow.append(c)
            for _ in range(5):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
                    self.assertIn(b"mmfeed_rank_attached", r.read())
                for c in slow:
                    c.send(b"a")
            for c in slow:
                c.close()
        finally:
            proc.kill()
            proc.wait()
            log.close()


if __name__ == "__main__":
    dt.main()
