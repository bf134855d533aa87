#!/usr/bin/env node
// Reference GPT-2 token ids from the JavaScript encoder of the npm package
// gpt-3-encoder (fetched by tools/fetch-corpus.sh), for tokenizer_vs_js.
//
//   node reference_encode.js ENCODER_DIR text  INPUT OUTPUT   # whole file = 1 document
//   node reference_encode.js ENCODER_DIR jsonl INPUT OUTPUT   # one {"text": ...} per line
//
// Writes one line per document: its ids separated by spaces. The input is
// read as UTF-8, so invalid bytes become U+FFFD as node's decoder makes them.
'use strict';
const fs = require('fs');
const path = require('path');

const [encoderDir, mode, input, output] = process.argv.slice(2);
if (!output || !['text', 'jsonl'].includes(mode)) {
  console.error('usage: reference_encode.js ENCODER_DIR text|jsonl INPUT OUTPUT');
  process.exit(2);
}
const { encode } = require(path.join(path.resolve(encoderDir), 'Encoder.js'));

const contents = fs.readFileSync(input, 'utf8');
const documents = mode === 'text'
  ? [contents]
  : contents.split('\n').filter(line => line.length > 0).map(line => JSON.parse(line).text);
const lines = documents.map(text => encode(text).join(' ') + '\n');
fs.writeFileSync(output, lines.join(''));
