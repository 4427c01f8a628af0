#!/usr/bin/env bash
# Install everything pipebench needs into .venv, once.
#
# Why a script and not just `pip install -e .`: torch/torchvision must be the exact builds
# that lie on this machine's disk, DeepSpeed's build imports torch (so it comes after torch,
# without build isolation), and Horovod 0.28.1 does not build from its sdist as published
# against torch 2.14 (C++20 headers, CUDA toolkit discovery). We build Horovod's wheel once,
# keep it in a cache outside the checkout keyed by the torch version, and install from there.
# A stamp file keyed by the hash of the requirements makes a second run install nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=.venv
TORCH_VERSION=2.14.1
HOROVOD_VERSION=0.28.1
DEEPSPEED_VERSION=0.19.8
CACHE=${PIPEBENCH_CACHE:-$HOME/.cache/pipebench}
PYTAG=$($PY -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
HVD_CACHE="$CACHE/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-$PYTAG-$(uname -m)"

stamp_key=$(cat requirements.txt pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
STAMP="$VENV/.pipebench-installed-$stamp_key"
if [ -f "$STAMP" ]; then
  exit 0
fi

log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PY"
  $PY -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip wheel setuptools
log "installing pinned requirements (torch from local disk; ~3 min the first time)"
$PIP install --quiet -r requirements.txt
log "installing deepspeed==$DEEPSPEED_VERSION (its build imports torch)"
DS_BUILD_OPS=0 $PIP install --quiet --no-build-isolation "deepspeed==$DEEPSPEED_VERSION"

if ! ls "$HVD_CACHE"/horovod-*.whl >/dev/null 2>&1; then
  log "building Horovod $HOROVOD_VERSION wheel for CPU/gloo (about 15 min on 2 cores, once; cached in $HVD_CACHE)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  $PIP download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
  tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  # torch 2.14's ATen headers require C++20; Horovod's CMake forces C++14.
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  cuda_env=()
  for c in /usr/local/cuda-13.0 /usr/local/cuda; do
    if [ -d "$c/include" ]; then cuda_env=(HOROVOD_CUDA_HOME="$c" CUDA_HOME="$c"); break; fi
  done
  mkdir -p "$HVD_CACHE"
  env "${cuda_env[@]}" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
    MAKEFLAGS=-j"$(nproc)" \
    $PIP wheel --no-build-isolation --no-cache-dir --no-deps -w "$work/wheel" "$src"
  mv "$work"/wheel/horovod-*.whl "$HVD_CACHE"/
fi
log "installing Horovod from $HVD_CACHE"
$PIP install --quiet --no-deps "$HVD_CACHE"/horovod-*.whl
$PIP install --quiet cloudpickle pyyaml packaging  # Horovod's runtime requirements

# openssh-server: tests/test_multinode.py starts horovodrun's remote rank over ssh inside a
# network namespace (apt, idempotent; skipped with a note when neither root nor sudo)
./scripts/install_sshd.sh
# Slurm and MUNGE: tests/test_slurm.py starts a two-node Slurm cluster (scripts/slurm_cluster.sh)
# on network-namespace hosts (apt, no service started; skipped with a note without root)
./scripts/install_slurm.sh

log "installing pipebench (editable)"
$PIP install --quiet --no-deps --no-build-isolation -e .

rm -f "$VENV"/.pipebench-installed-*
touch "$STAMP"
log "done"
