#!/usr/bin/env python3
"""The Python package (issue #32): `pip wheel` of ./client/python makes a wheel (offline, with
Debian's setuptools and the headers scripts/setup.sh installs, --no-build-isolation); it
installs into a real virtual environment made with --system-site-packages (numpy and torch from
Debian), where `import mmfeed` and `mmfeed.torch` work from outside the source tree and a
trainer in the venv gets, through MmfeedDataset and a DataLoader, every sample the real daemon
serves.

usage: pip_test.py --bin BUILD/bin
"""
import json, pathlib, subprocess, sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import daemon_test as dt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


class PipTest(dt.DaemonCase):
    def test_a_wheel_installs_into_a_venv_and_feeds_a_trainer(self):
        venv, wheels = self.dir / "venv", self.dir / "wheels"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        r = subprocess.run([*pip, "wheel", "--no-build-isolation", "--no-index", "--no-deps", "-w", str(wheels),
                            str(ROOT / "client" / "python")], capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-3000:])
        built = sorted(wheels.glob("mmfeed-*.whl"))
        self.assertEqual(len(built), 1, r.stdout)
        r = subprocess.run([*pip, "install", "--no-index", "--no-deps", str(built[0])], capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)

        with open(self.dir / "manifest.jsonl", "w") as f:
            for i in range(40):
                f.write(json.dumps({"id": f"s{i:02d}", "text": f"caption {i}"}) + "\n")
        d = dt.Daemon(self.dir, """pipeline: pip
source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 2, epochs: 1}
stages:
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 16}}
  - {name: batch, type: batch, inputs: [text], params: {batch_size: 4}}
""")
        trainer = self.dir / "trainer.py"
        trainer.write_text(f"""import json, sys, torch
import mmfeed, mmfeed.torch
assert "site-packages" in mmfeed.__file__, mmfeed.__file__
ds = mmfeed.torch.MmfeedDataset(socket={d.socket!r}, rank=0)
ids = []
for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0):
    assert batch["text"].shape == (4, 16), batch["text"].shape
    ids += batch["ids"]
print(json.dumps({{"ids": ids, "module": mmfeed.__file__}}))
""")
        # From a folder outside the source tree: the venv's package, not build/python.
        r = subprocess.run([str(venv / "bin" / "python"), str(trainer)], cwd=self.dir, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertTrue(out["module"].startswith(str(venv)), out["module"])
        self.assertEqual(sorted(out["ids"]), [f"s{i:02d}" for i in range(40)])
        self.assertEqual(d.wait(), 0, d.log())


if __name__ == "__main__":
    dt.main()
