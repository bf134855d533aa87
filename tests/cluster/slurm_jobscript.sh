#!/bin/bash
# `meshtron jobscript` output under a real Slurm (local_slurm.sh: slurmctld,
# slurmd and munged on localhost, all state in WORK/slurm).
#   slurm_jobscript.sh CASE MESHTRON WORK MPIEXEC...
# CASE submit:  sbatch --wait a 2-rank CPU job; its metrics hold every step
#               and its resolved deck the layout.
# CASE requeue: SIGUSR1 to the batch script mid-run (scancel --signal=USR1
#               --batch, what --signal=B:USR1@T sends ahead of the time limit):
#               the ranks save, the script requeues the job, the job resumes
#               from the checkpoint with the losses of an uninterrupted run.
# Exit 0 = pass, 77 = skipped (no slurmctld installed).
set -euo pipefail
case_name=$1 meshtron=$2 work=$3; shift 3
mpiexec=("$@")
here=$(cd "$(dirname "$0")" && pwd)
deck=$here/../train/tiny.deck

command -v slurmctld > /dev/null || { echo "SKIP: slurmctld is not installed"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work"
source "$here/local_slurm.sh"
local_slurm_start "$work/slurm"

jobscript() {  # ITERS: writes job.sbatch for 2 CPU ranks (dp 2)
  "$meshtron" jobscript "$deck" --set parallel.data_parallel=2 --set training.train_iters="$1" \
      --set run.output_dir="$work/runs" --set checkpoint.save_dir="$work/ck" \
      --set checkpoint.save_interval=1000 \
      --scheduler slurm --nodes 1 --ntasks-per-node 2 --time 00:05:00 --output job.sbatch
  grep -q -- '--requeue' job.sbatch && grep -q -- '--signal=B:USR1@60' job.sbatch ||
    fail "job.sbatch lacks --requeue or --signal"
}
steps_logged() { if [[ -f $1 ]]; then grep -c '"loss"' "$1" || true; else echo 0; fi; }
job_field() {  # JOBID FIELD: one field of scontrol show job
  scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}

case $case_name in
submit)
  jobscript 6
  sbatch --wait job.sbatch > sbatch.txt || fail "the job failed: $(cat meshtron-tiny-test-*.out)"
  out=$(ls meshtron-tiny-test-*.out)
  (( $(steps_logged runs/tiny-test/metrics.jsonl) == 6 )) ||
    fail "metrics.jsonl holds $(steps_logged runs/tiny-test/metrics.jsonl) step lines, not 6"
  grep -q '^  data_parallel *= 2$' runs/tiny-test/resolved.deck || fail "the job did not run dp 2"
  [[ $(cat ck/latest) == iter_0000006.h5 ]] || fail "latest checkpoint is $(cat ck/latest)"
  grep -q "requeueing" "$out" && fail "a finished job was requeued"
  echo "PASS: sbatch --wait ran the generated job to its last step"
  ;;
requeue)
  iters=150
  "${mpiexec[@]}" -np 2 "$meshtron" train "$deck" --set parallel.data_parallel=2 \
      --set training.train_iters=$iters --set run.output_dir="$work/whole" \
      --set checkpoint.save_dir= > whole.txt
  jobscript $iters
  job=$(sbatch --parsable job.sbatch)
  for _ in $(seq 600); do  # until step 10 is logged
    (( $(steps_logged runs/tiny-test/metrics.jsonl) >= 10 )) && break
    sleep 0.1
  done
  scancel --signal=USR1 --batch "$job"
  # Slurm holds a requeued job back two minutes (its begin time); move that
  # to 2 s on: slurmd refuses credentials of the second in which it revoked
  # the job's last ones.
  hurried=0
  for _ in $(seq 900); do
    state=$(job_field "$job" JobState)
    [[ $state == COMPLETED || $state == FAILED || $state == CANCELLED ]] && break
    if [[ $state == PENDING ]] && (( ! hurried )); then
      scontrol update jobid="$job" starttime=now+2 && hurried=1
    fi
    sleep 0.2
  done
  out=meshtron-tiny-test-$job.out
  [[ $state == COMPLETED ]] || fail "job $job ended $state: $(cat "$out")"
  (( $(job_field "$job" Restarts) == 1 )) || fail "job $job restarted $(job_field "$job" Restarts) times"
  grep -q "stopping after iteration [0-9]* of $iters: received SIGUSR1" "$out" ||
    fail "no stop line: $(cat "$out")"
  stopped=$(sed -n 's/.*stopping after iteration \([0-9]*\) of.*/\1/p' "$out")
  (( stopped < iters )) || fail "the run was not interrupted"
  grep -q "requeueing job $job to resume from $(printf 'iter_%07d.h5' "$stopped")" "$out" ||
    fail "the script did not requeue: $(cat "$out")"
  grep -q "resumed from .*$(printf 'iter_%07d.h5' "$stopped") at iteration $stopped" "$out" ||
    fail "the requeued job did not resume: $(cat "$out")"
  python3 "$here/../train/compare_losses.py" whole/tiny-test/metrics.jsonl \
      runs/tiny-test/metrics.jsonl 1 $iters 0 > compare.txt || fail "$(grep -v ok compare.txt)"
  echo "PASS: stopped at $stopped of $iters, requeued, resumed with the same losses"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
