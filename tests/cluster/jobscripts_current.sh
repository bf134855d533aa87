#!/bin/bash
# jobscripts/*.sh are `meshtron jobscript` output: each one's "written by"
# command, run again in a scratch copy of the decks, writes it byte for byte.
#   jobscripts_current.sh MESHTRON SOURCE_DIR WORK
set -euo pipefail
meshtron=$1 source_dir=$2 work=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cp -r "$source_dir/input_decks" "$work/"
cd "$work"
count=0
for script in "$source_dir"/jobscripts/*.sh; do
  line=$(sed -n 's/^# written by: meshtron jobscript //p' "$script")
  [[ -n $line ]] || fail "$script has no '# written by: meshtron jobscript' line"
  read -r -a args <<< "$line"
  "$meshtron" jobscript "${args[@]}" > /dev/null
  out=$(sed -n 's/.*--output \([^ ]*\).*/\1/p' <<< "$line")
  diff -u "$script" "$out" || fail "$script is not what its command writes now: regenerate it"
  count=$((count + 1))
done
(( count > 0 )) || fail "no jobscripts found"
echo "PASS: $count jobscripts are current"
