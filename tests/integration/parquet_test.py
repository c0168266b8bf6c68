#!/usr/bin/env python3
"""Parquet files as mmfeed's reader sees them (source/parquet/, mmfeed-parquet), held against
an independent writer and reader: DuckDB (@duckdb/node-api, installed by scripts/setup.sh)
writes the files (every codec Parquet names that DuckDB writes, several row groups, data pages
v1 and v2, dictionary pages, nulls, an HF-style image struct and chat list) and reads their
metadata back (parquet_metadata, parquet_schema); mmfeed-parquet must say the same. Then the
files are tampered with (truncated, magic changed, the footer's length forged, bytes of the
metadata flipped): each is refused with the file named and a reason, never a crash or a hang.

usage: parquet_test.py --bin BUILD/bin --duckdb PATH/node_modules/@duckdb/node-api
"""
import argparse, json, os, pathlib, random, shutil, subprocess, sys, tempfile, unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
BIN = DUCKDB = None
FILES = None  # the folder DuckDB wrote


def dump(path):
    p = subprocess.run([f"{BIN}/mmfeed-parquet", str(path)], capture_output=True, text=True, timeout=60)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else None), p.stderr


class Parquet(unittest.TestCase):
    def test_metadata_matches_duckdbs_reading(self):
        names = sorted(f.stem for f in FILES.glob("*.parquet"))
        self.assertGreaterEqual(len(names), 7, names)
        for name in names:
            with self.subTest(name):
                ref = json.loads((FILES / f"{name}.reference.json").read_text())
                rc, got, err = dump(FILES / f"{name}.parquet")
                self.assertEqual(rc, 0, err)
                self.assertEqual(got["num_rows"], ref["rows"])
                # The schema, element by element (the root included).
                self.assertEqual(len(got["schema"]), len(ref["schema"]))
                for mine, theirs in zip(got["schema"], ref["schema"]):
                    self.assertEqual(mine["name"], theirs["name"])
                    self.assertEqual(mine["type"], theirs["type"])
                    self.assertEqual(mine["repetition"], theirs["repetition_type"])
                    self.assertEqual(mine["num_children"], int(theirs["num_children"] or 0))
                # Every column chunk of every row group.
                chunks = [(g, c) for g in got["row_groups"] for c in g["columns"]]
                self.assertEqual(len(chunks), len(ref["metadata"]))
                groups = {int(m["row_group_id"]) for m in ref["metadata"]}
                self.assertEqual(len(got["row_groups"]), len(groups))
                for (g, c), m in zip(chunks, ref["metadata"]):
                    where = f"{name}: row group {m['row_group_id']}, column {m['path_in_schema']}"
                    self.assertEqual(g["num_rows"], int(m["row_group_num_rows"]), where)
                    self.assertEqual(c["path"], m["path_in_schema"].replace(", ", "."), where)
                    self.assertEqual(c["codec"], m["compression"], where)
                    self.assertEqual(", ".join(c["encodings"]), m["encodings"], where)
                    for k in ("num_values", "data_page_offset", "total_compressed_size",
                              "total_uncompressed_size"):
                        self.assertEqual(c[k], int(m[k]), f"{where}: {k}")
                    dict_off = m["dictionary_page_offset"]
                    self.assertEqual(c["dictionary_page_offset"], int(dict_off) if dict_off else None, where)
                # Nested columns' levels: image.bytes is optional in an optional struct; each chat
                # turn's content sits in a list (repeated once).
                levels = {c["path"]: (c["max_definition_level"], c["max_repetition_level"]) for c in got["columns"]}
                self.assertEqual(levels["image.bytes"], (2, 0))
                self.assertEqual(levels["id"], (1, 0))
                self.assertEqual(levels["conversations.list.element.content"][1], 1)

    def test_values_match_duckdbs_reading(self):
        """Every leaf column's values, decoded (every codec, dictionary and plain pages, v1 and v2
        pages, nulls through definition levels, lists through repetition levels; v2's
        DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY and BYTE_STREAM_SPLIT), equal DuckDB's
        reading of the same file."""
        refused = set()
        for f in sorted(FILES.glob("*.parquet")):
            ref = json.loads((FILES / f"{f.stem}.reference.json").read_text())["values"]
            for column, want in ref.items():
                with self.subTest(f"{f.stem} {column}"):
                    p = subprocess.run([f"{BIN}/mmfeed-parquet", "--values", column, str(f)],
                                       capture_output=True, text=True, timeout=60)
                    if p.returncode != 0:
                        self.assertRegex(p.stderr, rf"{f}: column '{column}': encoding (DELTA_\w+|BYTE_STREAM_SPLIT) "
                                                   r"is not read yet")
                        refused.add(f.stem)
                        continue
                    got = json.loads(p.stdout)
                    values = got["values"]
                    if column == "score":  # DECIMAL(22, 2) as 16 big-endian bytes
                        values = [int.from_bytes(bytes.fromhex(v["hex"]) if isinstance(v, dict) else v.encode(),
                                                 "big", signed=True) for v in values]
                        # non-null where the definition level is the column's maximum (1)
                        self.assertEqual(sum(1 for d in got["definition"] if d == 1), len(want))
                    if column in ("ratio", "small"):  # DOUBLE and FLOAT (v2: BYTE_STREAM_SPLIT)
                        self.assertEqual([float(v) for v in values], [float(v) for v in want])
                    else:
                        self.assertEqual([str(v) for v in values], [str(v) for v in want])
                    if column.startswith("conversations") or column.startswith("numbers"):
                        # a new row where the repetition level is 0: one per row
                        self.assertEqual(got["repetition"].count(0), 2000)
        self.assertEqual(refused, set(), "every encoding DuckDB writes is read (v2: the DELTA ones)")

    def test_the_writers_codecs_and_page_kinds_are_all_there(self):
        codecs, encodings = set(), set()
        for f in FILES.glob("*.parquet"):
            rc, got, err = dump(f)
            self.assertEqual(rc, 0, err)
            for g in got["row_groups"]:
                for c in g["columns"]:
                    codecs.add(c["codec"])
                    encodings.update(c["encodings"])
        self.assertLessEqual({"UNCOMPRESSED", "SNAPPY", "GZIP", "ZSTD", "BROTLI"}, codecs)
        self.assertTrue(codecs & {"LZ4", "LZ4_RAW"}, codecs)
        self.assertIn("RLE_DICTIONARY", encodings | {e.replace("PLAIN_DICTIONARY", "RLE_DICTIONARY") for e in encodings})

    def test_tampered_files_are_refused_naming_the_file_and_why(self):
        src = (FILES / "zstd_row_groups.parquet").read_bytes()
        meta_len = int.from_bytes(src[-8:-4], "little")
        cases = {
            "truncated": src[:-100],
            "empty": b"",
            "magic": src[:-4] + b"PARX",
            "encrypted": src[:-4] + b"PARE",
            "length-forged": src[:-8] + (len(src) * 3).to_bytes(4, "little") + b"PAR1",
            "length-short": src[:-8] + (meta_len // 2).to_bytes(4, "little") + b"PAR1",
            "no-leading-magic-room": b"PAR1" + src[-8:],
        }
        rng = random.Random(5)
        for k in range(40):  # bytes of the metadata flipped
            b = bytearray(src)
            for _ in range(1 + k % 4):
                at = len(src) - 8 - 1 - rng.randrange(meta_len)
                b[at] ^= 1 << rng.randrange(8)
            cases[f"flipped-{k}"] = bytes(b)
        refused = set()
        with tempfile.TemporaryDirectory() as d:
            for name, data in cases.items():
                with self.subTest(name):
                    f = pathlib.Path(d) / f"{name}.parquet"
                    f.write_bytes(data)
                    rc, got, err = dump(f)
                    self.assertIn(rc, (0, 1), err)  # never a crash (a signal) or a usage error
                    if rc == 1:
                        refused.add(name)
                        self.assertIn(str(f), err)
                        self.assertEqual(len(err.strip().splitlines()), 1, err)
                    else:  # a flip the format cannot see (a size or an offset still inside)
                        self.assertTrue(name.startswith("flipped"), name)
                        for g in got["row_groups"]:
                            for c in g["columns"]:
                                self.assertLessEqual(c["data_page_offset"] + c["total_compressed_size"],
                                                     len(data))
        self.assertLessEqual({"truncated", "empty", "magic", "encrypted", "length-forged", "length-short",
                              "no-leading-magic-room"}, refused)
        self.assertGreaterEqual(len(refused), 7 + 20, "most flips are caught by the checks")

    def test_not_a_file_and_missing_are_refused(self):
        for path in ("/nonexistent/x.parquet", "/tmp"):
            rc, _, err = dump(path)
            self.assertEqual(rc, 1)
            self.assertIn(path, err)


def main():
    global BIN, DUCKDB, FILES
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--duckdb", required=True, help="the @duckdb/node-api package folder")
    a, rest = ap.parse_known_args()
    BIN = os.path.abspath(a.bin)
    DUCKDB = os.path.abspath(a.duckdb)
    tmp = tempfile.mkdtemp(prefix="mmfeed-parquet-")
    try:
        FILES = pathlib.Path(tmp)
        subprocess.run(["node", str(ROOT / "tests" / "data" / "parquet" / "write_files.mjs"), DUCKDB, tmp],
                       check=True, timeout=300)
        result = unittest.main(module="__main__", argv=[sys.argv[0], "-v", *rest], exit=False).result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
