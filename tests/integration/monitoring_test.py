#!/usr/bin/env python3
"""The monitoring files (daemon/monitoring/): Prometheus alert rules checked and unit-tested by
promtool, every Grafana panel's query a valid PromQL expression, and every metric the rules and
the dashboard name one a real mmfeedd serves on /metrics (a mixture, so that the per-source
metrics are there too).

usage: monitoring_test.py --bin BUILD/bin
"""
import json, pathlib, re, shutil, subprocess, sys, tempfile, time, unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import daemon_test as dt  # noqa: E402
import service_test  # noqa: E402

MONITORING = pathlib.Path(__file__).resolve().parent.parent.parent / "daemon" / "monitoring"
METRIC = re.compile(r"\b((?:mmfeed|process)_[a-z_]+)\b")


def dashboard_exprs():
    panels = json.loads((MONITORING / "dashboard.json").read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]]


class MonitoringTest(dt.DaemonCase):
    def setUp(self):
        super().setUp()
        if not shutil.which("promtool"):
            self.skipTest("promtool not installed (scripts/setup.sh installs prometheus)")

    def promtool(self, *args, cwd=MONITORING):
        r = subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_the_alert_rules_pass_promtool_and_their_unit_tests(self):
        self.assertIn("SUCCESS: 7 rules found", self.promtool("check", "rules", "alerts.yml"))
        self.assertIn("SUCCESS", self.promtool("test", "rules", "alerts_test.yml"))

    def test_every_dashboard_query_is_valid_promql(self):
        exprs = dashboard_exprs()
        self.assertGreaterEqual(len(exprs), 10)
        ids = [p["id"] for p in json.loads((MONITORING / "dashboard.json").read_text())["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids are unique")
        # Each query as a recording rule (the $instance variable as Grafana expands "All").
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"panel:{k}", "expr": e.replace("$instance", ".*")} for k, (_, e) in enumerate(exprs)]}]}
        path = self.dir / "dashboard_rules.yml"
        path.write_text(json.dumps(rules))
        self.assertIn(f"SUCCESS: {len(exprs)} rules found", self.promtool("check", "rules", str(path)))

    def test_every_metric_named_is_one_the_daemon_serves(self):
        named = set(METRIC.findall((MONITORING / "alerts.yml").read_text()))
        named |= {m for _, e in dashboard_exprs() for m in METRIC.findall(e)}
        self.assertGreaterEqual(len(named), 15)
        for name, rows in (("a", 40), ("b", 40)):
            (self.dir / f"{name}.jsonl").write_text(
                "".join(json.dumps({"id": f"{name}{i}", "text": f"caption {i}"}) + "\n" for i in range(rows)))
        port = service_test.free_port()
        d = dt.Daemon(self.dir, f"""pipeline: monitoring
sources:
  - {{name: a, type: manifest, path: a.jsonl, weight: 1}}
  - {{name: b, type: manifest, path: b.jsonl, weight: 1}}
mix: {{epochs: 0}}
consumers: 1
stages:
  - {{name: text, type: text, field: text, params: {{tokenizer: bytes, max_len: 16}}}}
  - {{name: batch, type: batch, inputs: [text], params: {{batch_size: 4}}}}
metrics: {{listen: "127.0.0.1:{port}"}}
""")
        dt.finish(d.consume(0, "--batches", "5"))
        deadline = time.time() + 10
        while True:  # rendered every 500 ms: wait for the per-source families
            page = service_test.scrape(port)[2]
            if "mmfeed_source_samples_total" in page or time.time() > deadline:
                break
            time.sleep(0.1)
        served = set(re.findall(r"^# TYPE (\S+) ", page, re.M))
        self.assertEqual(sorted(named - served), [], "metrics the rules or the dashboard name but the daemon lacks")


if __name__ == "__main__":
    dt.main()
