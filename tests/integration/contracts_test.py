#!/usr/bin/env python3
"""Integration tests of the core contracts: cursors that survive killed consumers and killed
daemons, a ring the daemon never has to trust, deaths judged by pidfd, one daemon per socket.
Real mmfeedd and mmfeed-consume processes on real shared memory; hostile consumers are Python
processes speaking the control protocol themselves.

usage: contracts_test.py --bin BUILD/bin
"""
import json, mmap, os, pathlib, re, signal, socket, subprocess, sys, time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import daemon_test as dt  # noqa: E402  (Daemon, finish, dumped_batches, DaemonCase)

CONFIG = """pipeline: contracts
source: {{type: manifest, path: manifest.jsonl, shuffle: true, seed: 11, epochs: {epochs}}}
consumers: {consumers}
stages:
  - {{name: text, type: text, field: text, workers: 2, params: {{max_len: 24}}}}
  - {{name: batch, type: batch, inputs: [text], params: {{batch_size: 8}}}}
output: {{ring_slots: {slots}}}
"""


def make_texts(d, n, bad_every=0):
    with open(d / "manifest.jsonl", "w") as m:
        for i in range(n):
            if bad_every and i % bad_every == bad_every - 1:
                m.write(json.dumps({"id": f"b{i}", "text": {"path": f"missing/{i}.txt"}}) + "\n")
            else:
                m.write(json.dumps({"id": f"s{i}", "text": f"caption {i}"}) + "\n")


def ids_of(dump, before_seq=None):
    """Sample ids of the dumped batches, in order (only batches with seq < before_seq)."""
    out = []
    for meta, _ in dt.dumped_batches(dump):
        if before_seq is None or meta["seq"] < before_seq:
            out += meta["ids"]
    return out


def seqs_of(dump):
    return [meta["seq"] for meta, _ in dt.dumped_batches(dump)]


