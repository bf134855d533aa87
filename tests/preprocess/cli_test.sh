#!/usr/bin/env bash
# Runs the real `meshtron preprocess` through mpiexec and checks what a user
# sees: identical output on any number of ranks, one-line errors naming
# file:line with no files left behind, and refusal to overwrite.
#
#   cli_test.sh MESHTRON FIXTURE_DIR WORK_DIR DATA_DIR MPIEXEC [FLAGS] NUMPROC_FLAG -- CASE [ARGS]
#
# CASE:
#   run NP FORMAT [EXTRA...]  preprocess the fixture (FORMAT jsonl | txt | split)
#                             on NP ranks into WORK_DIR/FORMAT_npNP[EXTRA tag]
#   identical                 every dataset written by `run` equals jsonl_np1
#   bad KIND                  2 ranks, input with one bad line (utf8 | txt-utf8 |
#                             json | missing-key | non-string | two-errors)
#   overwrite                 an existing dataset is refused, then replaced
#                             with --overwrite
# Exits 77 (reported by CTest as skipped) when DATA_DIR has no GPT-2 vocabulary.
set -uo pipefail

meshtron="$1" fixtures="$2" work="$3" data="$4"; shift 4
launcher=()  # mpiexec [flags] -n ; the rank count is appended
while [[ $# -gt 0 && "$1" != "--" ]]; do launcher+=("$1"); shift; done
shift  # --
case_name="$1"; shift

fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -f "$data/encoder.json" && -f "$data/vocab.bpe" ]] || {
  echo "no GPT-2 vocabulary in $data (run tools/fetch-corpus.sh); skipping"; exit 77; }
mkdir -p "$work"

# preprocess NP PREFIX INPUT... [-- EXTRA FLAGS]: stdout/stderr to PREFIX.out/.err
preprocess() {
  local np="$1" prefix="$2"; shift 2
  local inputs=() extra=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do inputs+=("$1"); shift; done
  [[ "${1:-}" == "--" ]] && { shift; extra=("$@"); }
  local run=("${launcher[@]}" "$np")
  [[ "${launcher[0]}" == direct ]] && run=()
  "${run[@]}" "$meshtron" preprocess --input "${inputs[@]}" \
    --output-prefix "$prefix" --tokenizer gpt2 --vocab-file "$data/encoder.json" \
    --merge-file "$data/vocab.bpe" --append-eod "${extra[@]}" \
    >"$prefix.out" 2>"$prefix.err"
}

# The fixture split into two files at a line in the middle of a document of
# the plain text, to check that documents never span files.
split_inputs() {
  head -n 7 "$fixtures/fixture.jsonl" >"$work/split_a.jsonl"
  tail -n +8 "$fixtures/fixture.jsonl" >"$work/split_b.jsonl"
}

case_run() {
  local np="$1" format="$2"; shift 2
  local tag="" extra=()
  if [[ $# -gt 0 ]]; then extra=("$@"); tag="_$(echo "$*" | tr -dc 'a-z0-9')"; fi
  local prefix="$work/${format}_np${np}${tag}" inputs=()
  case "$format" in
    jsonl) inputs=("$fixtures/fixture.jsonl") ;;
    txt) inputs=("$fixtures/fixture.txt") ;;
    split) split_inputs; inputs=("$work/split_a.jsonl" "$work/split_b.jsonl") ;;
    *) fail "unknown format $format" ;;
  esac
  preprocess "$np" "$prefix" "${inputs[@]}" -- --overwrite "${extra[@]}" ||
    fail "preprocess on $np ranks failed: $(cat "$prefix.err")"
  [[ -s "$prefix.bin" && -s "$prefix.idx" ]] || fail "no $prefix.bin/.idx"
  grep -q "^preprocess: 20 documents (0 empty), [0-9]* tokens (uint16, EOD appended)" "$prefix.out" ||
    fail "summary line missing or wrong: $(cat "$prefix.out")"
  ls "$prefix".shard* 2>/dev/null && fail "shard files left behind"
  echo "ok: $(grep '^preprocess: 20' "$prefix.out")"
}

