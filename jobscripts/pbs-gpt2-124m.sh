#!/bin/bash
# GPT-2 124M on 2 PBS nodes x 4 GPUs (one MPI rank per GPU).
#   qsub jobscripts/pbs-gpt2-124m.sh
# PBS sends no signal ahead of the walltime, so the run stops itself:
# run.exit_duration_mins (23.5 h of the 24 h) saves a checkpoint and exits 0.
# A preemption's SIGTERM is passed to the ranks as SIGUSR1 (Open MPI's mpirun
# forwards it), which save and exit the same way. The job is rerunnable
# (-r y) and resumes from the latest checkpoint (checkpoint.load = auto);
# chain the next job with `qsub -W depend=afterok:JOBID`.
#PBS -N meshtron-gpt2-124m
#PBS -l select=2:ncpus=32:ngpus=4:mpiprocs=4
#PBS -l walltime=24:00:00
#PBS -r y
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
trap 'kill -USR1 "$mpirun_pid" 2>/dev/null || true' TERM
mpirun -np 8 --map-by ppr:4:node build/meshtron train input_decks/gpt2-124m.deck \
       --set checkpoint.load=auto --set run.exit_duration_mins=1410 &
mpirun_pid=$!
status=0
while kill -0 "$mpirun_pid" 2>/dev/null; do  # `wait` returns early when the trap runs
  wait "$mpirun_pid" && status=0 || status=$?
done
exit "$status"
