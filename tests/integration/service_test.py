#!/usr/bin/env python3
"""The node service: mmfeedd speaking the systemd notify protocol to a test datagram socket
(NOTIFY_SOCKET), and the unit files in daemon/systemd/.

usage: service_test.py --bin BUILD/bin
"""
import ctypes, errno, json, os, pathlib, shutil, signal, socket, subprocess, tempfile, time, unittest
import urllib.error, urllib.request

import daemon_test
from daemon_test import CONFIG, Daemon, DaemonCase, make_dataset



def config(**kw):
    args = dict(source_type="manifest", path="manifest.jsonl", seed=1, epochs=0, consumers=2, workers=2,
                batch=16, placement="")
    args.update(kw)
    return CONFIG.format(**args)


class NotifyTest(DaemonCase):
    def setUp(self):
        super().setUp()
        make_dataset(self.dir, 256)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.dir / "notify.sock"))
        self.pings = 0

    def tearDown(self):
        self.sock.close()
        super().tearDown()

    def next_message(self, timeout=20):
        """The next notify message other than WATCHDOG=1 (those are counted)."""
        deadline = time.time() + timeout
        while True:
            self.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                m = self.sock.recv(4096).decode()
            except socket.timeout:
                raise AssertionError("no notify message within %.0fs" % timeout)
            if m == "WATCHDOG=1":
                self.pings += 1
                continue
            return dict(line.split("=", 1) for line in m.split("\n") if line)

    def start(self, text):
        """The daemon on `text`, told to notify the test socket with a 300 ms watchdog."""
        env = {"NOTIFY_SOCKET": str(self.dir / "notify.sock"), "WATCHDOG_USEC": "300000"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return Daemon(self.dir, text, extra=("--drain-timeout", "1"))
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v

    def count_pings(self, seconds):
        """WATCHDOG=1 messages sent over the next `seconds` (those queued before are dropped)."""
        self.sock.setblocking(False)
        try:
            while True:
                self.sock.recv(4096)
        except BlockingIOError:
            pass
        self.pings = 0
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                self.next_message(timeout=deadline - time.time())
            except AssertionError:
                break
        return self.pings

    def test_ready_reloading_stopping_and_the_watchdog(self):
        d = self.start(config())
        m = self.next_message()
        self.assertEqual(m.get("READY"), "1", m)
        self.assertRegex(m["STATUS"], r"samples/s, \d+ batches published, 0/2 trainers attached")
        # No trainer takes anything: the rings fill and the pipeline is idle for a good reason,
        # so the watchdog keeps being fed (every 150 ms).
        time.sleep(1.5)
        self.assertGreaterEqual(self.count_pings(1.5), 5)

        (self.dir / "one.yaml").write_text(config(workers=1))
        self.assertEqual(d.ctl("reload", "--config", str(self.dir / "one.yaml")).returncode, 0)
        m = self.next_message()
        self.assertEqual(m.get("RELOADING"), "1", m)
        self.assertRegex(m.get("MONOTONIC_USEC", ""), r"^\d+$")
        m = self.next_message()
        self.assertEqual(m.get("READY"), "1", m)

        (self.dir / "bad.yaml").write_text("pipeline: [\n")
        self.assertEqual(d.ctl("reload", "--config", str(self.dir / "bad.yaml")).returncode, 1)
        self.assertEqual(self.next_message().get("RELOADING"), "1")
        m = self.next_message()
        self.assertEqual(m.get("READY"), "1", "READY=1 ends a refused reload too")
        self.assertIn("reload refused: ", m["STATUS"])
        self.assertIn("bad.yaml:", m["STATUS"])

        d.proc.send_signal(signal.SIGHUP)  # p.yaml unchanged: a good reload of nothing
        self.assertEqual(self.next_message().get("RELOADING"), "1")
        self.assertEqual(self.next_message().get("READY"), "1")

        d.proc.send_signal(signal.SIGTERM)
        m = self.next_message()
        self.assertEqual(m.get("STOPPING"), "1", m)
        self.assertEqual(d.wait(), 0, "no trainer attached: nobody to drain for, a clean stop")


    def test_a_hung_pipeline_stops_feeding_the_watchdog(self):
        d = self.start(config())
        self.assertEqual(self.next_message().get("READY"), "1")
        trainers = [d.consume(r, "--json") for r in (0, 1)]  # endless data, taken at once
        self.assertGreaterEqual(self.count_pings(1.5), 3, "fed while batches flow")
        # Every image worker stuck (ptrace-stopped, as a thread blocked for good would be) while
        # the trainers wait for batches: no progress and no good reason to be idle.
        workers = [t for t in thread_ids(d.proc.pid) if thread_name(d.proc.pid, t).startswith("mmf:image")]
        self.assertEqual(len(workers), 2)
        try:
            for t in workers:
                stop_thread(t)
        except PermissionError as e:
            for p in trainers:
                p.kill()
            self.skipTest(f"cannot ptrace the daemon's threads here ({e})")
        try:
            time.sleep(1)  # the other stages finish what they hold
            self.assertEqual(self.count_pings(1.5), 0, "a hung pipeline must not feed the watchdog")
        finally:
            for t in workers:
                resume_thread(t)
        self.assertGreaterEqual(self.count_pings(1.5), 3, "fed again once it moves")
        for p in trainers:
            p.kill()
            p.wait()


LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT, WALL = 17, 0x4206, 0x4207, 0x40000000


def thread_ids(pid):
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def thread_name(pid, tid):
    return pathlib.Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()


def ptrace(request, tid):
    if LIBC.ptrace(request, tid, None, None) != 0:
        e = ctypes.get_errno()
        raise (PermissionError if e == errno.EPERM else OSError)(e, os.strerror(e))


def stop_thread(tid):
    """Stops one thread of a child process (the others run on)."""
    ptrace(PTRACE_SEIZE, tid)
    ptrace(PTRACE_INTERRUPT, tid)
    os.waitpid(tid, WALL)


def resume_thread(tid):
    ptrace(PTRACE_DETACH, tid)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scrape(port, path="/metrics", method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, None, ""


def samples(page):
    """{'name{labels}': value} of a metrics page."""
    out = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


class MetricsTest(DaemonCase):
    def test_metrics_survive_reloads_and_pass_promtool(self):
        if not shutil.which("promtool"):
            self.skipTest("promtool not installed (scripts/setup.sh installs prometheus)")
        make_dataset(self.dir, 400)
        port = free_port()
        d = Daemon(self.dir, config() + f'metrics: {{listen: "127.0.0.1:{port}"}}\n')
        cs = [d.consume(r, "--hold-ms", "25", "--batches", "150", "--json") for r in (0, 1)]
        time.sleep(1.5)
        status, ctype, page = scrape(port)
        self.assertEqual(status, 200)
        self.assertEqual(ctype, "text/plain; version=0.0.4; charset=utf-8")
        r = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""), page)
        before = samples(page)
        for key in ('mmfeed_stage_items_total{stage="image"}', 'mmfeed_stage_queue_depth{stage="image"}',
                    'mmfeed_rank_batches_published_total{rank="0"}', 'mmfeed_rank_lag_batches{rank="1"}',
                    'mmfeed_rank_cursor_seq{rank="0"}', 'mmfeed_rank_attached{rank="1"}',
                    'mmfeed_rank_wait_seconds_total{rank="0"}', 'mmfeed_rank_hold_seconds_total{rank="1"}',
                    'mmfeed_read_bytes_total{source="all"}', "process_cpu_seconds_total",
                    "process_resident_memory_bytes", 'mmfeed_reloads_total{result="ok"}'):
            self.assertIn(key, before, page)
        self.assertGreater(before['mmfeed_stage_items_total{stage="image"}'], 0)
        self.assertEqual(before['mmfeed_rank_attached{rank="1"}'], 1)
        # Trainers holding each batch 25 ms report it (their own accounting, through the ring).
        self.assertGreater(before['mmfeed_rank_hold_seconds_total{rank="1"}'], 0.2)
        self.assertGreater(before["process_resident_memory_bytes"], 1e6)
        self.assertEqual(scrape(port, "/other")[0], 404)
        self.assertEqual(scrape(port, method="POST")[0], 405)

        # Counters belong to the daemon: a reload (another worker count, another port) keeps them.
        new_port = free_port()
        (self.dir / "two.yaml").write_text(config(workers=1) + f'metrics: {{listen: "127.0.0.1:{new_port}"}}\n')
        r = d.ctl("reload", "--config", str(self.dir / "two.yaml"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("metrics.listen changed", r.stdout)
        with self.assertRaises(urllib.error.URLError):
            scrape(port)
        after = samples(scrape(new_port)[2])
        for key in ('mmfeed_stage_items_total{stage="image"}', 'mmfeed_stage_busy_seconds_total{stage="image"}',
                    'mmfeed_rank_batches_published_total{rank="0"}'):
            self.assertGreaterEqual(after[key], before[key], key)
        self.assertEqual(after['mmfeed_reloads_total{result="ok"}'], 1)

        # A port someone else holds: the reload is refused, the endpoint stays where it was.
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        (self.dir / "busy.yaml").write_text(config() + f'metrics: {{listen: "127.0.0.1:{taken.getsockname()[1]}"}}\n')
        r = d.ctl("reload", "--config", str(self.dir / "busy.yaml"))
        taken.close()
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot serve /metrics", r.stderr)
        self.assertEqual(samples(scrape(new_port)[2])['mmfeed_reloads_total{result="refused"}'], 1)
        for c in cs:
            self.assertEqual(json.loads(c.communicate(timeout=60)[0])["batches"], 150)


class CtlTest(DaemonCase):
    def ctl(self, d, *args):
        r = d.ctl(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_status_consumers_and_top(self):
        make_dataset(self.dir, 256)
        d = Daemon(self.dir, config())
        c = d.consume(0, "--hold-ms", "20", "--batches", "300", "--json")
        time.sleep(2.5)
        ranks = json.loads(self.ctl(d, "consumers", "--json"))
        self.assertEqual([r["rank"] for r in ranks], [0, 1])
        self.assertEqual((ranks[0]["attached"], ranks[0]["pid"]), (True, c.pid))
        self.assertGreater(ranks[0]["samples_per_s"], 0)
        self.assertGreaterEqual(ranks[0]["seconds_since_take"], 0)
        self.assertLess(ranks[0]["seconds_since_take"], 2)
        self.assertGreater(ranks[0]["acked"]["seq"], 0)
        self.assertEqual((ranks[1]["attached"], ranks[1]["seconds_since_take"], ranks[1]["lag_batches"]),
                         (False, -1, 4), "rank 1's ring is full and never taken from")
        text = self.ctl(d, "consumers")
        self.assertRegex(text, rf"\n0 +{c.pid} +epoch \d+ batch \d+ \(seq \d+\)")
        self.assertRegex(text, r"\n1 +- +epoch 0 batch 0 \(seq 0\) +0 +4 +never")
        status = json.loads(self.ctl(d, "status", "--json"))
        self.assertGreater(status["uptime_s"], 2)
        self.assertRegex(status["config_hash"], r"^[0-9a-f]{16}$")
        self.assertGreater(status["process"]["rss_bytes"], 1e6)
        self.assertIn("errors: 0", self.ctl(d, "status"))

        # One frame is a window's figures, not zeros (issue #60: `top --iterations 1` printed 0).
        frames = self.ctl(d, "top", "--iterations", "1").split("mmfeedd it (pid")
        self.assertEqual(len(frames), 2, frames)
        rows = {l.split()[0]: l.split() for l in frames[1].splitlines() if l.strip()}
        self.assertGreater(float(rows["image"][-1]), 0, "image items/s over the last second")
        self.assertIn("host: CPU", frames[1])
        self.assertEqual(len(self.ctl(d, "top", "--iterations", "2").split("mmfeedd it (pid")), 3)
        lines = self.ctl(d, "top", "--iterations", "2", "--json").splitlines()
        self.assertEqual(len(lines), 2)
        self.assertEqual([json.loads(l)["pipeline"] for l in lines], ["it", "it"])

        # On a terminal: clears the screen each second and quits on q.
        import pty
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(f"{daemon_test.BIN}/mmfeedctl", ["mmfeedctl", "--socket", d.socket, "top"])
        out = b""
        deadline = time.time() + 10
        while b"items/s" not in out and time.time() < deadline:
            out += os.read(fd, 65536)
        self.assertIn(b"\x1b[H\x1b[2J", out)
        os.write(fd, b"q")
        t0 = time.time()
        while time.time() - t0 < 5:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            try:
                os.read(fd, 65536)
            except OSError:
                pass
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            self.fail("top did not quit on q")
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        os.close(fd)
        c.kill()
        c.communicate()
        self.assertEqual(json.loads(self.ctl(d, "stop", "--json")), {"stopping": True})


class UnitTest(unittest.TestCase):
    """`cmake --install` puts a unit that systemd accepts, and snippets that make the user,
    group and folders it names."""

    def setUp(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="mmfeed-unit-"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_installed_unit_verifies_and_the_snippets_make_user_and_folders(self):
        for tool in ("systemd-analyze", "systemd-sysusers", "systemd-tmpfiles"):
            if not shutil.which(tool):
                self.skipTest(f"{tool} not installed (scripts/setup.sh installs systemd)")
        build = pathlib.Path(daemon_test.BIN).parent
        prefix = self.dir / "usr"
        r = subprocess.run(["cmake", "--install", str(build), "--prefix", str(prefix)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        unit = prefix / "lib/systemd/system/mmfeed.service"
        text = unit.read_text()
        self.assertIn(f"ExecStart={prefix}/bin/mmfeedd --config /etc/mmfeed/pipeline.yaml", text)
        self.assertIn(f"ExecReload={prefix}/bin/mmfeedctl --socket /run/mmfeed/mmfeed.sock", text)
        for option in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=read-only", "PrivateTmp=yes",
                       "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "LockPersonality=yes",
                       "RestrictRealtime=yes", "SystemCallArchitectures=native", "MemoryDenyWriteExecute=yes",
                       "StateDirectory=mmfeed", "WatchdogSec=", "LimitNOFILE="):
            self.assertIn(option, text)
        # Warnings (an unknown key, a missing binary) go to stderr: none is allowed.
        r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, cwd=unit.parent)
        self.assertEqual((r.returncode, r.stderr.strip()), (0, ""), r.stdout)
        root = self.dir / "root"
        (root / "etc").mkdir(parents=True)
        r = subprocess.run(["systemd-sysusers", f"--root={root}", str(prefix / "lib/sysusers.d/mmfeed.conf")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        passwd = (root / "etc/passwd").read_text()
        user = [l.split(":") for l in passwd.splitlines() if l.startswith("mmfeed:")]
        self.assertEqual(len(user), 1, passwd)
        if os.geteuid() != 0:  # what came before is checked; the rest gives folders to the user
            self.skipTest("systemd-tmpfiles giving the folders to the mmfeed user needs root")
        r = subprocess.run(["systemd-tmpfiles", f"--root={root}", "--create", str(prefix / "lib/tmpfiles.d/mmfeed.conf")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        st = (root / "run/mmfeed").stat()
        self.assertEqual((st.st_mode & 0o777, st.st_uid, st.st_gid), (0o750, int(user[0][2]), int(user[0][3])))
        self.assertTrue((root / "var/lib/mmfeed").is_dir())


if __name__ == "__main__":
    daemon_test.main()
