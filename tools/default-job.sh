#!/usr/bin/env bash
# The default job (README): install dependencies, build, fetch the Brown
# corpus and GPT-2's vocabulary, preprocess them into an indexed dataset, and
# train gpt-tiny on 4 CPU ranks (tp 2 x dp 2) for 1200 steps.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/build.sh
bash tools/prepare-brown.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
exec mpirun --oversubscribe -np 4 build/meshtron train input_decks/gpt-tiny.deck "$@"
