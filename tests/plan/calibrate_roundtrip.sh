#!/usr/bin/env bash
# `meshtron plan --calibrate` on 2 CPU ranks writes a rates file that `plan`
# reads back (read_rates requires every rate positive) and prints a step
# time from.
#
#   calibrate_roundtrip.sh MESHTRON WORKDIR MPIEXEC [FLAGS...]
set -euo pipefail
meshtron=$1 work=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
"$@" -np 2 "$meshtron" plan --calibrate --rates "$work/rates.json"
"$meshtron" plan "$here/../train/tiny.deck" --rates "$work/rates.json" | tee "$work/plan.txt"
grep -q "^step time (rates: calibrated (cpu, fp32)): [0-9.]* ms" "$work/plan.txt"
