#!/usr/bin/env node
// Reference BERT WordPiece ids from the JavaScript runtime of npm
// @lenml/tokenizers (transformers.js' tokenizers), for tokenizer_bert_vs_js.
// The tokenizer.json is built here from a vocab.txt as transformers'
// BertTokenizerFast builds it: BertNormalizer (clean_text,
// handle_chinese_chars, lowercase = strip_accents = the variant),
// BertPreTokenizer, WordPiece ("##", [UNK], 100 characters per word). No
// added tokens: "[CLS]" in the text is plain text, as in meshtron.
//
//   node reference_encode_bert.js DATA_DIR VOCAB_TXT lowercase|cased INPUT.jsonl OUTPUT
//
// Writes one line per {"text": ...} line: its ids, separated by spaces.
'use strict';
const fs = require('fs');
const path = require('path');

const [dataDir, vocabFile, variant, input, output] = process.argv.slice(2);
if (!output || !['lowercase', 'cased'].includes(variant)) {
  console.error('usage: reference_encode_bert.js DATA_DIR VOCAB_TXT lowercase|cased INPUT OUTPUT');
  process.exit(2);
}
const { TokenizerLoader } = require(path.join(path.resolve(dataDir), 'lenml-tokenizers', 'dist', 'main.js'));

const vocab = {};
fs.readFileSync(vocabFile, 'utf8').split('\n').forEach((token, id) => {
  if (token.length > 0) vocab[token] = id;
});
const lowercase = variant === 'lowercase';
const tokenizerJSON = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: [],
  normalizer: {
    type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true,
    strip_accents: lowercase, lowercase,
  },
  pre_tokenizer: { type: 'BertPreTokenizer' },
  post_processor: null,
  decoder: { type: 'WordPiece', prefix: '##', cleanup: true },
  model: {
    type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##',
    max_input_chars_per_word: 100, vocab,
  },
};
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON,
  tokenizerConfig: { tokenizer_class: 'BertTokenizer', do_lower_case: lowercase },
});

const texts = fs.readFileSync(input, 'utf8').split('\n')
  .filter(line => line.length > 0).map(line => JSON.parse(line).text);
const lines = texts.map(text => tokenizer.encode(text, { add_special_tokens: false }).join(' ') + '\n');
fs.writeFileSync(output, lines.join(''));
