// Hugging Face tokenizers (the native build on npm) encoding the same corpus, single-threaded:
// RAYON_NUM_THREADS=1 and one encodeBatch call per pass over all lines. Prints JSON with MB/s
// over passes 2..N.   node tokenizer_reference_bench.js TOKENIZER.json CORPUS [PASSES]
const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');

(async () => {
  const [tokPath, corpusPath, passesArg] = process.argv.slice(2);
  const passes = Number(passesArg || 6);
  const tok = Tokenizer.fromFile(tokPath);
  const bytes = fs.readFileSync(corpusPath);
  const decoder = new TextDecoder('utf-8');
  const lines = [];
  let start = 0;
  for (let i = 0; i < bytes.length; ++i)
    if (bytes[i] === 0x0a) { lines.push(decoder.decode(bytes.subarray(start, i))); start = i + 1; }
  let seconds = 0;
  for (let p = 0; p < passes; ++p) {
    const t0 = process.hrtime.bigint();
    await tok.encodeBatch(lines, { addSpecialTokens: false });
    if (p > 0) seconds += Number(process.hrtime.bigint() - t0) / 1e9;
  }
  console.log(JSON.stringify({ lines: lines.length, mb_per_s: bytes.length * (passes - 1) / 1e6 / seconds }));
})();
