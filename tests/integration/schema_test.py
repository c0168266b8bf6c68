#!/usr/bin/env python3
"""mmfeedd --schema: the config's JSON Schema (engine/config_schema.h) is valid draft 2020-12,
every shipped config validates against it, and it refuses what ParseConfig refuses by shape
(an unknown key or parameter, a wrong type, a missing required key).

usage: schema_test.py --bin BUILD/bin
"""
import argparse, json, pathlib, subprocess, sys, unittest

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


def main():
    global BIN
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args, rest = ap.parse_known_args()
    BIN = args.bin
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
