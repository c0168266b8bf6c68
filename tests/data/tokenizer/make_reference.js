// Regenerates reference_ids.jsonl: the token ids Hugging Face `tokenizers` gives each line of
// corpus.txt with the Qwen3 tokenizer (no special tokens added). Lines are split on '\n' and
// decoded as UTF-8 with U+FFFD replacement (WHATWG), as Node reads text.
//
//   cd tests/data/tokenizer && npm install --no-save @anush008/tokenizers@0.6.0 && \
//     gunzip -kf qwen3-tokenizer.json.gz && node make_reference.js && rm qwen3-tokenizer.json
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('@anush008/tokenizers');

(async () => {
  const tok = Tokenizer.fromFile(path.join(__dirname, 'qwen3-tokenizer.json'));
  const bytes = fs.readFileSync(path.join(__dirname, 'corpus.txt'));
  const decoder = new TextDecoder('utf-8');
  const out = [];
  let start = 0;
  for (let i = 0; i < bytes.length; ++i) {
    if (bytes[i] !== 0x0a) continue;
    const line = decoder.decode(bytes.subarray(start, i));
    const enc = await tok.encode(line, null, { addSpecialTokens: false });
    out.push(JSON.stringify(Array.from(enc.getIds())));
    start = i + 1;
  }
  fs.writeFileSync(path.join(__dirname, 'reference_ids.jsonl'), out.join('\n') + '\n');
  console.log(`${out.length} lines`);
})();
