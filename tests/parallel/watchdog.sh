#!/usr/bin/env bash
# A rank that never arrives at a collective ends the job through
# parallel.collective_timeout_s, with a report that names the operation, the
# group and the missing rank:
#   watchdog.sh LAYOUT MESHTRON DECK WORKDIR MPIEXEC [MPIEXEC ARGS...]
# LAYOUT: tp2_dp2 (4 ranks; rank 1 skips a tp all-reduce of step 2) |
#         tp2_pp2_dp2 (8 ranks; rank 5, on the last stage, skips its first
#         collective of step 3, whichever group) |
#         watched (4 ranks, tp2_dp2, no skip: the watched waits train as the
#         blocking ones do).
set -uo pipefail
layout=$1 meshtron=$2 deck=$3 work=$4; shift 4
mpiexec=("$@")
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "FAIL: $*"; cat out.txt 2>/dev/null; exit 1; }
timeout_s=5
train() {  # NP ARGS...
  local np=$1; shift
  timeout 120 "${mpiexec[@]}" -np "$np" "$meshtron" train "$deck" --set checkpoint.save_dir= \
    --set run.output_dir="$work/${runs:-runs}" --set parallel.tensor_parallel=2 "$@"
}
expect_abort() {  # ELAPSED_S: the job ended non-zero, well before CTest's timeout
  local rc=$1 elapsed=$2
  [[ $rc -ne 0 ]] || fail "exit status 0, expected the watchdog's abort"
  [[ $rc -ne 124 ]] || fail "the job hung past the test's own 120 s limit (timeout)"
  (( elapsed < 60 )) || fail "the job took $elapsed s to end with a $timeout_s s timeout"
}

case $layout in
tp2_dp2)
  start=$SECONDS
  train 4 --set parallel.collective_timeout_s=$timeout_s \
    --set parallel.debug_skip_collective=1:2:tp > out.txt 2>&1
  expect_abort $? $((SECONDS - start))
  grep -Eq "^meshtron: watchdog: rank 0 waited [0-9.]+ s in all_reduce on the tp group \(world ranks 0 1\) at step 2 .*not arrived: rank 1 \(" out.txt ||
    fail "no report of rank 0 waiting for rank 1 in the tp all_reduce"
  grep -Eq "^meshtron: watchdog: aborting the job: .* waiting for rank\(s\) 1$" out.txt ||
    fail "no one-line summary naming rank 1"
  ;;
tp2_pp2_dp2)
  start=$SECONDS
  train 8 --set parallel.pipeline_parallel=2 --set parallel.collective_timeout_s=$timeout_s \
    --set parallel.debug_skip_collective=5:3 > out.txt 2>&1
  expect_abort $? $((SECONDS - start))
  # World rank 5 = (tp 1, dp 0, pp 1): its tp peer is 4, its dp peer 7, its
  # pipeline peer 1; whichever of them reports first, it names rank 5.
  grep -Eq "^meshtron: watchdog: rank [0-9] waited [0-9.]+ s in [a-z_]+( from rank 5)? on the (tp|dp|pp) group \(world ranks [0-9 ]*5[0-9 ]*\) at step 3.*not arrived: rank 5 \(" out.txt ||
    fail "no report naming rank 5 as not arrived"
  ;;
watched)
  runs=plain train 4 > plain.txt 2>&1 || fail "the unwatched run failed"
  runs=watched train 4 --set parallel.collective_timeout_s=60 > out.txt 2>&1 ||
    fail "the watched run failed"
  losses() { grep -Eo '"loss": [-0-9.e+]+' "$work/$1"/*/metrics.jsonl | cut -d' ' -f2; }
  [[ $(losses watched | wc -l) -eq 6 ]] || fail "not 6 losses in the watched run's metrics"
  # The watched waits take MPI's non-blocking algorithms: the same sums to
  # rounding, not necessarily in the same order (fp32: relative 1e-5).
  paste <(losses plain) <(losses watched) | awk '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "step " NR ": " $1 " vs " $2; bad = 1 } }
    END { exit bad }' || fail "the watched run's losses differ"
  spread="min [0-9.]+ ms \(rank [0-3]\), max [0-9.]+ ms \(rank [0-3], the slowest\), spread [0-9.]+ %"
  grep -Eq "^ > step time over 4 ranks: $spread; less waits for peers: $spread$" out.txt ||
    fail "no step time spread line with the ranks' own work"
  grep -Eq "^ > step time over 4 ranks: $spread$" plain.txt ||
    fail "no step time spread line in the unwatched run"
  ;;
*) echo "unknown layout $layout"; exit 2 ;;
esac
echo "PASS $layout"
