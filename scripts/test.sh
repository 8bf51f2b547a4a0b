#!/usr/bin/env bash
# The test command: set up .venv, lint and type-check, run the test suite, then build the sdist and wheel and
# check that the wheel installs and runs in a clean virtual environment (no torch, no transformers), and check that
# the dependencies resolve on every supported platform (scripts/check_resolution.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check fastnli tests bench tools
.venv/bin/mypy fastnli bench tools
.venv/bin/python -m pytest -q "$@"
bash scripts/check_wheel.sh
# pip resolves the runtime requirements to binary wheels on Linux x86_64/aarch64, macOS arm64, Windows (about 10 s)
bash scripts/check_resolution.sh --skip-offline
