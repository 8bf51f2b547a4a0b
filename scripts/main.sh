#!/usr/bin/env bash
# The main job, end to end on a fresh machine: set up .venv, build a seeded deberta-large-mnli-architecture
# checkpoint (tiny width; no hub needed), export it to ONNX (fp32/fp16/int8, validated against PyTorch) and
# score the example file.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
work=${FASTNLI_WORK:-.work}
mkdir -p "$work"
.venv/bin/fastnli checkpoint "$work/checkpoint" --arch deberta --size tiny
.venv/bin/fastnli export "$work/checkpoint" --out "$work/artifact"
.venv/bin/fastnli predict examples/pairs.jsonl --model "$work/artifact" -o "$work/pairs.out.jsonl"
cat "$work/pairs.out.jsonl"
