#!/usr/bin/env bash
# Install what meshtron needs on Debian 12 / Ubuntu 24.04 (as root or with
# sudo). Installs only the packages that are missing; safe to run again.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  libopenmpi-dev openmpi-bin            # MPI
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5 (checkpoints)
  libboost-program-options-dev          # input decks
  libtrilinos-kokkos-dev                # portable host kernels
  libopenblas-dev                       # CBLAS GEMMs on the host
  nlohmann-json3-dev libpcre2-dev       # safetensors headers, GPT-2 regex
  libsentencepiece-dev                  # SentencePiece tokenizers (Llama 2, Mistral, T5)
  sentencepiece                         # spm_train, spm_encode: the tokenizer tests' reference
  libcpp-httplib-dev                    # meshtron serve
  libutf8proc-dev                       # Unicode tables (BERT's basic tokenizer)
  gnuplot-nox                           # meshtron scaling-report plots
  slurm-wlm                             # the tests under a real Slurm
  libgtest-dev libgmock-dev libbenchmark-dev
  python3                               # the perf_drivers test, plotting helpers
)
# Node.js and npm fetch the corpus and run the reference tokenizer; keep an
# existing installation (e.g. NodeSource's), which conflicts with Debian's npm.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all dependencies present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
