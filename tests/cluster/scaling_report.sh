#!/bin/bash
# A strong-scaling sweep of the tiny deck on 1, 2 and 4 CPU ranks, run with
# mpirun from the scripts `meshtron jobscript --sweep` writes (their --set
# lines), then `meshtron scaling-report` over the runs: a table row per
# point, a PNG and an SVG.
#   scaling_report.sh MESHTRON WORK MPIEXEC...
set -euo pipefail
meshtron=$1 work=$2; shift 2
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
deck=$here/../train/tiny.deck
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work"

"$meshtron" jobscript "$deck" --set run.output_dir=runs --set checkpoint.save_dir=ck \
    --scheduler slurm --ntasks-per-node 4 --sweep strong --points 1,2,4 --output jobs/tiny.sbatch
for n in 1 2 4; do
  script=jobs/tiny-strong-$n.sbatch
  grep -q "^#SBATCH --ntasks-per-node=$n$" "$script" || fail "$script does not run $n ranks"
  mapfile -t sets < <(sed -n 's/^ *--set \([^ ]*\).*/--set=\1/p' "$script")
  "${mpiexec[@]}" -np $n "$meshtron" train "$deck" "${sets[@]}" > train-$n.txt
done
"$meshtron" scaling-report runs --output report > report.txt

for n in 1 2 4; do  # a row per point: ranks, the layout, the fixed global batch
  grep -q "^| $n | 1 x 1 x $n | 16 | " report/scaling.md || fail "no row for $n ranks: $(cat report/scaling.md)"
done
(( $(grep -c '^| [0-9]' report/scaling.md) == 3 )) || fail "not 3 rows: $(cat report/scaling.md)"
(( $(wc -l < report/scaling.csv) == 4 )) || fail "scaling.csv: $(cat report/scaling.csv)"
grep -q '^| 1 | .* | 100.0 % |' report/scaling.md || fail "the smallest run's efficiency is not 100 %"
[[ $(head -c 8 report/scaling.png | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
  fail "scaling.png is not a PNG"
grep -q '<svg' report/scaling.svg || fail "scaling.svg is not an SVG"
echo "PASS: scaling-report over the 1, 2, 4-rank sweep"
