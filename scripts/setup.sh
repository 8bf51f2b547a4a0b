#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv with everything the tests and the main job need.
# CPU PyTorch is installed as torch==2.13.0 (a local wheel on these machines; an unpinned torch pulls a CUDA build).
#
# ONNX Runtime: one distribution, never both (they install the same `onnxruntime` package and overwrite each other).
#   FASTNLI_ORT=onnxruntime (default)   the CPU build, as `pip install fastnli` pulls it
#   FASTNLI_ORT=onnxruntime-gpu         the CUDA build (runs on CPU too), as the README's GPU command leaves it
# at FASTNLI_ORT_VERSION (default 1.31.1: the version the repository's measurements were made with, and the latest
# with both builds). Switching removes the other distribution first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
ORT=${FASTNLI_ORT:-onnxruntime}
ORT_VERSION=${FASTNLI_ORT_VERSION:-1.31.1}
case "$ORT" in
  onnxruntime) OTHER=onnxruntime-gpu ;;
  onnxruntime-gpu) OTHER=onnxruntime ;;
  *) echo "FASTNLI_ORT=$ORT: use onnxruntime or onnxruntime-gpu" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip() { .venv/bin/python -m pip "$@"; }
pip install -q --upgrade pip setuptools wheel
pip install -q "torch==2.13.0"
if pip show -q "$OTHER" 2>/dev/null; then
  # both distributions share files: remove both, then install the wanted one cleanly
  pip uninstall -q -y "$OTHER"
  if pip show -q "$ORT" 2>/dev/null; then pip uninstall -q -y "$ORT"; fi
fi
pip install -q "$ORT==$ORT_VERSION"
# Editable install builds the Cython scheduler (setup.py) and pulls the runtime, export, dev and Ray dependencies.
if [ "$ORT" = onnxruntime ]; then
  pip install -q -e ".[export,dev,ray]"
else
  # pip has no "provides": fastnli's requirement on onnxruntime would add the CPU build beside the GPU one, so the
  # package goes in without dependencies and its requirements (all but onnxruntime) are installed by name.
  mapfile -t reqs < <(.venv/bin/python - <<'PYEOF'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = project["dependencies"] + [r for extra in ("export", "dev", "ray") for r in project["optional-dependencies"][extra]]
print("\n".join(r for r in reqs if not r.replace(" ", "").startswith(("onnxruntime>", "onnxruntime=", "onnxruntime;"))))
PYEOF
  )
  pip install -q "${reqs[@]}" "$ORT==$ORT_VERSION"
  pip install -q --no-deps -e .
fi
.venv/bin/python - "$ORT" <<'PYEOF'
import sys
from importlib import metadata
have = [d for d in ("onnxruntime", "onnxruntime-gpu") if any(True for _ in metadata.distributions(name=d))]
assert have == [sys.argv[1]], f"expected only {sys.argv[1]} in .venv, found {have}"
PYEOF
