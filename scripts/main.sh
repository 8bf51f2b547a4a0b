#!/usr/bin/env bash
# The main job, end to end on a fresh machine: set up .venv, then score NCP (and its siblings) on the example file
# with the embedded default model — offline, on CPU, INT8 ONNX Runtime, no torch at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
work=${FASTNLI_WORK:-.work}
mkdir -p "$work"
.venv/bin/fastnli score examples/ncp.jsonl -o "$work/ncp.out.jsonl" \
  --scorers noncontradiction,entailment,semantic_negentropy,semantic_sets_confidence
cat "$work/ncp.out.jsonl"