case_identical() {
  local reference="$work/jsonl_np1" count=0
  [[ -f "$reference.bin" ]] || fail "no $reference.bin (run the 'run' cases first)"
  for bin in "$work"/*_np*.bin; do
    local prefix="${bin%.bin}"
    cmp "$reference.bin" "$prefix.bin" || fail "$prefix.bin differs from $reference.bin"
    cmp "$reference.idx" "$prefix.idx" || fail "$prefix.idx differs from $reference.idx"
    echo "identical: $(basename "$prefix")"; count=$((count + 1))
  done
  [[ $count -ge 5 ]] || fail "only $count datasets compared"
}

# make_bad KIND FILE: the fixture with bad line(s); prints the expected "file:line: reason"
make_bad() {
  local kind="$1" file="$2" n=16  # line 16 lies in the second rank's half
  local bad
  case "$kind" in
    utf8) bad=$'{"text": "stray byte \xff here"}'; reason="invalid UTF-8" ;;
    json) bad='{"text": "unterminated}'; reason="not valid JSON" ;;
    missing-key) bad='{"body": "no text key"}'; reason='no key "text"' ;;
    non-string) bad='{"text": ["a", "list"]}'; reason='the value of "text" is array, not a string' ;;
    two-errors) bad='{"text": 1}'; reason='the value of "text" is number' ;;
    txt-utf8)
      # Plain text: the bad byte in the second line of a document, line 40.
      { head -n 38 "$fixtures/fixture.txt"; printf 'ok line\nbad \xfe line\n'; \
        tail -n +39 "$fixtures/fixture.txt"; } >"$file"
      echo "$file:40: invalid UTF-8"; return ;;
    *) fail "unknown bad kind $kind" ;;
  esac
  if [[ "$kind" == two-errors ]]; then
    # A bad line in each rank's half: the first in input order wins.
    { head -n 2 "$fixtures/fixture.jsonl"; echo "$bad"; tail -n +3 "$fixtures/fixture.jsonl" |
      head -n 13; echo '{"body": "later error"}'; tail -n +16 "$fixtures/fixture.jsonl"; } >"$file"
    echo "$file:3: $reason"; return
  fi
  { head -n $((n - 1)) "$fixtures/fixture.jsonl"; echo "$bad"; tail -n +$n "$fixtures/fixture.jsonl"; } >"$file"
  echo "$file:$n: $reason"
}

case_bad() {
  local kind="$1" dir="$work/bad_$1"
  rm -rf "$dir"; mkdir -p "$dir"
  local ext=jsonl; [[ "$kind" == txt-utf8 ]] && ext=txt
  local input="$dir/input.$ext"
  local expected; expected="$(make_bad "$kind" "$input")"
  local prefix="$dir/out"
  if preprocess 2 "$prefix" "$input"; then fail "bad input ($kind) was accepted"; fi
  local errors; errors="$(grep -c '^meshtron: error:' "$prefix.err")"
  [[ "$errors" == 1 ]] || fail "expected one error line, got $errors: $(cat "$prefix.err")"
  grep -qF "meshtron: error: $expected" "$prefix.err" ||
    fail "expected 'meshtron: error: $expected...', got: $(cat "$prefix.err")"
  [[ "$(grep -c . "$prefix.err")" == 1 ]] || fail "more than one line on stderr: $(cat "$prefix.err")"
  local left; left="$(cd "$dir" && ls | grep -v -e '^input\.' -e '^out\.out$' -e '^out\.err$')"
  [[ -z "$left" ]] || fail "files left behind: $left"
  echo "ok: $(cat "$prefix.err")"
}

case_overwrite() {
  local dir="$work/overwrite" prefix="$work/overwrite/out"
  rm -rf "$dir"; mkdir -p "$dir"
  launcher=(direct)  # one rank without mpiexec: a refused run costs no launcher teardown
  preprocess 1 "$prefix" "$fixtures/fixture.jsonl" || fail "first run failed: $(cat "$prefix.err")"
  local before; before="$(md5sum <"$prefix.bin")$(md5sum <"$prefix.idx")"
  local mtime; mtime="$(stat -c %Y.%y "$prefix.bin")"
  # A different input: if it were written, the files would change.
  if preprocess 1 "$prefix" "$fixtures/fixture.txt" -- --json-key other; then
    fail "existing dataset was overwritten without --overwrite"
  fi
  grep -q "already exists (pass --overwrite" "$prefix.err" || fail "wrong error: $(cat "$prefix.err")"
  [[ "$(grep -c '^meshtron: error:' "$prefix.err")" == 1 ]] || fail "not one error line"
  [[ "$(md5sum <"$prefix.bin")$(md5sum <"$prefix.idx")" == "$before" ]] || fail "files changed"
  [[ "$(stat -c %Y.%y "$prefix.bin")" == "$mtime" ]] || fail "file rewritten"
  printf 'one document\n' >"$dir/small.txt"
  preprocess 1 "$prefix" "$dir/small.txt" -- --overwrite || fail "--overwrite failed: $(cat "$prefix.err")"
  [[ "$(md5sum <"$prefix.bin")$(md5sum <"$prefix.idx")" != "$before" ]] || fail "--overwrite did not replace"
  [[ "$(stat -c %s "$prefix.bin")" == 6 ]] || fail "replaced .bin should hold 3 uint16 tokens"
  echo "ok: refused without --overwrite, replaced with it"
}

case "$case_name" in
  run) case_run "$@" ;;
  identical) case_identical ;;
  bad) case_bad "$@" ;;
  overwrite) case_overwrite ;;
  *) fail "unknown case $case_name" ;;
esac
