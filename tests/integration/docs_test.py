#!/usr/bin/env python3
"""The docs run: every shell and Python block of README.md and docs/guide/*.md runs against the
real binaries (a page's blocks in order, in one bash session, as a user would paste them), and
the docs site builds with `mkdocs build --strict` and renders in headless Chromium.

A block runs unless a marker on the line before it says otherwise:
  <!-- docs-test: skip: REASON -->   not run (a Slurm launch, an install as root): printed
  <!-- docs-test: file: NAME -->     written to NAME in the session's folder, not run
  <!-- docs-test: before: SHELL -->  SHELL runs just before the block (the user's own setting:
                                     their data folder, a daemon the text says is running)
  <!-- docs-test: after: SHELL -->   SHELL runs once the page's blocks ran (clean-up)
  <!-- docs-test: expect: TEXT -->   the block's output must contain TEXT
A `sh` or `python` block without a marker must run; cpp, yaml and text blocks are not run
(yaml ones must parse). The user's data for "~/photos" is made from tests/data/photos.

usage: docs_test.py --bin BUILD/bin --python BUILD/python [--no-site]
"""
import argparse, http.server, json, os, pathlib, re, shutil, socketserver, subprocess, sys, tempfile
import threading, time, unittest, urllib.parse, urllib.request

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
BIN = PY = None
SITE = True
MARK = re.compile(r"^<!-- docs-test: (skip|file|before|after|expect): ?(.*?) ?-->$")
FENCE = re.compile(r"^( *)```(\w*)\s*$")


def blocks(path):
    """[(lang, text, {marker: [values]}, line)] of a Markdown page's fenced blocks, and the
    page's `after` markers."""
    lines = path.read_text().split("\n")
    out, marks, after, i = [], {}, [], 0
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        if m and m.group(1) == "after":
            after.append(m.group(2))
            i += 1
            continue
        if m:
            marks.setdefault(m.group(1), []).append(m.group(2))
            i += 1
            continue
        f = FENCE.match(lines[i])
        if f:
            indent, lang, start = len(f.group(1)), f.group(2), i + 1
            j = start
            while not re.match(r"^ *```\s*$", lines[j]):
                j += 1
            text = "\n".join(l[indent:] for l in lines[start:j]) + "\n"
            out.append((lang, text, marks, start))
            marks, i = {}, j + 1
            continue
        if lines[i].strip():
            marks = {}  # a marker binds to the block right after it
        i += 1
    return out, after


def make_photos(home):
    """The quickstart's "folder of your photos": JPEGs, each with a caption in a .txt."""
    photos = home / "photos"
    photos.mkdir(parents=True)
    src = sorted((ROOT / "tests/data/photos").glob("*.jpg"))
    words = "a photo of the lake at dawn with a small red house and mountains behind".split()
    for k in range(4):
        for n, p in enumerate(src):
            name = f"{p.stem}_{k}"
            shutil.copy(p, photos / f"{name}.jpg")
            (photos / f"{name}.txt").write_text(" ".join(words[(n + k) % 5:(n + k) % 5 + 6]) + "\n")


