#!/usr/bin/env bash
# On a GPU machine: install what is missing, run the GPU tests, then the benchmarks.
# Usage: scripts/gpu_check.sh OUT_DIR [pytest args...]   (logs and JSON land in OUT_DIR)
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [pytest args...]}
shift
mkdir -p "$out"
cd "$(dirname "$0")/.."

# Dependencies: from wheels carried in .whl/ when the machine has no network, else from PyPI.
if ! python3 -c 'import optuna, sqlalchemy, alembic' 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/autogen-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/autogen-site:${PYTHONPATH:-}
  else
    python3 -m pip install -q optuna sqlalchemy alembic || exit 1
  fi
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
export AUTOGEN_CACHE_DIR=${AUTOGEN_CACHE_DIR:-$out/kernel-cache}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider "$@" tests 2>&1 | tee "$out/gpu_tests.log" || status=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 scripts/bench_sgemv.py --out "$out" 2>&1 | tee "$out/bench.log" || status=1
fi
exit $status
