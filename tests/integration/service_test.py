#!/usr/bin/env python3
"""The node service: mmfeedd speaking the systemd notify protocol to a test datagram socket
(NOTIFY_SOCKET), and the unit files in daemon/systemd/.

usage: service_test.py --bin BUILD/bin
"""
import argparse, os, pathlib, shutil, signal, socket, subprocess, sys, tempfile, time, unittest

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

    def ctl(self, d, *args):
        return subprocess.run([f"{daemon_test.BIN}/mmfeedctl", "--socket", d.socket, *args],
                              capture_output=True, text=True, timeout=60)

    def test_ready_reloading_stopping_and_the_watchdog(self):
        env = {"NOTIFY_SOCKET": str(self.dir / "notify.sock"), "WATCHDOG_USEC": "300000"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            d = Daemon(self.dir, config(), extra=("--drain-timeout", "1"))
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
        m = self.next_message()
        self.assertEqual(m.get("READY"), "1", m)
        self.assertRegex(m["STATUS"], r"samples/s, \d+ batches published, 0/2 trainers attached")
        # No trainer takes anything: the rings fill and the pipeline is idle for a good reason,
        # so the watchdog keeps being fed (every 150 ms).
        time.sleep(1.5)
        self.pings = 0
        deadline = time.time() + 1.5
        while time.time() < deadline:
            try:
                self.next_message(timeout=deadline - time.time())
            except AssertionError:
                break
        self.assertGreaterEqual(self.pings, 5)

        (self.dir / "one.yaml").write_text(config(workers=1))
        self.assertEqual(self.ctl(d, "reload", "--config", str(self.dir / "one.yaml")).returncode, 0)
        m = self.next_message()
        self.assertEqual(m.get("RELOADING"), "1", m)
        self.assertRegex(m.get("MONOTONIC_USEC", ""), r"^\d+$")
        m = self.next_message()
        self.assertEqual(m.get("READY"), "1", m)

        (self.dir / "bad.yaml").write_text("pipeline: [\n")
        self.assertEqual(self.ctl(d, "reload", "--config", str(self.dir / "bad.yaml")).returncode, 1)
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
        self.assertEqual(d.wait(), 3, "the drain timed out with batches no trainer took")


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
        r = subprocess.run(["systemd-tmpfiles", f"--root={root}", "--create", str(prefix / "lib/tmpfiles.d/mmfeed.conf")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        st = (root / "run/mmfeed").stat()
        self.assertEqual((st.st_mode & 0o777, st.st_uid, st.st_gid), (0o750, int(user[0][2]), int(user[0][3])))
        self.assertTrue((root / "var/lib/mmfeed").is_dir())


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args, rest = ap.parse_known_args()
    daemon_test.BIN = os.path.abspath(args.bin)
    unittest.main(argv=[sys.argv[0], "-v"] + rest)
