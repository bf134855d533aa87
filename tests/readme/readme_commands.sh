#!/usr/bin/env bash
# Runs README.md's shell blocks as a user would, one after another, in a
# scratch folder that looks like the repository root (input_decks, tools,
# validation, jobscripts, data and build linked in), so that every command is
# checked exactly as written.
#
#   readme_commands.sh REPO_ROOT BUILD_DIR [README]
#
# A block whose fence says ```sh or ```bash runs under `bash -e` with a time
# limit (README_BLOCK_TIMEOUT seconds, default 120); a failing block fails the
# test. Blocks marked ```sh gpu (need a GPU or a batch system) or ```sh setup
# (install, build, or run CTest itself: CI does that through tools/test.sh)
# are skipped, and the test prints which. Other fences (```text) are not
# commands.
# The examples read data/brown_text_document: tools/prepare-brown.sh makes it
# first (idempotent; the corpus comes from tools/fetch-corpus.sh, which
# tools/test.sh runs before CTest).
set -euo pipefail

repo="$(cd "${1:?usage: readme_commands.sh REPO_ROOT BUILD_DIR [README]}" && pwd)"
build="$(cd "${2:?usage: readme_commands.sh REPO_ROOT BUILD_DIR [README]}" && pwd)"
readme="${3:-$repo/README.md}"
timeout_s="${README_BLOCK_TIMEOUT:-120}"
data_dir="${MESHTRON_DATA_DIR:-$repo/data}"

scratch="$(mktemp -d "${TMPDIR:-/tmp}/meshtron-readme.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
blocks="$scratch/.blocks"
mkdir -p "$blocks" "$data_dir"
for d in input_decks tools validation jobscripts; do ln -s "$repo/$d" "$scratch/$d"; done
ln -s "$data_dir" "$scratch/data"
ln -s "$build" "$scratch/build"

# 1. Split the README into numbered blocks: NNN.<info> holds a block's lines.
awk -v dir="$blocks" '
  /^```/ {
    if (!inside) { inside = 1; n++; info = substr($0, 4); gsub(/ /, "_", info)
                   file = sprintf("%s/%03d.%s", dir, n, info == "" ? "none" : info); next }
    inside = 0; close(file); next }
  inside { print > file }' "$readme"

# 2. The dataset the examples train on.
(cd "$scratch" && bash tools/prepare-brown.sh)

# 3. Run the shell blocks in order; skip the marked ones.
ran=0 skipped=0 failed=0
for file in "$blocks"/*; do
  name="$(basename "$file")"
  info="${name#*.}"
  case "$info" in
    sh|bash) ;;
    sh_gpu|sh_setup|bash_gpu|bash_setup)
      echo "readme: SKIPPED block $name (${info#*_}):"; sed 's/^/    /' "$file"
      skipped=$((skipped + 1)); continue ;;
    *) continue ;;
  esac
  echo "readme: RUN block $name:"; sed 's/^/    /' "$file"
  start=$SECONDS
  if (cd "$scratch" && timeout "$timeout_s" bash -e "$file") >"$file.log" 2>&1; then
    echo "readme: block $name passed in $((SECONDS - start)) s"
    ran=$((ran + 1))
  else
    rc=$?
    echo "readme: FAILED block $name (exit $rc); its last output:"; tail -n 30 "$file.log"
    failed=$((failed + 1))
  fi
done
echo "readme: $ran blocks ran, $failed failed, $skipped skipped"
[[ $ran -gt 0 ]] || { echo "readme: no runnable block found in $readme" >&2; exit 1; }
[[ $failed -eq 0 ]]
