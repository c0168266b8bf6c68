#!/usr/bin/env python3
"""The Python client (import mmfeed) against the real daemon: exactness against
mmfeed-consume, leases that outlive the ring's turnover, resume from a checkpointed cursor
after a SIGKILL, reconnect across a daemon restart, errors, fork, and the torch dataset.

usage: python_client_test.py --bin BUILD/bin --python BUILD/python
"""
import argparse, json, os, pathlib, signal, subprocess, sys, textwrap, time, unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import contracts_test as contracts  # noqa: E402  (the same small text pipeline and data)
import daemon_test as dt  # noqa: E402

import numpy as np  # noqa: E402

mmfeed = None
PYDIR = None

CONFIG = contracts.CONFIG
make_texts = contracts.make_texts


def run_python(code, *args, timeout=60):
    env = dict(os.environ, PYTHONPATH=PYDIR)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def text_of(batch, row):
    t, n = batch["text"], batch["text_lengths"]
    return bytes(t[row, : n[row]].astype(np.uint8)).decode()


def side_by_side(d, ranks, take):
    """Python clients of `ranks` on daemon `d`, each taking a batch in turn (as trainers would)
    until every one reached the end; `take(rank, batch)` sees each batch. The clients are gone
    on return."""
    clients = {r: mmfeed.Client(socket=d.socket, rank=r) for r in ranks}
    while clients:
        for r in list(clients):
            b = clients[r].next(timeout_s=30)
            if b is None:
                del clients[r]
                continue
            with b:
                take(r, b)


