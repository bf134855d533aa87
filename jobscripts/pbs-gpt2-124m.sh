#!/bin/bash
# meshtron train input_decks/gpt2-124m.deck
# on 2 node(s) x 4 GPU(s), one MPI rank per GPU.   qsub THIS_FILE (from the folder
# that the relative paths below start from)
# written by: meshtron jobscript input_decks/gpt2-124m.deck --scheduler pbs --nodes 2 --gpus-per-node 4 --cpus-per-task 8 --time 24:00:00 --meshtron build/meshtron --output jobscripts/pbs-gpt2-124m.sh
# PBS sends no signal ahead of the walltime, so the run stops itself:
# run.exit_duration_mins = 1420 saves a checkpoint and exits 0.
# A preemption's SIGTERM reaches the ranks as SIGUSR1 (mpirun forwards it),
# which save the same way. While the latest checkpoint is short of the last
# iteration the script submits itself again; the next job resumes from it
# (checkpoint.load = auto).
#PBS -N meshtron-gpt2-124m
#PBS -l select=2:ncpus=32:ngpus=4:mpiprocs=4
#PBS -l walltime=24:00:00
#PBS -r y
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"  # where qsub ran: relative paths resolve from it
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
trap 'kill -USR1 "$launcher" 2>/dev/null || true' TERM
mpirun -np 8 --map-by ppr:4:node:PE=8 --bind-to core build/meshtron train input_decks/gpt2-124m.deck \
    --set checkpoint.load=auto \
    --set run.exit_duration_mins=1420 &
launcher=$!
status=0
while kill -0 "$launcher" 2>/dev/null; do
  wait "$launcher" && status=0 || status=$?
done
if (( status == 0 )) && unfinished; then
  qsub jobscripts/pbs-gpt2-124m.sh
fi
exit "$status"