class DocsRun(unittest.TestCase):
    def run_page(self, page):
        tmp = pathlib.Path(tempfile.mkdtemp(prefix="mmfeed-docs-"))
        try:
            home = tmp / "home"
            make_photos(home)
            shim = tmp / "shim"
            shim.mkdir()
            (shim / "python3").symlink_to("/usr/bin/python3")  # Debian's python3, with torch
            work = tmp / "work"
            work.mkdir()
            # The build under test stands where the docs say build/ is: run from a copy of the
            # repository's root whose build/ is this build's (a CI tree may build elsewhere).
            repo = tmp / "repo"
            repo.mkdir()
            for entry in ROOT.iterdir():
                if entry.name not in ("build", ".git"):
                    (repo / entry.name).symlink_to(entry)
            (repo / "build").mkdir()
            (repo / "build" / "bin").symlink_to(pathlib.Path(BIN).resolve())
            (repo / "build" / "python").symlink_to(pathlib.Path(PY).resolve())
            script = ["set -e", f"cd {work}",
                      "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
            expects, ran, skipped = [], 0, []
            page_blocks, after = blocks(page)
            for lang, text, marks, line in page_blocks:
                # Sockets under the test's own folder: other tests may run beside this one.
                text = text.replace("/tmp/mmfeed", f"{tmp}/mmfeed")
                if "skip" in marks:
                    self.assertTrue(marks["skip"][0], f"{page}:{line}: a skip needs its reason")
                    skipped.append(f"{page.name}:{line} ({marks['skip'][0]})")
                    continue
                if "file" in marks:
                    script.append(f"cat > {marks['file'][0]} <<'DOCS_TEST_EOF'\n{text}DOCS_TEST_EOF")
                    if lang == "yaml":
                        yaml.safe_load(text)
                    continue
                if lang == "yaml":
                    yaml.safe_load(text)  # an example must at least be YAML
                    continue
                if lang not in ("sh", "python"):
                    continue
                for b in marks.get("before", []):
                    script.append(b.replace("/tmp/mmfeed", f"{tmp}/mmfeed"))
                script.append(f"echo '=== {page.name}:{line}'")
                if lang == "sh":
                    script.append(text)
                else:
                    script.append(f"python3 - <<'DOCS_TEST_EOF'\n{text}DOCS_TEST_EOF")
                for e in marks.get("expect", []):
                    expects.append((line, e))
                ran += 1
            script += [a.replace("/tmp/mmfeed", f"{tmp}/mmfeed") for a in after]
            env = dict(os.environ, MMFEED_REPO=str(repo), DOCS_TEST_HOME=str(home),
                       PATH=f"{shim}:{os.environ['PATH']}", MMFEED_SOCKET=f"{tmp}/mmfeed.sock")
            r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, env=env,
                               capture_output=True, text=True, timeout=400)
            out = r.stdout + r.stderr
            print(f"{page.relative_to(ROOT)}: {ran} block(s) run, {len(skipped)} skipped: "
                  + "; ".join(skipped))
            self.assertEqual(r.returncode, 0, f"{page}: a block failed:\n{out[-6000:]}")
            for line, e in expects:
                self.assertIn(e, r.stdout, f"{page}:{line}: expected '{e}' in:\n{r.stdout[-3000:]}")
            return ran
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_readme(self):
        self.assertGreaterEqual(self.run_page(ROOT / "README.md"), 4)

    def test_quickstart(self):
        self.assertGreaterEqual(self.run_page(ROOT / "docs/guide/quickstart.md"), 6)

    def test_guide_pages(self):
        for page in sorted((ROOT / "docs/guide").glob("*.md")):
            if page.name != "quickstart.md":
                with self.subTest(page=page.name):
                    self.run_page(page)

    def test_every_runnable_block_runs_or_says_why_not(self):
        """A sh or python block with neither a skip nor a file marker is run; the markers are
        spelt right (a misspelt marker would silently run nothing)."""
        for page in [ROOT / "README.md", *sorted((ROOT / "docs/guide").glob("*.md"))]:
            for line in page.read_text().split("\n"):
                if "docs-test" in line:
                    self.assertRegex(line.strip(), MARK, f"{page}: a malformed marker")


