#!/usr/bin/env bash
# The FP16 GPU check (bench/gpu_check.py) against the INSTALLED fastnli, not this checkout's: only the bench folder is
# put on the path, from a scratch directory. Needs: pip install 'fastnli[export]'; pip uninstall -y onnxruntime;
# pip install onnxruntime-gpu. Options pass through (--out DIR, --require-gpu, --dry-run, --size); without a GPU it
# says so and does the CPU dry run. The whole check is stopped after 10 minutes (FASTNLI_GPU_CHECK_TIMEOUT seconds).
set -euo pipefail
bench_dir="$(cd "$(dirname "$0")" && pwd)"
out_default="$(pwd)/gpu_check_results"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
ln -s "$bench_dir" "$scratch/bench"
cd "$scratch"
PYTHONPATH="$scratch" timeout "${FASTNLI_GPU_CHECK_TIMEOUT:-600}" "${PYTHON:-python}" -m bench.gpu_check \
  --out "$out_default" "$@"
