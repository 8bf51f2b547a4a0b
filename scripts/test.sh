#!/usr/bin/env bash
# The test command: set up .venv, lint and type-check, run the test suite, then build the sdist and wheel and
# check that the wheel installs and runs in a clean virtual environment (no torch, no transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check fastnli tests bench tools
.venv/bin/mypy fastnli
.venv/bin/python -m pytest -q "$@"
bash scripts/check_wheel.sh
