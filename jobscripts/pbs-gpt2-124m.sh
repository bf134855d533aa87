#!/bin/bash
# GPT-2 124M on 2 PBS nodes x 4 GPUs (one MPI rank per GPU).
#   qsub jobscripts/pbs-gpt2-124m.sh
#PBS -N meshtron-gpt2-124m
#PBS -l select=2:ncpus=32:ngpus=4:mpiprocs=4
#PBS -l walltime=24:00:00
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
mpirun -np 8 --map-by ppr:4:node build/meshtron train input_decks/gpt2-124m.deck \
       --set checkpoint.load=auto
