#!/usr/bin/env bash
# The test command: set up .venv, lint and type-check, build the sdist and wheel and check that the wheel installs and
# runs in a clean virtual environment (no torch, no transformers), check that the dependencies resolve on every
# supported platform (scripts/check_resolution.sh), then run the test suite.
#
# The build of uqlm's own venv (the parity tests' reference, .venv-uqlm or $FASTNLI_UQLM_VENV; about 4.5 min of
# single-threaded pip on a slow 2-core machine) runs beside the set-up, the lint and the wheel check, which runs beside
# the lint. The suite waits for the wheel check; its uqlm tests wait for the venv through the venv's lock. The suite
# lists its 20 slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$logs"' EXIT
# bench.uqlm_peer needs the standard library only: the uqlm venv's build starts beside the set-up of .venv
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -c "import sys; sys.path.insert(0, '.'); from bench.uqlm_peer import ensure_uqlm_env; ensure_uqlm_env(with_fastnli=True)" \
  >"$logs/uqlm" 2>&1 &
uqlm=$!
bash scripts/setup.sh
bash scripts/check_wheel.sh >"$logs/wheel" 2>&1 &
wheel=$!
.venv/bin/ruff check fastnli tests bench tools
.venv/bin/mypy fastnli bench tools
status=0
wait "$wheel" || status=$?
cat "$logs/wheel"
[ "$status" -eq 0 ] || { echo "scripts/check_wheel.sh failed (exit $status)" >&2; exit "$status"; }
# pip resolves the runtime requirements to binary wheels on Linux x86_64/aarch64, macOS arm64, Windows (about 10 s)
bash scripts/check_resolution.sh --skip-offline
.venv/bin/python -m pytest -q --durations=20 "$@"
wait "$uqlm" || { cat "$logs/uqlm"; echo "building uqlm's venv failed" >&2; exit 1; }