def raw_attach(sock_path, rank, resume=None):
    """Attaches like a client would; returns (socket, reply, [data fd, control fd])."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    req = {"cmd": "attach", "rank": rank}
    if resume is not None:
        req["resume"] = resume
    s.sendall((json.dumps(req) + "\n").encode())
    msg, fds, _, _ = socket.recv_fds(s, 65536, 4)
    return s, json.loads(msg.decode().splitlines()[0]), fds


class ContractsTest(dt.DaemonCase):
    def config(self, consumers=2, slots=4, epochs=1):
        return CONFIG.format(consumers=consumers, slots=slots, epochs=epochs)

    def uninterrupted(self, consumers=2, epochs=1):
        """Each rank's ids in order, from an uninterrupted run."""
        d = dt.Daemon(self.dir, self.config(consumers=consumers, epochs=epochs))
        procs = [d.consume(r, "--dump", str(self.dir / f"ref{r}")) for r in range(consumers)]
        for p in procs:
            dt.finish(p)
        self.assertEqual(d.wait(), 0, d.log())
        return [ids_of(self.dir / f"ref{r}") for r in range(consumers)]

    def wait_cursor(self, path, at_least, proc=None, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                c = json.loads(path.read_text())
                if c["seq"] >= at_least:
                    return c
            except (FileNotFoundError, json.JSONDecodeError):
                pass
            time.sleep(0.01)
        raise AssertionError(f"{path} did not reach seq {at_least}")

    def test_consumer_sigkilled_and_restarted_with_cursor_sees_the_uninterrupted_ids(self):
        make_texts(self.dir, 400, bad_every=9)
        want = self.uninterrupted()
        d = dt.Daemon(self.dir, self.config())
        other = d.consume(1, "--dump", str(self.dir / "r1"))
        cursor = self.dir / "rank0.cursor"
        first = d.consume(0, "--cursor", str(cursor), "--dump", str(self.dir / "a"), "--hold-ms", "30")
        c = self.wait_cursor(cursor, 5)
        first.send_signal(signal.SIGKILL)
        first.wait()
        c = json.loads(cursor.read_text())
        # Restarted at once: the dead holder is taken over without waiting.
        dt.finish(d.consume(0, "--cursor", str(cursor), "--dump", str(self.dir / "b")))
        dt.finish(other)
        self.assertEqual(d.wait(), 0, d.log())
        got = ids_of(self.dir / "a", before_seq=c["seq"]) + ids_of(self.dir / "b")
        self.assertEqual(got, want[0])
        self.assertEqual(ids_of(self.dir / "r1"), want[1], "the other rank is untouched")
        self.assertEqual(json.loads(cursor.read_text())["seq"], 25, "the cursor ends after the last batch")

    def test_daemon_sigkilled_and_restarted_with_state_dir_consumers_reconnect(self):
        make_texts(self.dir, 400, bad_every=7)
        want = self.uninterrupted()
        state = self.dir / "state"
        d = dt.Daemon(self.dir, self.config(), extra=("--state-dir", str(state)))
        procs = [d.consume(r, "--reconnect", "30", "--hold-ms", "20", "--json", "--dump", str(self.dir / f"r{r}"))
                 for r in range(2)]
        # Killed once the state file says a rank is past batch 2 (its 100 ms writes, not the
        # trainers' pace, decide when: a slow machine must not kill it before the first write).
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if any(r["seq"] > 2 for r in json.loads((state / "cursors.json").read_text())["ranks"]):
                    break
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(0.01)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        saved = json.loads((state / "cursors.json").read_text())
        self.assertTrue(any(r["seq"] > 0 for r in saved["ranks"]), saved)
        # Nothing the killed daemon left blocks the restart on the same socket and state.
        d2 = dt.Daemon(self.dir, self.config(), extra=("--state-dir", str(state)))
        results = [dt.finish(p, timeout=120) for p in procs]
        self.assertEqual(d2.wait(), 0, d2.log())
        self.assertIn("continuing from the saved cursors", d2.log())
        for r in range(2):
            self.assertEqual(ids_of(self.dir / f"r{r}"), want[r], f"rank {r}")
            seqs = seqs_of(self.dir / f"r{r}")
            self.assertEqual(seqs, list(range(25)), "no duplicate batch, no gap")
            self.assertEqual(results[r]["batches"], 25)

    def test_state_of_another_stream_is_not_used(self):
        make_texts(self.dir, 64)
        state = self.dir / "state"
        state.mkdir()
        (state / "cursors.json").write_text(json.dumps({"fingerprint": "0000", "ranks": [{"seq": 3}, {"seq": 3}]}))
        d = dt.Daemon(self.dir, self.config(), extra=("--state-dir", str(state)))
        r = [dt.finish(d.consume(k, "--json")) for k in range(2)]
        self.assertEqual(d.wait(), 0, d.log())
        self.assertIn("is for another stream", d.log())
        self.assertEqual([x["batches"] for x in r], [4, 4])

    def test_daemon_gone_is_reported_promptly_after_the_published_batches(self):
        make_texts(self.dir, 4000)
        d = dt.Daemon(self.dir, self.config(consumers=1, epochs=0))
        c = d.consume(0, "--json", "--hold-ms", "5")
        time.sleep(0.5)
        d.proc.send_signal(signal.SIGKILL)
        t0 = time.time()
        out, err = c.communicate(timeout=30)
        # The ring's published batches (4 slots) take 4 x 5 ms; then "gone" within 2 s.
        self.assertLess(time.time() - t0, 2.0)
        self.assertEqual(c.returncode, 1)
        self.assertIn("went away before the end of the data", err)

    def test_stop_before_the_end_is_not_success(self):
        make_texts(self.dir, 4000)
        d = dt.Daemon(self.dir, self.config(consumers=1, epochs=0), extra=("--drain-timeout", "5"))
        c = d.consume(0, "--hold-ms", "5")
        time.sleep(0.3)
        d.proc.send_signal(signal.SIGTERM)
        out, err = c.communicate(timeout=30)
        self.assertEqual(c.returncode, 1, err)
        self.assertIn("stopped before the end of the data", err)
        self.assertEqual(d.wait(), 0, d.log())

    def test_scribbling_consumer_is_cut_off_and_the_rank_continues_exactly(self):
        make_texts(self.dir, 400)
        want = self.uninterrupted()
        d = dt.Daemon(self.dir, self.config())
        other = d.consume(1, "--dump", str(self.dir / "r1"))
        s, reply, (data_fd, control_fd) = raw_attach(d.socket, 0)
        self.assertTrue(reply["ok"], reply)
        size = os.fstat(data_fd).st_size
        with self.assertRaises(PermissionError):  # the data area is read-only for consumers
            mmap.mmap(data_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with self.assertRaises(OSError):
            fd = os.open(f"/proc/self/fd/{data_fd}", os.O_RDWR)
            mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        ctl = mmap.mmap(control_fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        time.sleep(0.3)  # let batches be published to this rank
        ctl[:] = b"\xa5" * 4096  # garbage over every writable byte
        deadline = time.time() + 10
        while b"cutting off" not in (self.dir / "daemon.log").read_bytes() and time.time() < deadline:
            time.sleep(0.02)
        self.assertIn("cutting off pid", d.log())
        self.assertEqual(s.recv(1), b"", "the daemon closed the scribbler's connection")
        s.close()
        # A well-behaved consumer for the same rank gets exactly the uninterrupted stream.
        dt.finish(d.consume(0, "--dump", str(self.dir / "r0")))
        dt.finish(other)
        self.assertEqual(d.wait(), 0, d.log())
        self.assertEqual(ids_of(self.dir / "r0"), want[0])
        self.assertEqual(ids_of(self.dir / "r1"), want[1])

    def test_half_closed_live_consumer_keeps_its_rank(self):
        make_texts(self.dir, 200)
        d = dt.Daemon(self.dir, self.config(consumers=1))
        s, reply, fds = raw_attach(d.socket, 0)
        self.assertTrue(reply["ok"])
        s.shutdown(socket.SHUT_WR)
        time.sleep(0.3)
        second = d.consume(0, "--json")
        out, err = second.communicate(timeout=30)
        self.assertEqual(second.returncode, 1)
        self.assertIn("already attached", err)
        self.assertIn("closed its connection but lives", d.log())
        s.close()
        for fd in fds:
            os.close(fd)

    def test_trainer_dead_while_a_forked_child_holds_its_socket(self):
        make_texts(self.dir, 200)
        d = dt.Daemon(self.dir, self.config(consumers=1))
        script = (
            "import json, os, socket, sys, time\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1])\n"
            "s.sendall(b'{\"cmd\": \"attach\", \"rank\": 0}\\n')\n"
            "socket.recv_fds(s, 65536, 4)\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    time.sleep(60); os._exit(0)\n"  # the DataLoader worker keeps the socket
            "open(sys.argv[2], 'w').write(str(child)); os._exit(0)\n")
        pid_file = self.dir / "child.pid"
        p = subprocess.run([sys.executable, "-c", script, d.socket, str(pid_file)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30)
        self.assertEqual(p.returncode, 0)
        child = int(pid_file.read_text())
        try:
            r = dt.finish(d.consume(0, "--json"))  # takes over at once: the trainer is dead
            self.assertEqual(r["batches"], 25)
            self.assertEqual(d.wait(), 0, d.log())
            self.assertRegex(d.log(), r"rank 0: pid \d+ exited")  # by its pidfd; the child still has the socket
        finally:
            os.kill(child, signal.SIGKILL)

    def test_rank_out_of_range_and_a_second_attach_for_a_live_rank_are_refused(self):
        make_texts(self.dir, 200)
        d = dt.Daemon(self.dir, self.config())
        out, err = d.consume(2, "--json").communicate(timeout=30)
        self.assertIn("rank 2 out of range: this pipeline has 2 consumer rank(s)", err)
        self.assertIn(f"0 to 1 (`consumers:` in {self.dir}/p.yaml sets how many", err)
        s, reply, fds = raw_attach(d.socket, 0)
        self.assertTrue(reply["ok"])
        s2, reply2, _ = raw_attach(d.socket, 0)
        self.assertFalse(reply2["ok"])
        self.assertIn("already attached", reply2["error"])
        s.close(), s2.close()
        for fd in fds:
            os.close(fd)

    def test_one_daemon_per_socket_and_stale_sockets_are_taken_over(self):
        make_texts(self.dir, 64)
        d = dt.Daemon(self.dir, self.config(epochs=0))
        (self.dir / "second.yaml").write_text(self.config())
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "second.yaml"), "--socket", d.socket],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("another mmfeedd is serving", p.stderr)
        st = d.ctl("status")
        self.assertEqual(st.returncode, 0, "the first daemon is still reachable")
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        self.assertTrue(os.path.exists(d.socket), "a killed daemon leaves its socket")
        d2 = dt.Daemon(self.dir, self.config(consumers=2))
        r = [dt.finish(d2.consume(k, "--json")) for k in range(2)]
        self.assertEqual(d2.wait(), 0, d2.log())
        self.assertIn("taking over the stale socket", d2.log())
        # Anything but a socket at the path is refused and left alone.
        regular = self.dir / "not-a-socket"
        regular.write_text("precious")
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "second.yaml"), "--socket", str(regular)],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("is not a socket", p.stderr)
        self.assertEqual(regular.read_text(), "precious")

    def test_check_builds_the_pipeline_and_sizes_the_rings(self):
        make_texts(self.dir, 1)
        (self.dir / "p.yaml").write_text(self.config())
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2, "valid YAML, but the daemon would refuse it")
        self.assertIn("1 samples cannot be dealt to 1 node(s) x 2 consumer(s)", p.stderr)
        make_texts(self.dir, 64)
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "p.yaml")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("4 batches per rank per epoch, rings 0.00 GiB", p.stdout)
        # --check as a flag beside the daemon's own --config FILE, in either order, or with its file
        # after other flags or before --check, says the same; two different files are refused, and a
        # bare file without --check is named with the flag that runs it.
        for args in (["--check", "--config", "p.yaml"], ["--config", "p.yaml", "--check"],
                     ["--check", "--allow-faults", "p.yaml"], ["p.yaml", "--check"]):
            q = subprocess.run([f"{dt.BIN}/mmfeedd", *args], capture_output=True, text=True, cwd=self.dir)
            self.assertEqual((q.returncode, q.stdout.replace("p.yaml", str(self.dir / "p.yaml"))), (0, p.stdout), q.stderr)
        q = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", "p.yaml", "--config", "other.yaml"], capture_output=True,
                           text=True, cwd=self.dir)
        self.assertEqual(q.returncode, 2)
        self.assertIn("two configs given ('p.yaml' and 'other.yaml')", q.stderr)
        q = subprocess.run([f"{dt.BIN}/mmfeedd", "p.yaml"], capture_output=True, text=True, cwd=self.dir)
        self.assertEqual(q.returncode, 2)
        self.assertIn("a bare file ('p.yaml') is --check's; to run it: --config p.yaml", q.stderr)
        huge = self.config(slots=496).replace("max_len: 24", "max_len: 2000000").replace("batch_size: 8", "batch_size: 64")
        (self.dir / "huge.yaml").write_text(huge)
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "huge.yaml")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2, "--check refuses rings the daemon would refuse")
        self.assertRegex(p.stderr, r"the rings need 473\.05 GiB, \d+\.\d\d GiB available")
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "huge.yaml"), "--socket",
                            str(self.dir / "huge.sock")], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stderr, r"the rings need 473\.\d\d GiB, \d+\.\d\d GiB available")

    def test_numa_placement_binds_rings_pins_threads_and_budgets_workers(self):
        make_texts(self.dir, 4000)
        node0 = pathlib.Path("/sys/devices/system/node/node0/cpulist")
        if not node0.exists():
            self.skipTest("no NUMA node 0 in /sys (not a NUMA-aware kernel)")
        cfg = self.config(consumers=1, epochs=0) + "placement: {numa_node: 0}\n"
        d = dt.Daemon(self.dir, cfg, extra=("--drain-timeout", "1"))
        c = d.consume(0, "--batches", "3")
        dt.finish(c)
        maps = pathlib.Path(f"/proc/{d.proc.pid}/numa_maps").read_text().splitlines()
        ring = [l for l in maps if "mmfeed-ring-0" in l]
        self.assertTrue(ring and all("bind:0" in l for l in ring), ring)
        threads = {}
        for task in pathlib.Path(f"/proc/{d.proc.pid}/task").iterdir():
            status = (task / "status").read_text()
            threads[(task / "comm").read_text().strip()] = [
                l.split(":")[1].strip() for l in status.splitlines() if l.startswith("Cpus_allowed_list")][0]
        for name in ("mmf:source", "mmf:batch", "mmf:text:0"):
            self.assertEqual(threads[name], node0.read_text().strip(), name)
        st = d.ctl("status")
        self.assertIn("bound to NUMA node 0", st.stdout)
        self.assertIn(f"thread(s) on CPUs {node0.read_text().strip()}", st.stdout)
        d.proc.send_signal(signal.SIGTERM)
        # No trainer attached: the stop does not wait for one (exit 0; the batches are made
        # again for a trainer resuming from its cursor).
        self.assertEqual(d.wait(), 0, d.log())
        ncpu = len(os.sched_getaffinity(0))
        many = self.config(consumers=1).replace("workers: 2", f"workers: {ncpu + 3}")
        (self.dir / "many.yaml").write_text(many + "placement: {numa_node: 0, strict: true}\n")
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "many.yaml")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2, p.stdout)
        self.assertIn(f"placement: strict: {ncpu + 3} worker threads on", p.stderr)
        (self.dir / "many.yaml").write_text(many)
        p = subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "many.yaml")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("more workers than CPUs", p.stderr)

    def test_oversized_control_request_closes_only_that_connection(self):
        make_texts(self.dir, 64)
        d = dt.Daemon(self.dir, self.config(epochs=0), extra=("--drain-timeout", "1"))
        st = d.ctl("status")  # up, its rings full: nobody consumes
        self.assertEqual(st.returncode, 0, st.stderr)

        def rss_kib():
            status = pathlib.Path(f"/proc/{d.proc.pid}/status").read_text()
            return int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))

        before = rss_kib()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(d.socket)
        try:
            s.sendall(b"x" * (64 << 20))  # no newline, 64 MiB: cut off after the first 1 MiB
        except (BrokenPipeError, ConnectionResetError):
            pass
        s.settimeout(10)
        try:
            self.assertEqual(s.recv(1), b"")
        except ConnectionResetError:
            pass
        s.close()
        st = d.ctl("status")
        self.assertEqual(st.returncode, 0, st.stderr)
        self.assertIn("longer than 1048576 bytes", d.log())
        # A daemon that buffered the request would have grown by 64 MiB; the bound is 1 MiB
        # (an ASan build keeps freed buffers in quarantine, so growth is compared, not RSS).
        grown = rss_kib() - before
        self.assertLess(grown, 16 * 1024, f"RSS grew {grown} KiB")
        d.proc.send_signal(signal.SIGTERM)
        self.assertEqual(d.wait(), 0, d.log())  # no trainer attached: nobody to drain for

    def test_fd_exhaustion_is_survived_and_never_counted_as_bad_samples(self):
        (self.dir / "t").mkdir()
        with open(self.dir / "manifest.jsonl", "w") as m:
            for i in range(1600):
                (self.dir / "t" / f"{i}.txt").write_text(f"caption {i}")
                m.write(json.dumps({"id": f"s{i}", "text": {"path": f"t/{i}.txt"}}) + "\n")
        (self.dir / "p.yaml").write_text(self.config(consumers=1, epochs=0))  # runs until stopped
        sock = str(self.dir / "mmfeed.sock")
        log = open(self.dir / "daemon.log", "w")
        proc = subprocess.Popen(["prlimit", "--nofile=256", f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"),
                                 "--socket", sock, "--drain-timeout", "1"], stdout=log, stderr=log)
        try:
            deadline = time.time() + 20
            while not os.path.exists(sock) and time.time() < deadline:
                time.sleep(0.02)
            consumer = subprocess.Popen([f"{dt.BIN}/mmfeed-consume", "--socket", sock, "--rank", "0", "--json",
                                         "--batches", "250", "--hold-ms", "5"], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
            time.sleep(0.3)
            # More connections than the daemon has descriptors (each takes a socket and a pidfd):
            # keep connecting until it stops accepting (its fds are gone and its backlog full).
            flood, last, deadline = [], time.time(), time.time() + 20
            while len(flood) < 300 and time.time() - last < 1.0 and time.time() < deadline:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(sock)
                    flood.append(s)
                    last = time.time()
                except OSError:  # the backlog is full: wait for accepts
                    s.close()
                    time.sleep(0.005)
            self.assertGreater(len(flood), 120)
            for s in flood:
                s.close()
            st = subprocess.run([f"{dt.BIN}/mmfeedctl", "--socket", sock, "--timeout", "10", "status"],
                                capture_output=True, text=True, timeout=30)
            self.assertEqual(st.returncode, 0, st.stderr)
            out, err = consumer.communicate(timeout=120)
            self.assertEqual(consumer.returncode, 0, err)
            self.assertEqual(json.loads(out)["samples"], 2000)
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            text = (self.dir / "daemon.log").read_text()
            self.assertIn("samples skipped: 0", text)
            self.assertRegex(text, r"accepting a control connection: .*; retrying|more than 256 control connections")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()

    def test_a_reply_larger_than_the_socket_buffer_arrives_whole(self):
        long_dir = "/".join(["d" * 200] * 14)  # a 2.8 KB path that does not exist
        with open(self.dir / "manifest.jsonl", "w") as m:
            for i in range(200):
                if i % 5 < 3:
                    m.write(json.dumps({"id": f"b{i}", "text": {"path": f"{long_dir}/{i}.txt"}}) + "\n")
                else:
                    m.write(json.dumps({"id": f"s{i}", "text": f"caption {i}"}) + "\n")
        d = dt.Daemon(self.dir, self.config(consumers=1, epochs=0), extra=("--drain-timeout", "1", "--log-level", "error"))
        dt.finish(d.consume(0, "--batches", "30"))
        st = d.ctl("status", "--json")
        self.assertEqual(st.returncode, 0, st.stderr)
        self.assertGreater(len(st.stdout), 250_000, "the reply is larger than a unix socket's buffer")
        recent = json.loads(st.stdout)["profile"]["errors"]["recent"]
        self.assertEqual(len(recent), 100)
        d.proc.send_signal(signal.SIGTERM)
        d.wait()

    def test_a_service_user_serves_the_trainers_of_its_group(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to run the daemon and the trainers as other users (setpriv)")
        make_texts(self.dir, 64)
        os.chmod(self.dir, 0o777)
        (self.dir / "manifest.jsonl").chmod(0o644)
        (self.dir / "p.yaml").write_text(self.config(consumers=1, epochs=0))
        (self.dir / "p.yaml").chmod(0o644)
        # As the service lays it out (/run/mmfeed, 0750): the socket in a folder of the daemon's
        # user that no one else can write, which is how a trainer of another user trusts it.
        run = self.dir / "run"
        run.mkdir()
        os.chown(run, 65534, 100)
        run.chmod(0o750)
        sock = str(run / "group.sock")
        log = open(self.dir / "group.log", "w")
        # The daemon as `nobody`, a member of `users` (gid 100), serving the members of that group.
        d = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--groups=100", f"{dt.BIN}/mmfeedd",
                              "--config", str(self.dir / "p.yaml"), "--socket", sock, "--socket-group", "users",
                              "--drain-timeout", "1"], stdout=log, stderr=log)
        try:
            deadline = time.time() + 20
            while not os.path.exists(sock) and time.time() < deadline:
                time.sleep(0.02)
            st = os.stat(sock)
            self.assertEqual((st.st_mode & 0o777, st.st_gid), (0o660, 100))

            def consume(*groups):
                cred = ["--groups=" + ",".join(groups)] if groups else ["--clear-groups"]
                return subprocess.run(["setpriv", "--reuid=65533", "--regid=65533", *cred, f"{dt.BIN}/mmfeed-consume",
                                       "--socket", sock, "--rank", "0", "--batches", "2", "--json"],
                                      capture_output=True, text=True, timeout=30)

            member = consume("100")
            self.assertEqual(member.returncode, 0, member.stderr)
            self.assertEqual(json.loads(member.stdout)["batches"], 2)
            stranger = consume()
            self.assertNotEqual(stranger.returncode, 0)
            self.assertIn("Permission denied", stranger.stderr)  # the socket's mode already stops it
        finally:
            d.send_signal(signal.SIGTERM)
            d.wait(30)
            log.close()

    def test_another_users_lock_file_is_named_with_what_to_do(self):
        """A lock file outlives its daemon, and /tmp keeps other users' files: root's daemon ran
        on a socket path once, then a user's daemon on the same path cannot open the lock."""
        if os.geteuid() != 0:
            self.skipTest("needs root to leave a lock file of another user (setpriv)")
        make_texts(self.dir, 8)
        os.chmod(self.dir, 0o1777)
        (self.dir / "p.yaml").write_text(self.config(consumers=1))
        lock = self.dir / "shared.sock.lock"
        lock.touch(mode=0o600)  # as root's daemon leaves it
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"{dt.BIN}/mmfeedd",
                            "--config", str(self.dir / "p.yaml"), "--socket", str(self.dir / "shared.sock")],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn(f"lock file {lock} belongs to user root (uid 0): a daemon of that user serves, or served, "
                      f"on {self.dir}/shared.sock; start this one on a socket of your own (e.g. --socket "
                      "/tmp/mmfeed-nobody.sock, and MMFEED_SOCKET set to it for the trainers)", p.stderr)

    def test_root_takes_over_a_users_stale_lock_file_but_not_a_live_one(self):
        """A user's daemon left its lock file in sticky /tmp: it once kept root's daemon off that
        socket path for good. Not held by a live daemon, it is taken over; held, root's daemon is
        refused, naming the user."""
        if os.geteuid() != 0:
            self.skipTest("needs root to leave a lock file of another user (setpriv)")
        make_texts(self.dir, 8)
        os.chmod(self.dir, 0o1777)
        (self.dir / "p.yaml").write_text(self.config(consumers=1))
        (self.dir / "p.yaml").chmod(0o644)
        (self.dir / "manifest.jsonl").chmod(0o644)
        lock = self.dir / "mmfeed.sock.lock"
        lock.touch(mode=0o600)
        os.chown(lock, 65534, 65534)  # as nobody's daemon leaves it
        # Linux refuses root an O_CREAT open of another user's file in a sticky folder only
        # with fs.protected_regular (systemd's default 1; some containers have 0): on for this.
        knob = pathlib.Path("/proc/sys/fs/protected_regular")
        was = knob.read_text().strip() if knob.exists() else None
        try:
            if was == "0":
                knob.write_text("1")
        except OSError:
            pass
        try:
            protected = knob.exists() and knob.read_text().strip() != "0"
            d = dt.Daemon(self.dir, self.config(consumers=1))
        finally:
            if was == "0":
                try:
                    knob.write_text("0")
                except OSError:
                    pass
        if protected:
            self.assertIn(f"took over {lock}: the lock file of uid 65534's daemon, which is gone", d.log())
            self.assertEqual(os.stat(lock).st_uid, 0)
        dt.finish(d.consume(0))
        self.assertEqual(d.wait(), 0, d.log())
        # Held by nobody's live daemon: root's is refused.
        lock.unlink()
        pathlib.Path(d.socket).unlink(missing_ok=True)
        log = open(self.dir / "nobody.log", "w")
        theirs = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"{dt.BIN}/mmfeedd",
                                   "--config", str(self.dir / "p.yaml"), "--socket", d.socket,
                                   "--drain-timeout", "1"], stdout=log, stderr=log)
        try:
            deadline = time.time() + 20
            while not os.path.exists(d.socket):
                self.assertLess(time.time(), deadline, (self.dir / "nobody.log").read_text())
                time.sleep(0.02)
            p = subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--socket", d.socket],
                               capture_output=True, text=True, timeout=30)
            self.assertNotEqual(p.returncode, 0, p.stderr)
            self.assertRegex(p.stderr, f"another mmfeedd is serving on {d.socket}|lock file {lock} belongs to user "
                                       r"nobody \(uid 65534\)")
        finally:
            theirs.send_signal(signal.SIGTERM)
            theirs.wait(30)
            log.close()

    def test_a_trainer_refuses_another_users_daemon_in_a_shared_folder(self):
        """A socket in a folder anyone may write (/tmp) served by another user's daemon: the
        trainer's attach and mmfeedctl refuse it, naming that user and how to accept it."""
        if os.geteuid() != 0:
            self.skipTest("needs root to run the daemon as another user (setpriv)")
        make_texts(self.dir, 16)
        os.chmod(self.dir, 0o1777)
        (self.dir / "manifest.jsonl").chmod(0o644)
        (self.dir / "p.yaml").write_text(self.config(consumers=1))
        (self.dir / "p.yaml").chmod(0o644)
        sock = str(self.dir / "theirs.sock")
        log = open(self.dir / "theirs.log", "w")
        theirs = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", f"{dt.BIN}/mmfeedd",
                                   "--config", str(self.dir / "p.yaml"), "--socket", sock, "--drain-timeout", "1"],
                                  stdout=log, stderr=log)
        try:
            deadline = time.time() + 20
            while not os.path.exists(sock):
                self.assertLess(time.time(), deadline)
                time.sleep(0.02)
            os.chmod(sock, 0o666)  # reachable: the check is the trainer's, not the socket mode's
            env = {k: v for k, v in os.environ.items() if k != "MMFEED_DAEMON_USER"}
            p = subprocess.run([f"{dt.BIN}/mmfeed-consume", "--socket", sock, "--rank", "0", "--batches", "1"],
                               capture_output=True, text=True, timeout=30, env=env)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(f"the daemon on {sock} runs as user nobody (uid 65534), not as you (root) or root, and "
                          f"{self.dir} is not that user's own folder: anyone may have put a socket there. If "
                          "nobody's daemon is the one you mean, set MMFEED_DAEMON_USER=nobody", p.stderr)
            r = subprocess.run([f"{dt.BIN}/mmfeedctl", "--socket", sock, "status"], capture_output=True, text=True,
                               timeout=30, env=env)
            self.assertEqual(r.returncode, 1)
            self.assertIn("runs as user nobody", r.stderr)
            ok = subprocess.run([f"{dt.BIN}/mmfeed-consume", "--socket", sock, "--rank", "0", "--batches", "1"],
                                capture_output=True, text=True, timeout=30, env={**env, "MMFEED_DAEMON_USER": "nobody"})
            self.assertEqual(ok.returncode, 0, ok.stderr)
        finally:
            theirs.send_signal(signal.SIGTERM)
            theirs.wait(30)
            log.close()

    def test_numeric_flags_reject_bad_values(self):
        make_texts(self.dir, 8)
        (self.dir / "p.yaml").write_text(self.config())
        for bad in ("abc", "1e400", "-1"):
            p = subprocess.run([f"{dt.BIN}/mmfeedd", "--config", str(self.dir / "p.yaml"), "--drain-timeout", bad],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn("--drain-timeout", p.stderr)
        for flag, bad in (("--rank", "4294967296"), ("--batches", "abc"), ("--hold-ms", "1e9")):
            args = ["--rank", "0"] if flag != "--rank" else []
            p = subprocess.run([f"{dt.BIN}/mmfeed-consume", "--socket", "/nonexistent", *args, flag, bad],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 2, (flag, bad, p.stderr))
            self.assertIn(flag, p.stderr)
        p = subprocess.run([f"{dt.BIN}/mmfeedctl", "--socket", "/nonexistent", "--timeout", "abc", "status"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2)


if __name__ == "__main__":
    dt.main()
