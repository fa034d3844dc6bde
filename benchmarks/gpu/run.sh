#!/usr/bin/env bash
# The GPU run in one device call (see benchmarks/gpu/run.py): install the carried wheels the image lacks into
# /tmp/medtx-site, then run everything, writing report.json, report.md, logs.txt and results-*.tar into $OUT.
# Device tool call: command "bash benchmarks/gpu/run.sh", carry ["benchmarks/gpu/payload"], timeout_s 590.
# Extra arguments go to run.py (e.g. --budget-s 400 --epochs 2). Budget plan: benchmarks/notes/2026-11-28-gpu-plan.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
PAYLOAD=${PAYLOAD:-benchmarks/gpu/payload}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if compgen -G "$PAYLOAD/wheels/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/medtx-site \
    "$PAYLOAD"/wheels/*.whl || { echo "run.sh: installing the carried wheels failed" >&2; exit 2; }
  export PYTHONPATH=/tmp/medtx-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
python3 benchmarks/gpu/run.py --payload "$PAYLOAD" --out "$OUT" "$@"
