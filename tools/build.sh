#!/usr/bin/env bash
# Configure and build meshtron into build/ (Release, Ninja, ccache).
# Extra arguments go to cmake's configure step, e.g. -DMESHTRON_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
