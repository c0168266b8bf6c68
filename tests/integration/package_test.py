#!/usr/bin/env python3
"""The Debian package (issue #32): scripts/package.sh makes it from the build and lintian finds
no warning; `apt-get install ./mmfeed_*.deb` installs it on this machine (the system user, its
folders, the unit); the installed mmfeedd --check's the installed example config and feeds the
installed Python module; removal leaves the state, purge leaves nothing the package made but
the system user (Debian keeps system users).

Skipped, saying why, without root, without dpkg-deb, cpack or lintian, or when an mmfeed
package is installed already (the test would replace it).

usage: package_test.py --bin BUILD/bin
"""
import json, os, pathlib, shutil, subprocess, sys, unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import daemon_test as dt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
WATCHED = ["/usr", "/etc", "/var/lib", "/run"]
# Files a package install touches that are not the package's: dpkg's and apt's records, the
# shadow files' backups systemd-sysusers makes when it adds the user.
NOT_OURS = ("/var/lib/dpkg", "/var/lib/apt", "/var/lib/systemd", "/run/systemd", "/run/user", "/run/lock",
            "/etc/passwd-", "/etc/group-", "/etc/shadow-", "/etc/gshadow-", "/etc/ld.so.cache")


def tree():
    paths = set()
    for top in WATCHED:
        for dirpath, dirs, files in os.walk(top):
            if dirpath.startswith(NOT_OURS):
                dirs[:] = []
                continue
            paths.update(os.path.join(dirpath, n) for n in dirs + files)
    return {p for p in paths if not p.startswith(NOT_OURS) and "mmfeed-it-" not in p}


