#!/usr/bin/env python3
"""`source: {type: parquet}` (issue #62) against the real daemon, on Parquet files written by an
independent writer (DuckDB, @duckdb/node-api, installed by scripts/setup.sh): the same samples
as a manifest with files and as a Hugging Face dataset folder (images inside, as
struct<bytes, path>) give identical batches, ids, captions and image tensors; `fields:` maps
other columns and paths into structs; a missing or mistyped column and an unknown split are named
at --check; a damaged file and a damaged row group are skipped and named, the rest served.

usage: parquet_source_test.py --bin BUILD/bin --duckdb PATH/node_modules/@duckdb/node-api
"""
import argparse, json, os, pathlib, re, subprocess, sys, unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import daemon_test as dt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
DUCKDB = None


def duckdb(*statements):
    """Runs SQL in DuckDB (tests/data/parquet/duckdb_sql.mjs); the last statement's rows."""
    p = subprocess.run(["node", str(ROOT / "tests/data/parquet/duckdb_sql.mjs"), DUCKDB, *statements],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(f"DuckDB failed: {p.stderr[-3000:]}")
    return [json.loads(line) for line in p.stdout.splitlines()]


def manifest_rows(d):
    """The manifest's rows with their images' bytes, in manifest order, as a DuckDB subquery."""
    return f"""(SELECT m.id, m.text, {{'bytes': b.content, 'path': m.image}} AS image, m.n FROM
      (SELECT *, row_number() OVER () AS n FROM read_json('{d}/manifest.jsonl',
        format='newline_delimited', columns={{id: 'VARCHAR', image: 'VARCHAR', text: 'VARCHAR'}})) m
      JOIN read_blob('{d}/*.jpg') b ON parse_filename(b.filename) = m.image)"""


class ParquetSource(dt.DaemonCase):
    def setUp(self):
        super().setUp()
        self.ids = dt.make_dataset(self.dir, 60)
        rows = manifest_rows(self.dir)
        hf = self.dir / "hf" / "data"
        hf.mkdir(parents=True)
        # A Hub-style folder: two files of the train split (row groups of 8; the second zstd), and
        # a test split.
        duckdb(f"COPY (SELECT id, text, image FROM {rows} WHERE n <= 35 ORDER BY n) TO "
               f"'{hf}/train-00000-of-00002.parquet' (FORMAT parquet, ROW_GROUP_SIZE 8)",
               f"COPY (SELECT id, text, image FROM {rows} WHERE n > 35 ORDER BY n) TO "
               f"'{hf}/train-00001-of-00002.parquet' (FORMAT parquet, ROW_GROUP_SIZE 8, COMPRESSION zstd)",
               f"COPY (SELECT 't' || id AS id, text, image FROM {rows} WHERE n <= 5 ORDER BY n) TO "
               f"'{hf}/test-00000-of-00001.parquet' (FORMAT parquet)")

    def config(self, source, consumers=2):
        """daemon_test's image-text pipeline over `source` (a `source:` mapping in YAML)."""
        cfg = dt.CONFIG.format(consumers=consumers, workers=2, placement="", batch=8, seed=0, epochs=1,
                               source_type="SOURCE", path="")
        return cfg.replace("source: {type: SOURCE, path: , shuffle: true, seed: 0, epochs: 1}",
                           f"source: {source}")

    def run_dumps(self, source, name, consumers=2):
        d = dt.Daemon(self.dir, self.config(source, consumers))
        outs = [dt.finish(c) for c in [d.consume(r, "--json", "--dump", str(self.dir / f"{name}{r}"))
                                       for r in range(consumers)]]
        self.assertEqual(d.wait(), 0, d.log())
        return [[(meta, {t.name: t.read_bytes() for t in sorted(p.glob("*.npy"))})
                 for meta, p in dt.dumped_batches(self.dir / f"{name}{r}")] for r in range(consumers)], d.log()

    def check(self, source):
        (self.dir / "c.yaml").write_text(self.config(source))
        return subprocess.run([f"{dt.BIN}/mmfeedd", "--check", str(self.dir / "c.yaml")], capture_output=True,
                              text=True, timeout=60)

    def test_a_hugging_face_folder_gives_the_batches_the_manifest_does(self):
        want, _ = self.run_dumps("{type: manifest, path: manifest.jsonl, shuffle: true, seed: 4}", "m")
        got, log = self.run_dumps("{type: parquet, path: hf, shuffle: true, seed: 4}", "p")
        self.assertEqual(sum(len(meta["ids"]) for rank in got for meta, _ in rank), 60)
        for r in range(2):
            self.assertEqual([m["ids"] for m, _ in got[r]], [m["ids"] for m, _ in want[r]], f"rank {r}: ids")
            for (gm, gt), (wm, wt) in zip(got[r], want[r]):
                self.assertEqual(sorted(gt), ["image.npy", "text.npy", "text_lengths.npy"])
                self.assertTrue(gt == wt, f"rank {r}, batch {gm['seq']}: the image and text tensors")
        self.assertIn("samples skipped: 0", log)
        # The test split: its own rows.
        got, _ = self.run_dumps("{type: parquet, path: hf, split: test}", "t", consumers=1)
        self.assertEqual([i for m, _ in got[0] for i in m["ids"]], [f"t{i}" for i in self.ids[:5]])

    def test_fields_map_columns_globs_and_paths_into_structs(self):
        rows = manifest_rows(self.dir)
        for sub in ("flat", "ints"):
            (self.dir / sub).mkdir()
        # Other names, the image as plain bytes in one column and as a struct read by its path
        # (picture.bytes) in another; integer ids in another file.
        duckdb(f"COPY (SELECT id, text AS caption, image.bytes AS jpg, image AS picture FROM {rows} ORDER BY n) "
               f"TO '{self.dir}/flat/part-0.parquet' (FORMAT parquet, ROW_GROUP_SIZE 7, COMPRESSION gzip)",
               f"COPY (SELECT n AS id, text AS caption, image.bytes AS jpg FROM {rows} ORDER BY n) "
               f"TO '{self.dir}/ints/part-0.parquet' (FORMAT parquet)")
        want, _ = self.run_dumps("{type: manifest, path: manifest.jsonl}", "m", consumers=1)
        for k, mapping in enumerate(("{text: caption, image: jpg}", "{text: caption, image: picture.bytes}")):
            with self.subTest(mapping):
                got, _ = self.run_dumps(f"{{type: parquet, path: 'flat/*.parquet', fields: {mapping}}}", f"f{k}-",
                                        consumers=1)
                self.assertEqual([m["ids"] for m, _ in got[0]], [m["ids"] for m, _ in want[0]])
                self.assertTrue([t for _, t in got[0]] == [t for _, t in want[0]], "the tensors")
        got, _ = self.run_dumps("{type: parquet, path: 'i*/part-{0..0}.parquet', fields: {text: caption, image: jpg}}",
                                "i", consumers=1)
        self.assertEqual([i for m, _ in got[0] for i in m["ids"]], [str(n) for n in range(1, 61)])

    def test_a_missing_or_mistyped_column_and_an_unknown_split_are_named_at_check(self):
        p = self.check("{type: parquet, path: hf, fields: {text: caption}}")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("train-00000-of-00002.parquet: no column 'caption' for field 'text' (its columns: id, text, "
                      "image); name the column that holds it with `fields: {text: COLUMN}`", p.stderr + p.stdout)
        duckdb(f"COPY (SELECT id, text, 7::BIGINT AS image FROM {manifest_rows(self.dir)}) TO "
               f"'{self.dir}/int.parquet' (FORMAT parquet)")
        p = self.check("{type: parquet, path: int.parquet}")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("int.parquet: column 'image' is INT64: field 'image' reads bytes, a path, or an Image or "
                      "Audio struct<bytes, path>", p.stderr + p.stdout)
        p = self.check("{type: parquet, path: hf, split: validation}")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no Parquet files of split 'validation'", p.stderr + p.stdout)
        self.assertIn("the splits there: test, train", p.stderr + p.stdout)
        p = self.check("{type: parquet, path: 'nothing-*.parquet'}")
        self.assertIn("no file matches", p.stderr + p.stdout)
        p = self.check("{type: parquet, path: hf}")
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)

    def test_a_damaged_file_is_skipped_and_named(self):
        # The second file's footer forged: its metadata's length past the file.
        second = self.dir / "hf" / "data" / "train-00001-of-00002.parquet"
        b = bytearray(second.read_bytes())
        b[-8:-4] = (len(b) * 2).to_bytes(4, "little")
        second.write_bytes(bytes(b))
        got, log = self.run_dumps("{type: parquet, path: hf}", "p", consumers=1)
        self.assertEqual([i for m, _ in got[0] for i in m["ids"]], self.ids[:35], "the first file's rows, in order")
        self.assertIn(f"skipped {second} (source): its footer claims", log)

    def many_captions(self):
        """captions.jsonl and many.parquet: 5,000 captions, the Parquet file in row groups of
        2,048 (DuckDB groups rows by 2,048-row vectors); returns its path and metadata."""
        with open(self.dir / "captions.jsonl", "w") as f:
            for i in range(5000):
                f.write(json.dumps({"id": f"c{i:05d}", "text": f"caption {i}"}) + "\n")
        many = self.dir / "many.parquet"
        duckdb(f"COPY (SELECT * FROM read_json('{self.dir}/captions.jsonl', format='newline_delimited', "
               f"columns={{id: 'VARCHAR', text: 'VARCHAR'}})) TO '{many}' (FORMAT parquet, ROW_GROUP_SIZE 2048)")
        meta = json.loads(subprocess.run([f"{dt.BIN}/mmfeed-parquet", str(many)], capture_output=True, text=True,
                                         check=True).stdout)
        self.assertEqual([g["num_rows"] for g in meta["row_groups"]], [2048, 2048, 904])
        return many, meta

    def text_run(self, source, name):
        """A text-only pipeline over `source`, 2 ranks: per rank, per batch (ids, tokens)."""
        cfg = (f"pipeline: t\nsource: {source}\nconsumers: 2\nstages:\n"
               "  - {name: text, type: text, field: text, params: {tokenizer: bytes, max_len: 16}}\n"
               "  - {name: batch, type: batch, inputs: [text], params: {batch_size: 50}}\n"
               "output: {ring_slots: 4}\non_error: skip\n")
        d = dt.Daemon(self.dir, cfg)
        for c in [d.consume(r, "--json", "--dump", str(self.dir / f"{name}{r}")) for r in range(2)]:
            dt.finish(c)
        self.assertEqual(d.wait(), 0, d.log())
        return [[(m["ids"], (p / "text.npy").read_bytes()) for m, p in dt.dumped_batches(self.dir / f"{name}{r}")]
                for r in range(2)], d.log()

    def test_row_groups_over_the_cache_are_decoded_again_and_a_damaged_one_is_skipped(self):
        """5,000 captions in row groups of 2,048 (DuckDB groups by 2,048-row vectors): the same
        batches as the manifest, shuffled, with a cache too small for every row group (each
        decoded again when dropped); then row group 1's first page header overwritten: its rows
        are skipped, named, and the others served."""
        many, meta = self.many_captions()
        want, _ = self.text_run("{type: manifest, path: captions.jsonl, shuffle: true, seed: 9}", "m")
        got, _ = self.text_run("{type: parquet, path: many.parquet, shuffle: true, seed: 9, "
                               "row_group_cache_bytes: 300K}", "p")
        self.assertTrue(got == want, "the same ids and tokens, batch by batch")
        chunk = meta["row_groups"][1]["columns"][0]
        b = bytearray(many.read_bytes())
        at = chunk["dictionary_page_offset"] or chunk["data_page_offset"]
        b[at:at + 16] = b"\xff" * 16
        many.write_bytes(bytes(b))
        got, log = self.text_run("{type: parquet, path: many.parquet}", "d")
        # Every row of the other row groups, none of row group 1's (the batches' rows that failed
        # are refilled with other samples of the rank's share: some come twice).
        ids = {i for rank in got for batch, _ in rank for i in batch}
        self.assertEqual(ids, {f"c{i:05d}" for i in list(range(2048)) + list(range(4096, 5000))})
        self.assertRegex(log, rf"skipped {re.escape(str(many))}:row (2\d\d\d|3\d\d\d|40\d\d) \(source\): "
                              r"row group 1: column 'id': page header at chunk byte 0")
        self.assertIn("samples skipped: 2048", log)

    def test_windows_of_row_groups_read_one_row_group_at_a_time(self):
        """shuffle_window over row groups (as over shards): row groups in a seeded order, the rows
        of each window permuted among themselves; with a window of one row group, the epoch's
        first 2,048 positions are one row group's rows, every row is dealt once, and a cache of
        about one decoded row group suffices."""
        self.many_captions()
        got, log = self.text_run("{type: parquet, path: many.parquet, shuffle: true, seed: 3, shuffle_window: 1, "
                                 "row_group_cache_bytes: 300K}", "w")
        ids = [[i for batch, _ in rank for i in batch] for rank in got]
        order = [ids[p % 2][p // 2] for p in range(len(ids[0]) + len(ids[1]))]  # position p: rank p % 2
        self.assertEqual(len(order), 5000)
        self.assertEqual(sorted(order), [f"c{i:05d}" for i in range(5000)], "every row once")
        groups = [int(i[1:]) // 2048 for i in order]
        runs = [g for k, g in enumerate(groups) if k == 0 or g != groups[k - 1]]
        self.assertEqual(sorted(runs), [0, 1, 2], f"one run per row group, in a seeded order: {runs}")
        self.assertNotEqual(order[:2048], sorted(order[:2048]), "the rows of a window shuffled")
        self.assertIn("samples skipped: 0", log)

    def test_a_parquet_source_in_a_mixture(self):
        cfg = self.config("{type: manifest, path: manifest.jsonl}", consumers=1).replace(
            "source: {type: manifest, path: manifest.jsonl}",
            "sources:\n  - {name: pq, type: parquet, path: hf, repeat: 1}\n"
            "  - {name: m, type: manifest, path: manifest.jsonl, repeat: 1}\n"
            "mix: {mode: epochs, seed: 1, epochs: 1}")
        d = dt.Daemon(self.dir, cfg)
        out = dt.finish(d.consume(0, "--json", "--dump", str(self.dir / "x")))
        self.assertEqual(d.wait(), 0, d.log())
        ids = [i for m, _ in dt.dumped_batches(self.dir / "x") for i in m["ids"]]
        self.assertEqual(sorted(ids), sorted(self.ids * 2), out)


def main():
    global DUCKDB
    ap = argparse.ArgumentParser()
    ap.add_argument("--duckdb", required=True)
    a, rest = ap.parse_known_args()
    DUCKDB = os.path.abspath(a.duckdb)
    if not pathlib.Path(DUCKDB).is_dir():
        sys.exit(f"DuckDB's node module not found at {DUCKDB}: scripts/setup.sh installs it from npm")
    sys.argv = [sys.argv[0], *rest]
    dt.main()


if __name__ == "__main__":
    main()
