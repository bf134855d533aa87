#!/usr/bin/env bash
# The test command (README, .ci/run): install dependencies, build, fetch the
# corpus the tokenizer tests compare on, and run the whole CTest suite.
# MPI tests run oversubscribed; CI runs as root, which Open MPI must allow.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/build.sh
bash tools/fetch-corpus.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
