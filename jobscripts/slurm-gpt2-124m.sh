#!/bin/bash
# GPT-2 124M, 2 nodes x 4 GPUs, one rank per GPU (meshtron picks the GPU from
# the node-local rank).
#   sbatch jobscripts/slurm-gpt2-124m.sh
# Ten minutes before the time limit Slurm sends SIGUSR1 to this script
# (--signal=B:USR1@600); it passes the signal to every rank, which finish
# their step, save a checkpoint and exit 0; the script then requeues the
# job, which resumes from that checkpoint (checkpoint.load = auto).
#SBATCH --job-name=meshtron-gpt2-124m
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=meshtron-%j.out
set -euo pipefail
export OPENBLAS_NUM_THREADS=1

requeue=0
trap 'requeue=1; kill -USR1 "$srun_pid" 2>/dev/null || true' USR1
srun --cpu-bind=cores build/meshtron train input_decks/gpt2-124m.deck \
     --set checkpoint.load=auto &
srun_pid=$!
status=0
while kill -0 "$srun_pid" 2>/dev/null; do  # `wait` returns early when the trap runs
  wait "$srun_pid" && status=0 || status=$?
done
if (( requeue && status == 0 )); then scontrol requeue "$SLURM_JOB_ID"; fi
exit "$status"
