#!/usr/bin/env bash
# Does `pip install fastnli` resolve to binary wheels on every platform we support, with the right ONNX Runtime?
# For Linux x86_64, Linux aarch64, macOS arm64 and Windows amd64 (CPython 3.11) it asks pip for a full resolution
# (`pip install --dry-run --report --only-binary=:all: --platform ...`, nothing is installed) of
#   base: the [project] dependencies of pyproject.toml (fastnli itself is a compiled wheel built per platform, so its
#         requirements stand in for it): must resolve everywhere, with plain `onnxruntime` and never onnxruntime-gpu;
#   gpu:  `onnxruntime-gpu`, the GPU command of the README: must resolve on Linux x86_64 and Windows amd64 (elsewhere
#         ONNX Runtime publishes no CUDA wheels, and the plain install is the right one).
# Prints a matrix; exits 1 when a required cell fails. Needs the package index (a few seconds per cell); with
# --skip-offline (scripts/test.sh) an unreachable index skips the check with a note instead of failing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
SKIP_OFFLINE=$([ "${1:-}" = "--skip-offline" ] && echo 1 || echo 0) "$PY" - <<'PYEOF'
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

PLATFORMS = {  # name -> pip --platform tags: a glibc 2.28 Linux (Debian 10+, RHEL 8+) takes manylinux 2_17..2_28
    "linux x86_64": [f"manylinux_2_{v}_x86_64" for v in (28, 27, 26, 24, 17)] + ["manylinux2014_x86_64"],
    "linux aarch64": [f"manylinux_2_{v}_aarch64" for v in (28, 27, 26, 24, 17)] + ["manylinux2014_aarch64"],
    "macOS arm64": ["macosx_14_0_arm64"],  # pip expands macOS tags to older versions itself
    "windows amd64": ["win_amd64"],
}
GPU_REQUIRED = {"linux x86_64", "windows amd64"}
OFFLINE_SIGNS = ("NewConnectionError", "Could not fetch URL", "Temporary failure in name resolution",
                 "Network is unreachable", "ConnectTimeoutError", "Connection refused")
offline: list[str] = []
base = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]


def resolve(reqs: list[str], tags: list[str]) -> tuple[dict[str, str] | None, str]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--retries", "1",
               "--timeout", "20", "--report",
               str(report), "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
               "--target", str(Path(tmp) / "target")]
        for tag in tags:
            cmd += ["--platform", tag]
        run = subprocess.run(cmd + reqs, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            if any(k in run.stderr for k in OFFLINE_SIGNS):
                offline.append(" ".join(tags))
            lines = [l for l in run.stderr.splitlines() if l.startswith("ERROR")]
            return None, (lines[0] if lines else run.stderr.strip()[-200:])
        got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
        return got, ""


failures = []
rows = []
for name, tags in PLATFORMS.items():
    got, err = resolve(base, tags)
    if got is None:
        cell = f"FAIL ({err})"
        failures.append(f"{name}: base does not resolve: {err}")
    else:
        both = "onnxruntime" in got and "onnxruntime-gpu" in got
        cell = f"OK onnxruntime {got.get('onnxruntime', 'MISSING')}, numpy {got.get('numpy')}, {len(got)} wheels"
        if "onnxruntime" not in got or "onnxruntime-gpu" in got or both:
            failures.append(f"{name}: base resolves to {sorted(k for k in got if k.startswith('onnxruntime'))}")
    gpu, gerr = resolve(["onnxruntime-gpu"], tags)
    gcell = f"OK onnxruntime-gpu {gpu['onnxruntime-gpu']}" if gpu else "no wheel (use the plain install)"
    if gpu is None and name in GPU_REQUIRED:
        failures.append(f"{name}: onnxruntime-gpu does not resolve: {gerr}")
    rows.append((name, cell, gcell))

w = [max(len(r[i]) for r in rows + [("platform", "pip install fastnli (base)", "GPU: onnxruntime-gpu")])
     for i in range(3)]
print(f"{'platform':<{w[0]}} | {'pip install fastnli (base)':<{w[1]}} | GPU: onnxruntime-gpu")
print(f"{'-' * w[0]}-|-{'-' * w[1]}-|-{'-' * w[2]}")
for r in rows:
    print(f"{r[0]:<{w[0]}} | {r[1]:<{w[1]}} | {r[2]}")
if failures and offline and os.environ.get("SKIP_OFFLINE") == "1":
    print("check_resolution: the package index is unreachable; platform resolution not checked", file=sys.stderr)
    sys.exit(0)
if failures:
    print("resolution check FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
PYEOF
