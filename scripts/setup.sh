#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with everything the tests and the main job need.
# CPU PyTorch is installed as torch==2.13.0 (a local wheel on these machines; an unpinned torch pulls a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
.venv/bin/python -m pip install -q "torch==2.13.0"
# Editable install builds the Cython scheduler (setup.py) and pulls the runtime, export, dev and Ray dependencies.
.venv/bin/python -m pip install -q -e ".[export,dev,ray]"
