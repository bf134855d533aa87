#!/bin/bash
# GPT-2 124M, 2 nodes x 4 GPUs, one rank per GPU (meshtron picks the GPU from
# the node-local rank). Resumes from the latest checkpoint after a requeue.
#   sbatch jobscripts/slurm-gpt2-124m.sh
#SBATCH --job-name=meshtron-gpt2-124m
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=meshtron-%j.out
set -euo pipefail
export OPENBLAS_NUM_THREADS=1
srun --cpu-bind=cores build/meshtron train input_decks/gpt2-124m.deck \
     --set checkpoint.load=auto
