// Runs SQL statements in DuckDB (@duckdb/node-api, an independent Parquet writer installed by
// scripts/setup.sh into build-tools/), one thread so rows keep their order; prints the last
// statement's rows as JSON lines. The integration tests write their Parquet datasets with it.
// usage: node duckdb_sql.mjs DUCKDB_MODULE_DIR STATEMENT...
import { createRequire } from 'node:module';
import path from 'node:path';

const [moduleDir, ...statements] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(moduleDir), 'package.json'));
const { DuckDBInstance } = require('@duckdb/node-api');
const db = await DuckDBInstance.create(':memory:');
const c = await db.connect();
await c.run('SET threads = 1');
let rows = [];
for (const s of statements) rows = (await c.runAndReadAll(s)).getRowObjectsJson();
for (const r of rows) console.log(JSON.stringify(r));
