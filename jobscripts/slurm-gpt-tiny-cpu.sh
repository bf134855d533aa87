#!/bin/bash
# meshtron train input_decks/gpt-tiny.deck
# on 1 node(s) x 4 CPU rank(s).   sbatch THIS_FILE (from the folder
# that the relative paths below start from)
# written by: meshtron jobscript input_decks/gpt-tiny.deck --scheduler slurm --nodes 1 --ntasks-per-node 4 --time 00:30:00 --meshtron build/meshtron --output jobscripts/slurm-gpt-tiny-cpu.sh
# 180 s before the time limit Slurm sends SIGUSR1 to this script
# (--signal=B:USR1@180); it passes it to srun, which passes it to
# every rank: they finish the step, save a checkpoint and exit 0. While the
# latest checkpoint is short of the last iteration the script requeues the
# job, which resumes from it (checkpoint.load = auto).
#SBATCH --job-name=meshtron-gpt-tiny
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=meshtron-gpt-tiny-%j.out
set -euo pipefail  # in the folder sbatch ran in: relative paths resolve from it
# Host threads per rank (OpenBLAS and OpenMP), as many as its CPUs.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
unfinished() {
  local latest
  latest=$(cat checkpoints/latest 2>/dev/null) || return 1
  latest=${latest#iter_}
  (( 10#${latest%.h5} < 1200 ))
}
# Every rank on its own cores.
launcher=
trap 'kill -USR1 "$launcher" 2>/dev/null || true' USR1
srun --mpi=pmix --cpu-bind=cores build/meshtron train input_decks/gpt-tiny.deck \
    --set checkpoint.load=auto &
launcher=$!
status=0
while kill -0 "$launcher" 2>/dev/null; do
  wait "$launcher" && status=0 || status=$?
done
if (( status == 0 )) && unfinished; then
  echo "requeueing job $SLURM_JOB_ID to resume from $(cat checkpoints/latest)"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
