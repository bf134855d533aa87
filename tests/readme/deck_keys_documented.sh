#!/usr/bin/env bash
# Every key that `meshtron info --help-deck` lists has a row in
# docs/input-decks.md, under its section.
#   deck_keys_documented.sh MESHTRON DOC
set -euo pipefail
meshtron=$1 doc=$2
missing=0
while read -r name _; do
  section=${name%%.*} key=${name#*.}
  if ! awk -v s="## [$section]" -v row="| \`$key\` |" \
         '$0 == s { inside = 1; next } /^## / { inside = 0 } inside && index($0, row) == 1 { found = 1 }
          END { exit !found }' "$doc"; then
    echo "not documented in $doc: $name"; missing=1
  fi
done < <("$meshtron" info --help-deck | grep -E '^[a-z_]+\.[a-z_0-9]+ ')
exit $missing
