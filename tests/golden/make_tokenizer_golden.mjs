// Writes tests/data/tokenizer/r50k_golden.tsv: text (hex of its UTF-8 bytes) TAB token ids,
// encoded by the npm package gpt-tokenizer (an independent JavaScript implementation of
// tiktoken's r50k_base / GPT-2 encoding). Run once; the C++ tests compare against the file.
//   mkdir /tmp/tokgold && cd /tmp/tokgold && npm pack gpt-tokenizer@4.0.0 &&
//   npm install ./gpt-tokenizer-4.0.0.tgz && cp <repo>/tests/golden/make_tokenizer_golden.mjs . &&
//   node make_tokenizer_golden.mjs <repo>     (node resolves the package next to the script)
import { encode } from 'gpt-tokenizer/encoding/r50k_base';
import { readFileSync, writeFileSync } from 'node:fs';
import { execSync } from 'node:child_process';

const repo = process.argv[2];
const texts = [
  'Hello world', ' Hello world', 'Hello, world!', '\n\n', '33333',
  "I'm sure they'll say it's fine, we've done what you'd've DONE'S",
  'tabs\tand   multiple    spaces  \n  and trailing   ',
  'naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어',
  'emoji 👍🏽 and 🧑‍🚀 and symbols ©®™ ∑∫√',
  'numbers 1234567890 3.14159 1e-5 0x1F 12,345,678',
  'code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }',
  '   leading spaces and a final newline\n',
  '\r\nwindows\r\nlines\r\n',
  'A'.repeat(300),
  ' '.repeat(17) + 'x',
];
// Real text: slices of the King James Bible (bible-kjv), the project's default corpus.
const kjv = execSync('bible -f "Gen1:1-Gen3:24"').toString();
texts.push(kjv.slice(0, 4000), kjv.slice(4000, 9000));
const lines = texts.map(t => Buffer.from(t, 'utf8').toString('hex') + '\t' + encode(t).join(' '));
writeFileSync(`${repo}/tests/data/tokenizer/r50k_golden.tsv`, lines.join('\n') + '\n');
console.log(`wrote ${lines.length} cases`);
