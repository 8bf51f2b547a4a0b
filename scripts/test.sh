#!/usr/bin/env bash
# The test command: set up .venv, lint and type-check, build the sdist and wheel and check that the wheel installs and
# runs in a clean virtual environment (no torch, no transformers), check that the dependencies resolve on every
# supported platform (scripts/check_resolution.sh), then run the test suite.
#
# The lint, the wheel check and the build of uqlm's own venv (the parity tests' reference, .venv-uqlm or
# $FASTNLI_UQLM_VENV) are single-threaded and independent: they run side by side (about 4.5 min of pip for the uqlm
# venv on a slow 2-core machine). The suite waits for the wheel check; its uqlm tests wait for the venv through the
# venv's lock, so the suite starts before that build ends.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
logs=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$logs"' EXIT
.venv/bin/python -c "from bench.uqlm_peer import ensure_uqlm_env; ensure_uqlm_env(with_fastnli=True)" \
  >"$logs/uqlm" 2>&1 &
uqlm=$!
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
.venv/bin/python -m pytest -q "$@"
wait "$uqlm" || { cat "$logs/uqlm"; echo "building uqlm's venv failed" >&2; exit 1; }
