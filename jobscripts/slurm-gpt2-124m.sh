#!/bin/bash
# meshtron train input_decks/gpt2-124m.deck
# on 2 node(s) x 4 GPU(s), one MPI rank per GPU.   sbatch THIS_FILE (from the folder
# that the relative paths below start from)
# written by: meshtron jobscript input_decks/gpt2-124m.deck --scheduler slurm --nodes 2 --gpus-per-node 4 --cpus-per-task 8 --time 24:00:00 --meshtron build/meshtron --output jobscripts/slurm-gpt2-124m.sh
# 600 s before the time limit Slurm sends SIGUSR1 to this script
# (--signal=B:USR1@600); it passes it to srun, which passes it to
# every rank: they finish the step, save a checkpoint and exit 0. While the
# latest checkpoint is short of the last iteration the script requeues the
# job, which resumes from it (checkpoint.load = auto).
#SBATCH --job-name=meshtron-gpt2-124m
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=meshtron-gpt2-124m-%j.out
set -euo pipefail  # in the folder sbatch ran in: relative paths resolve from it
# Host threads per rank (OpenBLAS and OpenMP), as many as its CPUs.
export OMP_NUM_THREADS=8 OPENBLAS_NUM_THREADS=8
# NCCL: one line naming the failing call and peer when a collective fails.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Tensors move between GPUs through NCCL, which finds NVLink and InfiniBand
# itself; MPI (UCX under Open MPI) carries only small host messages, so
# UCX_TLS is left to the site. Where NCCL's bootstrap picks the wrong
# network interface, name it:
# export NCCL_SOCKET_IFNAME=ib0
unfinished() {
  local latest
  latest=$(cat checkpoints/gpt2-124m/latest 2>/dev/null) || return 1
  latest=${latest#iter_}
  (( 10#${latest%.h5} < 500000 ))
}
# Every rank on its own cores; rank r of a node drives GPU r.
launcher=
trap 'kill -USR1 "$launcher" 2>/dev/null || true' USR1
srun --mpi=pmix --cpu-bind=cores --gpu-bind=none build/meshtron train input_decks/gpt2-124m.deck \
    --set checkpoint.load=auto &
launcher=$!
status=0
while kill -0 "$launcher" 2>/dev/null; do
  wait "$launcher" && status=0 || status=$?
done
if (( status == 0 )) && unfinished; then
  echo "requeueing job $SLURM_JOB_ID to resume from $(cat checkpoints/gpt2-124m/latest)"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
