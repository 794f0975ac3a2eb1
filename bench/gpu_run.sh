#!/usr/bin/env bash
# The GPU proof on a CUDA machine with no network: install twice from this checkout (plus any
# wheels placed in .devwheels/, for packages that machine lacks), then run bench/gpu_check.py
# under a time limit. Results (gpu_check.json, gpu_check.md, the log) go to $OUT.
#   OUT=gpu-out bash bench/gpu_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if ls .devwheels/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps .devwheels/*.whl >"$OUT/install.log" 2>&1
fi
if ! $PY -m pip install -q --no-deps --no-build-isolation -e . >>"$OUT/install.log" 2>&1; then
  echo "note: pip could not install twice here (see install.log); using src/ from PYTHONPATH"
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
$PY -c "import torch, twice; print('twice from', twice.__file__); print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU', torch.cuda.is_available())"
export PYTHONUNBUFFERED=1
timeout "${GPU_CHECK_TIMEOUT:-420}" $PY bench/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