class PythonClientTest(dt.DaemonCase):
    def config(self, consumers=2, slots=4, epochs=1):
        return CONFIG.format(consumers=consumers, slots=slots, epochs=epochs)

    def test_the_module_links_no_daemon_library(self):
        so = next(pathlib.Path(PYDIR, "mmfeed").glob("_mmfeed*.so"))
        libs = subprocess.run(["ldd", str(so)], capture_output=True, text=True, check=True).stdout
        for lib in ("yaml-cpp", "spdlog", "libnuma", "libavcodec", "opencv", "turbojpeg"):
            self.assertNotIn(lib, libs)

    def test_two_python_ranks_get_what_mmfeed_consume_gets(self):
        make_texts(self.dir, 300, bad_every=13)
        d = dt.Daemon(self.dir, self.config())
        procs = [d.consume(r, "--dump", str(self.dir / f"ref{r}")) for r in range(2)]
        for p in procs:
            dt.finish(p)
        self.assertEqual(d.wait(), 0)
        want = [[i for meta, _ in dt.dumped_batches(self.dir / f"ref{r}") for i in meta["ids"]] for r in range(2)]
        d = dt.Daemon(self.dir, self.config())
        got = [[], []]

        def take(r, b):
            for k, sid in enumerate(b.ids):
                self.assertEqual(text_of(b, k), f"caption {sid[1:]}")
            got[r].extend(b.ids)

        side_by_side(d, range(2), take)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual(got, want)
        every = got[0] + got[1]
        self.assertEqual(len(set(every)), len([i for i in range(300) if i % 13 != 12]), "every good sample")

    def test_python_ranks_of_a_group_get_the_same_tensors_from_one_ring(self):
        make_texts(self.dir, 200)
        d = dt.Daemon(self.dir, self.config(consumers="2\nreplicas: 2"))
        got = [[], []]
        # Side by side: the group's ring frees a slot once both ranks released it.
        side_by_side(d, range(2), lambda r, b: got[r].append(
            (b.ids, {k: b[k].copy() for k in ("text", "text_lengths")})))
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual(len(got[0]), 25)
        for (ids0, t0), (ids1, t1) in zip(*got):
            self.assertEqual(ids0, ids1)
            for k in t0:
                self.assertEqual(t0[k].tobytes(), t1[k].tobytes())
        self.assertEqual(len({i for ids, _ in got[0] for i in ids}), 200, "the node's one stream: every sample")

    def test_a_reload_that_grows_the_ring_is_followed_by_the_client(self):
        make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, self.config(consumers=1))
        dt.finish(d.consume(0, "--dump", str(self.dir / "ref")))
        self.assertEqual(d.wait(), 0)
        want = [meta["ids"] for meta, _ in dt.dumped_batches(self.dir / "ref")]
        d = dt.Daemon(self.dir, self.config(consumers=1))
        client = mmfeed.Client(socket=d.socket, rank=0)
        got, widths = [], []
        kept = None
        while True:
            b = client.next(timeout_s=30)
            if b is None:
                break
            if len(got) == 3:  # longer rows than the slots hold: the daemon makes larger rings
                kept = b  # a batch of the old ring, held across the move
                kept_text = np.array(b["text"])
                (self.dir / "long.yaml").write_text(self.config(consumers=1).replace("max_len: 24", "max_len: 1024"))
                r = d.ctl("reload", "--config", str(self.dir / "long.yaml"))
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("applied now", r.stdout)
            got.append(b.ids)
            widths.append(b["text"].shape[1])
            for k, sid in enumerate(b.ids):
                self.assertEqual(text_of(b, k), f"caption {sid[1:]}")
            if b is not kept:
                b.release()
            time.sleep(0.01)
        self.assertTrue(np.array_equal(np.array(kept["text"]), kept_text), "the old ring's batch kept its bytes")
        kept.release()
        del client
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("moved to a new ring", d.log())
        self.assertEqual(got, want)
        switch = widths.index(1024)
        self.assertGreater(switch, 3)
        self.assertEqual(widths, [24] * switch + [1024] * (len(widths) - switch))

    def test_an_array_kept_from_an_early_batch_keeps_its_bytes(self):
        make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, self.config(consumers=1, slots=2))
        c = mmfeed.Client(socket=d.socket, rank=0)
        first = next(c)
        kept = first["text"]
        copy = kept.copy()
        self.assertFalse(kept.flags.writeable)
        with self.assertRaises(ValueError):
            kept[0, 0] = 1
        with self.assertRaises(RuntimeError):  # a view is alive: the slot cannot be freed
            first.release()
        del first
        seen = 0
        for b in c:  # with 2 slots, one held by `kept`: the ring turns over on the other
            with b:
                seen += 1
            if seen == 30:
                break
        np.testing.assert_array_equal(kept, copy)
        del kept
        rest = sum(1 for _ in c)
        self.assertEqual(1 + seen + rest, 50)
        del c
        self.assertEqual(d.wait(), 0, d.log())

    def test_a_job_killed_between_checkpoints_resumes_exactly(self):
        make_texts(self.dir, 400, bad_every=11)
        d = dt.Daemon(self.dir, self.config(consumers=1))
        ref = mmfeed.Client(socket=d.socket, rank=0)
        want = [(b.seq, b.ids, b["text"].copy()) for b in ref]
        del ref
        self.assertEqual(d.wait(), 0)
        d = dt.Daemon(self.dir, self.config(consumers=1))
        job = """
            import json, pathlib, sys, time, mmfeed
            ckpt = pathlib.Path(sys.argv[2])
            resume = json.loads(ckpt.read_text()) if ckpt.exists() else None
            out = open(sys.argv[3], "a")
            for step, b in enumerate(mmfeed.Client(socket=sys.argv[1], rank=0, resume=resume)):
                out.write(json.dumps({"seq": b.seq, "ids": b.ids, "text": b["text"].tolist()}) + "\\n"); out.flush()
                if step % 4 == 3:  # checkpoint every 4 steps
                    tmp = ckpt.with_suffix(".tmp"); tmp.write_text(json.dumps(b.cursor)); tmp.rename(ckpt)
                time.sleep(0.02)
        """
        ckpt, log = self.dir / "ckpt.json", self.dir / "steps.jsonl"
        p = run_python(job, d.socket, str(ckpt), str(log))
        deadline = time.time() + 30
        while (not ckpt.exists() or json.loads(ckpt.read_text())["seq"] < 10) and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        at = json.loads(ckpt.read_text())["seq"]
        before = [json.loads(l) for l in log.read_text().splitlines()]
        log.write_text("")
        p = run_python(job, d.socket, str(ckpt), str(log))
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        after = [json.loads(l) for l in log.read_text().splitlines()]
        got = [b for b in before if b["seq"] < at] + after
        self.assertEqual([b["seq"] for b in got], [w[0] for w in want])
        for g, (seq, ids, text) in zip(got, want):
            self.assertEqual(g["ids"], ids)
            self.assertEqual(g["text"], text.tolist(), f"the bytes of batch {seq}")
        self.assertEqual(d.wait(), 0, d.log())

    def test_exceptions_raised_around_next_lose_no_batch(self):
        """Signals whose handlers raise (KeyboardInterrupt, TimeoutError, an exception of the
        trainer's own) and exceptions sent from another thread (PyThreadState_SetAsyncExc) land
        at random points of a loop over 9,000 batches; every seq arrives once, in order, and
        every sample with it (the binding once dropped the batch an exception met on its way
        back from next(): 34 of 100 batches arrived)."""
        make_texts(self.dir, 24000)
        d = dt.Daemon(self.dir, self.config(consumers=1, slots=8, epochs=3))
        job = """
            import ctypes, json, random, signal, sys, threading, time, mmfeed

            class Preempted(Exception): pass
            class FromThread(Exception): pass

            rng = random.Random(5)
            # armed: inside the try below. Handlers raise only then (a handler runs where the
            # interpreter checks for signals: after a call returns, at a loop's back edge).
            state = {"armed": False}
            raised = {}
            kinds = [KeyboardInterrupt, TimeoutError, Preempted]

            def handler(signum, frame):
                if state["armed"]:
                    state["armed"] = False
                    raise rng.choice(kinds)()
            signal.signal(signal.SIGALRM, handler)
            # Periodic (a handler that re-armed the timer could be cut short by the exception
            # from the other thread, which may land as the handler starts).
            signal.setitimer(signal.ITIMER_REAL, 0.001, 0.0007)

            main = threading.main_thread().ident
            stop = False
            def other_thread():
                set_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
                args = (ctypes.c_ulong(main), ctypes.py_object(FromThread))
                r = random.Random(7)
                while not stop:
                    time.sleep(r.uniform(0.0005, 0.006))
                    if state["armed"]:  # no check for exceptions between this and the call
                        set_exc(*args)
                        state["armed"] = False
            t = threading.Thread(target=other_thread, daemon=True)
            t.start()

            c = mmfeed.Client(socket=sys.argv[1], rank=0)
            got, ended = [], False
            while not ended:
                try:
                    state["armed"] = True
                    while True:
                        b = c.next(timeout_s=60)
                        if b is None:
                            ended = True
                            break
                        got.append((b.seq, b.ids))  # one call: an exception lands before or after it
                        state["armed"] = True
                    state["armed"] = False
                except (KeyboardInterrupt, TimeoutError, Preempted, FromThread) as e:
                    state["armed"] = False
                    raised[type(e).__name__] = raised.get(type(e).__name__, 0) + 1
            signal.setitimer(signal.ITIMER_REAL, 0)
            stop = True
            print(json.dumps({"seqs": [s for s, _ in got], "ids": [i for _, ids in got for i in ids],
                              "raised": raised}))
        """
        p = run_python(job, d.socket)
        out, err = p.communicate(timeout=240)
        self.assertEqual(p.returncode, 0, err)
        got = json.loads(out)
        self.assertEqual(got["seqs"], list(range(9000)), "every batch once, in order")
        self.assertEqual(sorted(int(i[1:]) for i in got["ids"]), sorted(list(range(24000)) * 3))
        for kind in ("KeyboardInterrupt", "TimeoutError", "Preempted", "FromThread"):
            self.assertGreater(got["raised"].get(kind, 0), 20, f"{kind} raised often enough: {got['raised']}")
        self.assertEqual(d.wait(), 0, d.log())

    def test_reconnect_across_a_daemon_restart(self):
        make_texts(self.dir, 400)
        state = self.dir / "state"
        d = dt.Daemon(self.dir, self.config(consumers=1), extra=("--state-dir", str(state)))
        job = """
            import json, sys, time, mmfeed
            for b in mmfeed.Client(socket=sys.argv[1], rank=0, reconnect_s=30):
                print(json.dumps([b.seq, b.ids]), flush=True)
                time.sleep(0.02)
        """
        p = run_python(job, d.socket)
        time.sleep(0.6)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        d2 = dt.Daemon(self.dir, self.config(consumers=1), extra=("--state-dir", str(state)))
        out, err = p.communicate(timeout=90)
        self.assertEqual(p.returncode, 0, err)
        seqs = [json.loads(l)[0] for l in out.splitlines()]
        self.assertEqual(seqs, list(range(50)), "no gap, no duplicate")
        self.assertEqual(d2.wait(), 0, d2.log())

    def test_without_a_socket_it_finds_a_daemon_started_by_hand(self):
        """mmfeedd's own default socket is /tmp/mmfeed.sock, the service's /run/mmfeed/mmfeed.sock:
        Client() with neither given nor $MMFEED_SOCKET set attaches to whichever exists."""
        if os.path.exists("/run/mmfeed/mmfeed.sock") or os.path.exists("/tmp/mmfeed.sock"):
            self.skipTest("a daemon's default socket is already there on this machine")
        lock = pathlib.Path("/tmp/mmfeed.sock.lock")  # a daemon's lock file outlives it
        if lock.exists() and lock.stat().st_uid != os.geteuid():
            self.skipTest(f"{lock} belongs to another user, whose daemon ran on the default socket")
        make_texts(self.dir, 64)
        (self.dir / "p.yaml").write_text(self.config(consumers=1))
        log = open(self.dir / "default.log", "w")
        d = subprocess.Popen([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml")], stderr=log)
        try:
            deadline = time.time() + 20
            while not dt.serving("/tmp/mmfeed.sock"):
                self.assertIsNone(d.poll(), (self.dir / "default.log").read_text())
                self.assertLess(time.time(), deadline)
                time.sleep(0.02)
            code = "import mmfeed\nn = 0\nfor b in mmfeed.Client(rank=0):\n    with b:\n        n += len(b.ids)\nprint(n)"
            env = {k: v for k, v in os.environ.items() if k != "MMFEED_SOCKET"}
            env["PYTHONPATH"] = PYDIR
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(int(p.stdout), 64)
            self.assertEqual(d.wait(60), 0)
        finally:
            if d.poll() is None:
                d.kill()
                d.wait()
            log.close()

    def test_errors_are_python_exceptions_with_the_daemons_message(self):
        make_texts(self.dir, 64)
        with self.assertRaises(mmfeed.AttachError) as e:
            mmfeed.Client(socket=str(self.dir / "none.sock"), rank=0)
        self.assertIn("cannot connect", str(e.exception))
        # ... and what to do about it.
        self.assertIn("Is mmfeedd running? It listens on its --socket (by default /tmp/mmfeed.sock", str(e.exception))
        d = dt.Daemon(self.dir, self.config(consumers=1, epochs=0), extra=("--drain-timeout", "1"))
        with self.assertRaises(mmfeed.AttachError) as e:
            mmfeed.Client(socket=d.socket, rank=3)
        self.assertIn("rank 3 out of range", str(e.exception))
        c = mmfeed.Client(socket=d.socket, rank=0)
        with self.assertRaises(mmfeed.AttachError):
            mmfeed.Client(socket=d.socket, rank=0)  # taken
        held = [c.next(timeout_s=10) for _ in range(4)]  # every slot
        t0 = time.time()
        with self.assertRaises(TimeoutError):
            c.next(timeout_s=0.3)
        self.assertGreaterEqual(time.time() - t0, 0.29)
        pid = os.fork()
        if pid == 0:
            try:
                c.next(timeout_s=1)
                os._exit(1)
            except RuntimeError as err:
                os._exit(0 if "forked process" in str(err) and "attach again in the child" in str(err) else 2)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        del held
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        with self.assertRaises(mmfeed.DaemonGone):
            for _ in range(100):
                c.next(timeout_s=5)

    def test_the_example_training_loop_checkpoints_and_resumes(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not installed (scripts/setup.sh installs python3-torch)")
        root = pathlib.Path(__file__).resolve().parent.parent.parent
        subprocess.run([sys.executable, str(root / "scripts" / "make_dataset.py"), str(self.dir), "--count", "128"],
                       check=True, capture_output=True)
        cfg = (root / "configs" / "demo.yaml").read_text().replace("consumers: 2", "consumers: 1")
        d = dt.Daemon(self.dir, cfg.replace("epochs: 1", "epochs: 0"), extra=("--drain-timeout", "1"))
        env = dict(os.environ, PYTHONPATH=PYDIR)
        run = lambda *extra: subprocess.run(
            [sys.executable, str(root / "examples" / "train_image_text.py"), "--socket", d.socket, "--every", "3",
             "--ckpt", str(self.dir / "ck.pt"), *extra], capture_output=True, text=True, env=env, timeout=300)
        first = run("--steps", "5")  # checkpoints after step 3; steps 4 and 5 are lost with the "crash"
        self.assertEqual(first.returncode, 0, first.stderr)
        second = run("--steps", "7", "--resume")
        self.assertEqual(second.returncode, 0, second.stderr)
        steps = [json.loads(l) for l in second.stdout.splitlines()]
        self.assertEqual([(s["step"], s["seq"]) for s in steps], [(4, 3), (5, 4), (6, 5), (7, 6)])
        self.assertTrue(all("stall_ms" in s and "compute_ms" in s for s in steps))
        d.proc.send_signal(signal.SIGTERM)
        d.wait()

    def test_to_device_on_cuda_registers_the_ring_and_copies_every_byte(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed (scripts/setup.sh installs python3-torch)")
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device: to_device's CUDA path needs a GPU")
        import mmfeed.torch as mt

        make_texts(self.dir, 200)
        d = dt.Daemon(self.dir, self.config(consumers=1, epochs=1))
        want = [(b.seq, b.ids, b.torch()["text"].clone()) for b in mmfeed.Client(socket=d.socket, rank=0)]
        self.assertEqual(d.wait(), 0, d.log())
        d = dt.Daemon(self.dir, self.config(consumers=1, epochs=1))
        loader = torch.utils.data.DataLoader(mt.MmfeedDataset(socket=d.socket, rank=0), batch_size=None)
        got = [(b["seq"], b["ids"], b["text"].cpu()) for b in mt.to_device(loader, "cuda")]
        self.assertEqual(len(got), len(want))
        for (s1, i1, t1), (s2, i2, t2) in zip(got, want):
            self.assertEqual((s1, i1), (s2, i2))
            self.assertTrue(torch.equal(t1, t2))
        self.assertEqual(d.wait(), 0, d.log())

    def test_torch_dataset_state_dict_resumes_exactly(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed (scripts/setup.sh installs python3-torch)")
        import mmfeed.torch as mt

        make_texts(self.dir, 200)
        d = dt.Daemon(self.dir, self.config(consumers=1, epochs=2))
        ds = mt.MmfeedDataset(socket=d.socket, rank=0)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
        got, state = [], None
        for step, b in enumerate(mt.to_device(loader, "cpu")):
            self.assertIsInstance(b["text"], torch.Tensor)
            self.assertEqual(b["text"].dtype, torch.int32)
            # The ring (what to_device registers with CUDA) holds the tensors' bytes unwritten.
            ring = b["ring"]
            for name in ("text", "text_lengths"):
                t = b[name]
                src = mt._pinned_source(ring, t)
                self.assertTrue(ring.address <= src.data_ptr() and
                                src.data_ptr() + t.numel() * t.element_size() <= ring.address + ring.size)
                self.assertTrue(torch.equal(src, t))
            got.append((b["seq"], b["ids"]))
            if step == 9:
                state = ds.state_dict()
                break
        del loader, ds, b, ring, t, src  # a batch, tensor or ring kept would keep the attach
        # A new job: load the checkpointed state, continue after batch 9 (on the same daemon).
        ds2 = mt.MmfeedDataset(socket=d.socket, rank=0)
        ds2.load_state_dict(state)
        rest = [(b["seq"], b["ids"]) for b in torch.utils.data.DataLoader(ds2, batch_size=None)]
        self.assertEqual([s for s, _ in got + rest], list(range(50)))
        del ds2
        self.assertEqual(d.wait(), 0, d.log())

    def test_a_torch_state_dict_taken_at_one_shape_resumes_at_another(self):
        """Two ranks (a Python trainer and mmfeed-consume) take 5 batches of 8 each and checkpoint
        (positions [0, 80) of the epoch); the job then restarts as one trainer under torchrun
        (`consumers: auto`), which load_state_dict()s rank 0's checkpoint: it gets the other
        120 samples, and together every sample once."""
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not installed (scripts/setup.sh installs python3-torch)")
        make_texts(self.dir, 200)
        trainer = """
            import json, sys, torch, mmfeed.torch as mt
            socket, state, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
            ds = mt.MmfeedDataset(socket=socket, reconnect_s=10)
            try:
                ds.load_state_dict(json.load(open(state)))
            except FileNotFoundError:
                pass
            ids = []
            for step, b in enumerate(torch.utils.data.DataLoader(ds, batch_size=None)):
                ids += b["ids"]
                if step + 1 == steps:
                    break
            json.dump(ds.state_dict(), open(state, "w"))
            json.dump(ids, open(out, "w"))
        """
        first = self.dir / "first"
        first.mkdir()
        make_texts(first, 200)
        d = dt.Daemon(first, self.config(consumers=2, epochs=1))
        env = dict(os.environ, PYTHONPATH=PYDIR, LOCAL_RANK="0")
        state = self.dir / "state.json"
        py = subprocess.Popen([sys.executable, "-c", textwrap.dedent(trainer), d.socket, str(state),
                               str(self.dir / "ids0.json"), "5"], env=env, stderr=subprocess.PIPE, text=True)
        other = d.consume(1, "--batches", "5", "--dump", str(self.dir / "dump1"))
        dt.finish(other)
        self.assertEqual(py.wait(60), 0, py.communicate()[1])
        d.proc.kill()
        d.proc.wait()
        cursor = json.loads(state.read_text())["cursor"]
        self.assertEqual((cursor["epoch"], cursor["position"]), (0, 80), cursor)

        d = dt.Daemon(self.dir, self.config(consumers="auto", epochs=1))
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0")
        py = subprocess.Popen([sys.executable, "-c", textwrap.dedent(trainer), d.socket, str(state),
                               str(self.dir / "ids2.json"), "0"], env=env, stderr=subprocess.PIPE, text=True)
        self.assertEqual(py.wait(60), 0, py.communicate()[1])
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("the job resumes there", d.log())
        lives = [json.loads((self.dir / "ids0.json").read_text()),
                 [i for meta, _ in dt.dumped_batches(self.dir / "dump1") for i in meta["ids"]],
                 json.loads((self.dir / "ids2.json").read_text())]
        self.assertEqual([len(ids) for ids in lives], [40, 40, 120])
        every = [json.loads(line)["id"] for line in (self.dir / "manifest.jsonl").read_text().splitlines()]
        self.assertEqual(sorted(i for ids in lives for i in ids), sorted(every))

    def test_in_place_writes_to_torch_tensors_stay_in_the_trainer(self):
        """batch.torch() tensors are writable (a copy-on-write view of the ring): add_ works, the
        ring keeps the daemon's bytes, the slot's next batch reads them (not our writes), and
        to_device copies a written tensor from its own pages."""
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed (scripts/setup.sh installs python3-torch)")
        import mmfeed.torch as mt

        make_texts(self.dir, 400)
        d = dt.Daemon(self.dir, self.config(consumers=1, slots=2))
        n = 0
        for b in mmfeed.Client(socket=d.socket, rank=0):
            t = b.torch()
            theirs = b["text"]  # the ring's read-only view
            self.assertTrue(np.array_equal(t["text"].numpy(), theirs), f"batch {b.seq}")
            ring = b.ring
            self.assertIsNot(mt._pinned_source(ring, t["text"]), t["text"])
            before = theirs.copy()
            t["text"].add_(1)
            t["text_lengths"][0] = -5
            self.assertTrue(torch.equal(t["text"], torch.from_numpy(before) + 1))
            np.testing.assert_array_equal(theirs, before)  # the ring is unchanged
            self.assertIs(mt._pinned_source(ring, t["text"]), t["text"])  # copy the write
            del t, theirs, ring, b
            n += 1
        self.assertEqual(n, 50)  # 2 slots: each one written and reused 25 times
        self.assertEqual(d.wait(), 0, d.log())

    def test_uint8_and_bfloat16_images_equal_the_float_path(self):
        """uint8 images normalized by the client equal the float32 path; bfloat16 ones are
        torch.bfloat16 tensors equal to torch's rounding of the float32 ones."""
        import torch
        import mmfeed.torch as mt

        dt.make_dataset(self.dir, 48)
        float_cfg = dt.CONFIG.format(source_type="manifest", path="manifest.jsonl", seed=1, epochs=1, consumers=1,
                                     workers=2, batch=16, placement="")
        images = {}
        for dtype in ("float32", "uint8", "bfloat16"):
            d = dt.Daemon(self.dir, float_cfg.replace("dtype: float32", f"dtype: {dtype}"))
            images[dtype] = []
            for b in mmfeed.Client(socket=d.socket, rank=0):
                self.assertEqual(b.dtypes["image"], dtype)
                self.assertEqual(b.dtypes["text"], "int32")
                if dtype == "bfloat16":
                    self.assertEqual(b.tensors["image"].dtype, np.uint16)  # its bits
                images[dtype].append(b.torch()["image"].clone())
                b.release()  # else the loop variable holds the last batch: no drain, no exit
            self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual(images["uint8"][0].dtype, torch.uint8)
        self.assertEqual(images["bfloat16"][0].dtype, torch.bfloat16)
        for bf16, f32 in zip(images["bfloat16"], images["float32"], strict=True):
            self.assertTrue(torch.equal(bf16, f32.to(torch.bfloat16)))
        mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
        for u8, f32 in zip(images["uint8"], images["float32"], strict=True):
            self.assertTrue(torch.allclose(mt.normalize(u8, mean, std), f32, atol=1e-5))
        with self.assertRaises(TypeError):
            mt.normalize(images["float32"][0], mean, std)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--python", required=True)
    a, rest = ap.parse_known_args()
    dt.BIN = os.path.abspath(a.bin)
    PYDIR = os.path.abspath(a.python)
    sys.path.insert(0, PYDIR)
    import mmfeed  # noqa: E402

    unittest.main(argv=[sys.argv[0], "-v", *rest])
