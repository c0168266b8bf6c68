#!/usr/bin/env python3
"""mmfeedd --schema: the config's JSON Schema (engine/config_schema.h) is valid draft 2020-12,
every shipped config validates against it, and it refuses what ParseConfig refuses by shape
(an unknown key or parameter, a wrong type, a missing required key).

usage: schema_test.py --bin BUILD/bin
"""
import argparse, json, pathlib, re, subprocess, sys, unittest

import jsonschema
import yaml

BIN = None
ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

GOOD = """
pipeline: s
source: {type: manifest, path: manifest.jsonl, shuffle: true, seed: 3}
consumers: 2
stages:
  - {name: image, type: image, field: image, workers: auto,
     cache: {max_bytes: 1G, disk: {dir: /nvme/samples, max_bytes: 2G}},
     params: {size: [224, 224], crop: random_resized_crop, dtype: float32}}
  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 32}}
  - {name: batch, type: batch, inputs: [image, text], params: {batch_size: 8}}
output: {ring_slots: 4}
data_roots: any
cpu_budget: 4
"""


class SchemaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        out = subprocess.run([f"{BIN}/mmfeedd", "--schema"], capture_output=True, text=True, check=True).stdout
        cls.schema = json.loads(out)
        jsonschema.Draft202012Validator.check_schema(cls.schema)
        cls.validator = jsonschema.Draft202012Validator(cls.schema)

    def errors(self, text):
        return [e.message for e in self.validator.iter_errors(yaml.safe_load(text))]

    def test_every_shipped_config_validates(self):
        configs = sorted((ROOT / "configs").glob("*.yaml"))
        self.assertGreater(len(configs), 5)
        for c in configs:
            self.assertEqual(self.errors(c.read_text()), [], c)

    def test_a_good_config_validates(self):
        self.assertEqual(self.errors(GOOD), [])

    def test_mistakes_are_found(self):
        for change, why in (
            (("size: [224, 224]", "sise: [224, 224]"), "unknown parameter"),
            (("batch_size: 8", "batch_size: eight"), "a string where an integer goes"),
            (("crop: random_resized_crop", "crop: random"), "not one of the choices"),
            (("size: [224, 224]", "size: [224]"), "a list of the wrong length"),
            (("workers: auto", "workers: 0"), "workers below 1"),
            (("ring_slots: 4", "ring_slots: 1000"), "ring_slots past 496"),
            (("data_roots: any", "data_roots: anywhere"), "data_roots neither any nor a list"),
            (("type: manifest, ", ""), "a source without a type"),
            (("inputs: [image, text], ", ""), "a batch stage without inputs"),
            (("consumers: 2", "consumerz: 2"), "an unknown top-level key"),
            ((", max_bytes: 2G}", "}"), "a cache's disk tier without max_bytes"),
        ):
            text = GOOD.replace(*change)
            self.assertNotEqual(text, GOOD, why)
            self.assertNotEqual(self.errors(text), [], why)

    def check(self, text):
        """mmfeedd --check of `text` on a two-sample manifest: (exit status, output)."""
        import shutil, tempfile
        with tempfile.TemporaryDirectory(prefix="mmfeed-schema-") as d:
            d = pathlib.Path(d)
            photo = ROOT / "tests/data/photos/photo00.jpg"
            shutil.copy(photo, d / "a.jpg")
            (d / "manifest.jsonl").write_text('{"id": "a", "image": "a.jpg", "text": "t"}\n' * 2)
            (d / "p.yaml").write_text(text.replace("/nvme/samples", str(d / "tier")))
            r = subprocess.run([f"{BIN}/mmfeedd", "--check", str(d / "p.yaml")], capture_output=True, text=True,
                               timeout=60)
            return r.returncode, r.stdout + r.stderr

    def test_the_parser_and_the_schema_refuse_the_same_out_of_range_numbers(self):
        """Each number below is refused by the parser (naming the line) and by the schema: they
        once disagreed (`batch_size: -1` passed --schema)."""
        self.assertEqual(self.check(GOOD)[0], 0, self.check(GOOD)[1])
        for change in (
                ("batch_size: 8", "batch_size: -1"), ("batch_size: 8", "batch_size: 0"),
                ("batch_size: 8", "batch_size: 8, max_tokens: -1"), ("max_len: 32", "max_len: 0"),
                ("max_len: 32", "max_len: 16777217"), ("size: [224, 224]", "size: [0, 224]"),
                ("size: [224, 224]", "size: [224, 16385]"), ("dtype: float32", "dtype: float32, flip: 1.5"),
                ("dtype: float32", "dtype: float32, resize: -1"), ("dtype: float32", "dtype: float32, max_pixels: 0"),
                ("ring_slots: 4", "ring_slots: 1"), ("ring_slots: 4", "ring_slots: 497"),
                ("consumers: 2", "consumers: 0"), ("workers: auto", "workers: 0"), ("cpu_budget: 4", "cpu_budget: 0"),
                ("seed: 3", "seed: -1"), ("cpu_budget: 4", "cpu_budget: 4\nsample_timeout_s: -1"),
                ("cpu_budget: 4", "cpu_budget: 4\nsample_timeout_s: 86401")):
            text = GOOD.replace(*change)
            self.assertNotEqual(text, GOOD, change)
            code, out = self.check(text)
            self.assertEqual(code, 2, f"the parser accepts {change[1]!r}: {out}")
            self.assertRegex(out, r"p\.yaml:\d+:\d+: ", change)
            self.assertNotEqual(self.errors(text), [], f"the schema accepts {change[1]!r}")
        # And the other way: every range the schema gives a parameter of these stages, one below
        # its minimum or above its maximum, is refused by the parser too.
        stage = self.schema["properties"]["stages"]["items"]
        params = {c["if"]["properties"]["type"]["const"]: c["then"]["properties"]["params"]["properties"]
                  for c in stage["allOf"]}
        tried = 0
        for index, kind in ((0, "image"), (1, "text"), (2, "batch")):
            for name, p in params[kind].items():
                number = p.get("items", p) if p.get("type") == "array" else p
                for bound, step in (("minimum", -1), ("maximum", 1)):
                    if bound not in number or number.get("type") not in ("integer", "number"):
                        continue
                    value = number[bound] + step
                    value = int(value) if number["type"] == "integer" else value
                    cfg = yaml.safe_load(GOOD)
                    cfg["stages"][index]["params"][name] = [value] * p.get("minItems", 1) \
                        if p.get("type") == "array" else value
                    text = json.dumps(cfg)
                    self.assertNotEqual(self.errors(text), [], (kind, name, value))
                    code, out = self.check(text)
                    self.assertEqual(code, 2, f"{kind}.{name}: {value} passes the parser: {out}")
                    tried += 1
        self.assertGreater(tried, 8)

    def test_every_stage_type_and_parameter_of_the_registry_is_described(self):
        listing = subprocess.run([f"{BIN}/mmfeedd", "--list-stages"], capture_output=True, text=True,
                                 check=True).stdout
        stage = self.schema["properties"]["stages"]["items"]
        types = stage["properties"]["type"]["enum"]
        params = {c["if"]["properties"]["type"]["const"]: c["then"]["properties"]["params"]["properties"]
                  for c in stage["allOf"]}
        self.assertEqual(sorted(types), sorted(params))
        for t in types:
            self.assertIn(t, listing)
            for name, p in params[t].items():
                self.assertIn(name, listing, f"{t}.{name}")
                self.assertTrue(p.get("description"), f"{t}.{name} has no description")

    def test_the_generated_reference_covers_every_key_the_schema_knows(self):
        """docs/reference/config.md (scripts/gen_reference.py) has a row for every key of the
        schema, with the schema's default, and a section for every stage type's parameters."""
        page = (ROOT / "docs/reference/config.md").read_text()
        rows = {}
        for line in page.splitlines():
            if line.startswith("| `"):
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
                rows.setdefault(cells[0].strip("`"), []).append(cells)

        def walk(props, prefix):
            for name, s in props.items():
                key = prefix + name
                self.assertIn(key, rows, f"{key} is not in docs/reference/config.md")
                if "default" in s:
                    self.assertTrue(any(json.dumps(s["default"]) in r[2] for r in rows[key]), key)
                if "x-default" in s:
                    self.assertTrue(any(s["x-default"] in r[2] for r in rows[key]), key)
                if s.get("type") == "object" and "properties" in s:
                    walk(s["properties"], key + ".")

        top = self.schema["properties"]
        walk({k: v for k, v in top.items() if k != "stages"}, "")
        walk({k: v for k, v in top["stages"]["items"]["properties"].items() if k != "params"}, "")
        for c in top["stages"]["items"]["allOf"]:
            t = c["if"]["properties"]["type"]["const"]
            self.assertIn(f"### `{t}`", page)


def main():
    global BIN
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args, rest = ap.parse_known_args()
    BIN = args.bin
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
