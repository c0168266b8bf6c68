// Writes the Parquet test files with DuckDB (an independent writer: @duckdb/node-api, installed
// by scripts/setup.sh into build-tools/), and beside each `<name>.parquet` DuckDB's own reading
// of its metadata and values, `<name>.reference.json` (parquet_metadata, parquet_schema, and
// each leaf column's values in file order, nulls left out), which the tests hold mmfeed's reader
// against.
// usage: node write_files.mjs DUCKDB_MODULE_DIR OUT_DIR
import { createRequire } from 'node:module';
import path from 'node:path';
import fs from 'node:fs';

const [moduleDir, out] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(moduleDir), 'package.json'));
const { DuckDBInstance } = require('@duckdb/node-api');
fs.mkdirSync(out, { recursive: true });
const db = await DuckDBInstance.create(':memory:');
const c = await db.connect();
await c.run('SET threads = 1');  // values in file order

// HF `datasets` keeps images as struct<bytes: binary, path: string> and chats as
// list<struct<role, content>>; captions repeat (dictionary pages), some values are null.
const rows = `SELECT i AS id,
    'caption ' || (i % 7) AS text,
    CASE WHEN i % 5 = 0 THEN NULL ELSE i * 0.25 END AS score,
    {'bytes': repeat(chr((65 + i % 26)::INTEGER), (10 + i % 50)::INTEGER)::BLOB, 'path': 'img' || i || '.jpg'} AS image,
    [{'role': 'user', 'content': 'q' || i}, {'role': 'assistant', 'content': 'a' || i}] AS conversations,
    [i, i + 1, i + 2] AS numbers,
    i / 7.0 AS ratio,
    (i % 100)::FLOAT / 8 AS small
  FROM range(2000) t(i)`;
const files = {
  plain_uncompressed: "COMPRESSION uncompressed",
  snappy: "COMPRESSION snappy",
  gzip: "COMPRESSION gzip",
  zstd_row_groups: "COMPRESSION zstd, ROW_GROUP_SIZE 300",
  lz4: "COMPRESSION lz4",
  brotli: "COMPRESSION brotli",
  v2_pages: "COMPRESSION zstd, PARQUET_VERSION v2",
};
for (const [name, opts] of Object.entries(files)) {
  const file = path.join(out, `${name}.parquet`);
  await c.run(`COPY (${rows}) TO '${file}' (FORMAT parquet, ${opts})`);
  const meta = (await c.runAndReadAll(`SELECT row_group_id, row_group_num_rows, column_id,
      path_in_schema, type, compression, encodings, num_values, data_page_offset,
      dictionary_page_offset, total_compressed_size, total_uncompressed_size
      FROM parquet_metadata('${file}') ORDER BY row_group_id, column_id`)).getRowObjectsJson();
  const schema = (await c.runAndReadAll(`SELECT name, type, repetition_type, num_children,
      converted_type, logical_type FROM parquet_schema('${file}')`)).getRowObjectsJson();
  const count = (await c.runAndReadAll(`SELECT count(*) AS n FROM '${file}'`)).getRowObjectsJson();
  const column = async (sql) =>
    (await c.runAndReadAll(sql)).getRowObjectsJson().map((r) => r.v).filter((v) => v !== null);
  const values = {
    'id': await column(`SELECT id AS v FROM '${file}'`),
    'text': await column(`SELECT text AS v FROM '${file}'`),
    'image.bytes': await column(`SELECT image.bytes::VARCHAR AS v FROM '${file}'`),
    'image.path': await column(`SELECT image.path AS v FROM '${file}'`),
    'conversations.list.element.content':
        await column(`SELECT t.c.content AS v FROM (SELECT unnest(conversations) AS c FROM '${file}') t`),
    'conversations.list.element.role':
        await column(`SELECT t.c.role AS v FROM (SELECT unnest(conversations) AS c FROM '${file}') t`),
    'numbers.list.element': await column(`SELECT unnest(numbers) AS v FROM '${file}'`),
    'score': await column(`SELECT (score * 100)::BIGINT AS v FROM '${file}'`),
    'ratio': await column(`SELECT ratio AS v FROM '${file}'`),
    'small': await column(`SELECT small AS v FROM '${file}'`),
  };
  fs.writeFileSync(path.join(out, `${name}.reference.json`),
                   JSON.stringify({ metadata: meta, schema, rows: Number(count[0].n), values }));
}
