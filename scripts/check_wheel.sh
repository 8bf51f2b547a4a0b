#!/usr/bin/env bash
# Build the sdist and the wheel, install the wheel into a fresh venv with runtime dependencies only, and score pairs
# with an artifact exported by the dev environment: proves the compiled extension and package data ship.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf dist && .venv/bin/python -m build -q --outdir dist . >/dev/null
ls dist/*.whl dist/*.tar.gz
# The wheel holds fastnli/ only: no benchmarks, synthetic checkpoints, training records, tools or tests.
.venv/bin/python - dist/*.whl <<'PYEOF'
import sys
import zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
banned = ("benchmark", "synthetic", "quality.json", "tools", "bench", "tests")
found = [n for n in names if any(b in part for part in n.split("/") for b in banned)]
assert not found, f"the wheel ships equipment that belongs beside the package: {found}"
assert all(n.startswith(("fastnli/", "fastnli-")) for n in names), [n for n in names if not n.startswith("fastnli")]
lic = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
assert lic and b"Apache License" in zipfile.ZipFile(sys.argv[1]).read(lic[0]), "the wheel carries no LICENSE"
print(f"wheel contents OK: {len(names)} files, all under fastnli/, LICENSE in {lic[0]}")
PYEOF
# (grep without -q reads the whole listing: an early exit would kill tar with SIGPIPE and fail the pipe)
tar -tzf dist/*.tar.gz | grep -x 'fastnli-[^/]*/LICENSE' >/dev/null || { echo "the sdist carries no LICENSE" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/python -m fastnli checkpoint "$tmp/ck" >/dev/null
.venv/bin/python -m fastnli export "$tmp/ck" --out "$tmp/art" --precisions fp32,int8 >/dev/null
PY=${PYTHON:-python3.11}; command -v "$PY" >/dev/null || PY=python3
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q dist/*.whl
cd "$tmp"
"$tmp/venv/bin/python" - "$tmp/art" <<'PYEOF'
import sys
import importlib.util
import fastnli
from fastnli import kernels
from fastnli.engine import NLIEngine
assert kernels.IMPLEMENTATION == "compiled", kernels.IMPLEMENTATION
assert importlib.util.find_spec("torch") is None and importlib.util.find_spec("transformers") is None
engine = NLIEngine.from_pretrained(sys.argv[1], device="cpu")
probs = engine.predict([("A man plays guitar.", "A man makes music."), ("Paris", "Lyon")])
assert probs.shape == (2, 3) and abs(float(probs.sum()) - 2.0) < 1e-4
int8 = NLIEngine.from_pretrained(sys.argv[1], device="cpu", precision="int8")  # DeBERTa v1: attention fused
assert int8.fused_layers > 0, "the wheel's operator library (fastnli.kernels._ortops) did not load"
default = NLIEngine.from_pretrained(device="cpu")  # the embedded default model ships in the wheel
assert default.precision == "int8", default
clear = default.predict([("A man is playing a guitar on stage.", "A man is playing an instrument.")])
assert clear.argmax() == 2, clear
print(f"wheel OK: fastnli {fastnli.__version__}, kernels {kernels.IMPLEMENTATION}, {engine!r} "
      f"(INT8: {int8.fused_layers} layers fused), default {default!r}")
PYEOF
