#!/usr/bin/env bash
# expect_status.sh STATUS REGEX CMD...: CMD must exit with STATUS and its
# output (stdout + stderr) must match the extended REGEX (grep -Pz, so the
# pattern may span lines); "meshtron: error:" may appear at most once.
set -u
status=$1; regex=$2; shift 2
out=$("$@" 2>&1); rc=$?
fail() { echo "FAIL: $1"; echo "--- output:"; echo "$out"; exit 1; }
[ "$rc" -eq "$status" ] || fail "exit status $rc, expected $status"
[ "$(grep -c '^meshtron: error:' <<<"$out")" -le 1 ] || fail "more than one error line"
grep -Pzq -- "(?s)(?m)$regex" <<<"$out" || fail "output does not match /$regex/"
echo "$out"