class Site(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not SITE:
            raise unittest.SkipTest("--no-site")
        for tool in ("mkdocs", "chromium"):
            if not shutil.which(tool):
                raise unittest.SkipTest(f"{tool} is not installed (scripts/setup.sh installs it)")
        cls.tmp = pathlib.Path(tempfile.mkdtemp(prefix="mmfeed-site-"))
        cls.site = cls.tmp / "site"
        r = subprocess.run(["mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d",
                            str(cls.site)], capture_output=True, text=True, timeout=300)
        cls.build_output = r.stdout + r.stderr
        cls.build_rc = r.returncode
        handler_cls = type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                           {"log_message": lambda *a: None})
        cls.httpd = socketserver.TCPServer(("127.0.0.1", 0),
                                           lambda *a: handler_cls(*a, directory=str(cls.site)))
        threading.Thread(target=cls.httpd.serve_forever, daemon=True).start()
        cls.base = f"http://127.0.0.1:{cls.httpd.server_address[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.httpd.shutdown()
        cls.httpd.server_close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def dom(self, url, budget_ms=8000):
        r = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                            "--disable-dev-shm-usage", f"--user-data-dir={self.tmp}/profile",
                            f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        return r.stdout

    def test_builds_strict(self):
        self.assertEqual(self.build_rc, 0, self.build_output[-4000:])
        for page in ("index.html", "guide/quickstart.html", "reference/config.html",
                     "reference/cli.html", "benchmarks/index.html", "changelog.html"):
            self.assertTrue((self.site / page).exists(), page)

    def test_quickstart_renders_with_its_code_blocks(self):
        html = self.dom(f"{self.base}/guide/quickstart.html")
        self.assertIn("<h1", html)
        self.assertGreaterEqual(html.count("<code"), 8)
        self.assertIn("mmfeedd --check pipeline.yaml", html)
        self.assertIn("MmfeedDataset", html)
        self.assertIn("Your data", html)  # the navigation rendered

    def test_search_finds_a_config_key(self):
        """Types a key into the site's search box (Chromium driven over its DevTools
        protocol) and reads the results the search worker lists."""
        try:
            import websocket
        except ImportError:
            self.skipTest("python3-websocket is not installed (scripts/setup.sh installs it)")
        proc = subprocess.Popen(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                 "--disable-dev-shm-usage", "--remote-debugging-port=0",
                                 f"--user-data-dir={self.tmp}/cdp", "about:blank"],
                                stderr=subprocess.PIPE, text=True)
        try:
            port = None
            for line in proc.stderr:
                m = re.search(r"DevTools listening on ws://127.0.0.1:(\d+)/", line)
                if m:
                    port = m.group(1)
                    break
            self.assertIsNotNone(port, "chromium printed no DevTools address")
            tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=30))
            ws = websocket.create_connection(
                [t for t in tabs if t["type"] == "page"][0]["webSocketDebuggerUrl"], timeout=150)
            seq = [0]

            def call(method, **params):
                seq[0] += 1
                ws.send(json.dumps({"id": seq[0], "method": method, "params": params}))
                while True:
                    r = json.loads(ws.recv())
                    if r.get("id") == seq[0]:
                        return r

            def evaluate(js):
                r = call("Runtime.evaluate", expression=js, awaitPromise=True, returnByValue=True)
                return r.get("result", {}).get("result", {}).get("value")

            def search(query, tenths=300):
                # A page of its own per query, loaded before anything is typed.
                url = f"{self.base}/index.html?query={urllib.parse.quote(query)}"
                call("Page.navigate", url=url)
                deadline = time.monotonic() + 30
                while evaluate("document.readyState === 'complete' && location.href") != url:
                    self.assertLess(time.monotonic(), deadline, f"{url} did not load")
                    time.sleep(0.1)
                # Typed once the search worker has built its index (the result list says
                # "Initializing search" until then: a query typed before is never answered),
                # and typed again every 2 s (cleared first: the same value twice is one query).
                js = ("(async () => {"
                      "const sleep = () => new Promise(r => setTimeout(r, 100));"
                      "for (let k = 0; k < 100 && !document.querySelector('input.md-search__input'); k++)"
                      "  await sleep();"
                      "const i = document.querySelector('input.md-search__input');"
                      "const meta = () => (document.querySelector('.md-search-result__meta') || {}).textContent || '';"
                      "for (let k = 0; k < 600 && meta().includes('Initializing'); k++) await sleep();"
                      "const type = v => { i.value = v;"
                      "  i.dispatchEvent(new Event('input', {bubbles: true}));"
                      "  i.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true})); };"
                      f"i.focus(); type({json.dumps(query)});"
                      f"for (let k = 0; k < {tenths}; k++) {{"
                      f"  if (k % 20 == 19) {{ type(''); type({json.dumps(query)}); }}"
                      "  await sleep();"
                      "  const l = document.querySelectorAll('.md-search-result__item a');"
                      "  if (l.length) return Array.from(l).map(a => a.href).join(' ');"
                      "}"
                      "return '';})()")
                return evaluate(js) or ""

            for key in ("ring_slots", "shuffle_window", "cache_budget", "drop_last"):
                hits = search(key).split()
                self.assertTrue(hits, f"the search found nothing for {key}")
                for url in hits[:5]:  # each result's page has the key
                    page = url.split(self.base + "/", 1)[1].split("?")[0]
                    self.assertIn(key, (self.site / page).read_text(), f"{key}: {url}")
            self.assertEqual(search("zzqqxxnotaword", tenths=100), "")
            ws.close()
        finally:
            proc.kill()
            proc.wait()
            proc.stderr.close()


def main():
    global BIN, PY, SITE
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--no-site", action="store_true")
    a, rest = ap.parse_known_args()
    BIN, PY, SITE = a.bin, a.python, not a.no_site
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
