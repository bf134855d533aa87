#!/usr/bin/env bash
# expect_error.sh REGEX CMD...: CMD must exit with status 1 within the CTest
# timeout and print exactly one "meshtron: error:" line matching REGEX.
set -u
regex=$1; shift
out=$("$@" 2>&1); rc=$?
lines=$(grep -c "^meshtron: error:" <<<"$out")
if [ "$rc" -ne 1 ]; then echo "FAIL: exit status $rc, expected 1"; echo "$out"; exit 1; fi
if [ "$lines" -ne 1 ]; then echo "FAIL: $lines error lines, expected 1"; echo "$out"; exit 1; fi
if ! grep "^meshtron: error:" <<<"$out" | grep -Eq "$regex"; then
  echo "FAIL: error line does not match /$regex/"; echo "$out"; exit 1
fi
grep "^meshtron: error:" <<<"$out"
