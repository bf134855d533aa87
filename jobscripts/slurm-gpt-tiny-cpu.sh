#!/bin/bash
# gpt-tiny on CPU ranks of one node: tp 2 x dp 2 (the default job), as a
# Slurm batch job.   sbatch jobscripts/slurm-gpt-tiny-cpu.sh
#SBATCH --job-name=meshtron-gpt-tiny
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --output=meshtron-%j.out
set -euo pipefail
export OPENBLAS_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
bash tools/prepare-brown.sh            # once; idempotent
srun build/meshtron train input_decks/gpt-tiny.deck \
     --set run.name=gpt-tiny-$SLURM_JOB_ID --set checkpoint.load=auto