def run(*cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


class PackageTest(dt.DaemonCase):
    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("installing a package needs root")
        missing = [t for t in ("dpkg-deb", "cpack", "lintian", "apt-get") if not shutil.which(t)]
        if missing:
            self.skipTest(f"needs {', '.join(missing)} (scripts/setup.sh installs lintian and dpkg-dev)")
        if run("dpkg-query", "-W", "-f=${Status}", "mmfeed").stdout.startswith("install"):
            self.skipTest("an mmfeed package is installed on this machine; this test would replace it")
        self.build = pathlib.Path(dt.BIN).parent

    def test_the_package_installs_runs_and_purges_without_a_trace(self):
        # Made as from a tree whose files are 0664 (`git archive` extracted with umask 002) under
        # that umask: the package sets its files' modes itself (it once installed a 0664 unit).
        installed = [ROOT / p for p in ("daemon/systemd/mmfeed.service.in", "daemon/systemd/mmfeed.sysusers",
                                        "daemon/systemd/mmfeed.tmpfiles", "README.md", "configs/demo.yaml")]
        modes = {p: p.stat().st_mode for p in installed}
        try:
            for p in installed:
                p.chmod(0o664)
            made = subprocess.run(["bash", str(ROOT / "scripts/package.sh")], capture_output=True, text=True,
                                  timeout=600, env={**os.environ, "BUILD_DIR": str(self.build)},
                                  preexec_fn=lambda: os.umask(0o002))
        finally:
            for p, m in modes.items():
                p.chmod(m & 0o7777)
        self.assertEqual(made.returncode, 0, made.stdout[-3000:] + made.stderr[-3000:])
        self.assertIn("lintian: no warning", made.stdout)
        debs = sorted(self.build.glob("mmfeed_*_amd64.deb"))
        self.assertEqual(len(debs), 1, debs)
        deb = debs[0]
        listing = run("dpkg-deb", "-c", str(deb)).stdout.splitlines()
        self.assertTrue(listing)
        for line in listing:
            mode = line.split()[0]
            self.assertIn(mode, ("drwxr-xr-x", "-rw-r--r--", "-rwxr-xr-x", "lrwxrwxrwx"), line)
        info = run("dpkg-deb", "-f", str(deb), "Depends").stdout
        for lib in ("libyaml-cpp", "libavcodec", "libturbojpeg", "python3-numpy"):  # shlibdeps' and ours
            if lib == "libturbojpeg" and "libjpeg62-turbo" in info:
                continue
            self.assertIn(lib, info)

        before = tree()
        self.addCleanup(run, "dpkg", "--purge", "mmfeed")
        inst = run("apt-get", "install", "-y", "--no-install-recommends", str(deb),
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        self.assertEqual(inst.returncode, 0, inst.stdout[-3000:] + inst.stderr[-3000:])
        self.assertEqual(run("getent", "passwd", "mmfeed").returncode, 0, "the system user")
        st = os.stat("/var/lib/mmfeed")
        self.assertEqual((st.st_uid, oct(st.st_mode & 0o777)), (int(run("id", "-u", "mmfeed").stdout), "0o750"))
        for f in ("/usr/bin/mmfeedd", "/usr/bin/mmfeedctl", "/usr/bin/mmfeed-consume",
                  "/usr/lib/systemd/system/mmfeed.service", "/usr/share/doc/mmfeed/copyright"):
            self.assertTrue(os.path.exists(f), f)
        unit = pathlib.Path("/usr/lib/systemd/system/mmfeed.service").read_text()
        self.assertIn("ExecStart=/usr/bin/mmfeedd ", unit)

        # The installed example config, over a small data set beside it.
        d = self.dir
        dt.make_dataset(d, 40)
        shutil.copy("/usr/share/doc/mmfeed/examples/demo.yaml", d / "demo.yaml")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        chk = run("/usr/bin/mmfeedd", "--check", str(d / "demo.yaml"), env=env)
        self.assertEqual(chk.returncode, 0, chk.stdout + chk.stderr)

        # The installed daemon feeding the installed Python module (Debian's python3, no path).
        (d / "t.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "text": f"line {i}"}) + "\n"
                                           for i in range(24)))
        (d / "t.yaml").write_text("""pipeline: installed
source: {type: manifest, path: t.jsonl, epochs: 1}
consumers: 1
stages:
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 8}}
  - {name: batch, type: batch, inputs: [text], params: {batch_size: 4}}
""")
        sock = str(d / "installed.sock")
        with open(d / "installed.log", "w") as log:
            daemon = subprocess.Popen(["/usr/bin/mmfeedd", "--config", str(d / "t.yaml"), "--socket", sock],
                                      stderr=log, env=env)
        try:
            py = run("/usr/bin/python3", "-c", f"""
import mmfeed, mmfeed.torch
assert mmfeed.__file__.startswith("/usr/lib/python3/dist-packages/"), mmfeed.__file__
ids = [i for b in mmfeed.Client(socket={sock!r}, rank=0, reconnect_s=30) for i in b.ids]
print(len(ids))
""", env=env, cwd="/")
            self.assertEqual(py.returncode, 0, py.stdout + py.stderr + (d / "installed.log").read_text())
            self.assertEqual(py.stdout.split(), ["24"])
            self.assertEqual(daemon.wait(60), 0)
        finally:
            if daemon.poll() is None:
                daemon.kill()
            daemon.wait()

        rm = run("dpkg", "--remove", "mmfeed")
        self.assertEqual(rm.returncode, 0, rm.stdout + rm.stderr)
        self.assertNotIn("not empty", rm.stdout + rm.stderr)  # byte code left in the module folder
        self.assertFalse(os.path.exists("/usr/bin/mmfeedd"))
        self.assertTrue(os.path.isdir("/var/lib/mmfeed"), "removal keeps the service's state")
        purge = run("dpkg", "--purge", "mmfeed")
        self.assertEqual(purge.returncode, 0, purge.stdout + purge.stderr)
        after = tree()
        self.assertEqual(sorted(after - before), [], "left behind by the purge")
        self.assertEqual(sorted(before - after), [], "removed by the package but not its own")


if __name__ == "__main__":
    dt.main()
