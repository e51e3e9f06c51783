#!/usr/bin/env bash
# On a GPU machine: install what is missing, run the GPU tests, then the benchmarks.
# Usage: [STAGES="tests bench"] scripts/gpu_check.sh OUT_DIR [pytest args...]
# Logs and JSON land in OUT_DIR.
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
# Kept out of OUT_DIR: only a few files come back from the device machine.
export AUTOGEN_CACHE_DIR=${AUTOGEN_CACHE_DIR:-/tmp/autogen-kernel-cache}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
# Stages (default: all): tests, pretuned (tune the shipped grid), bench (sgemv vs cuBLAS),
# dispatch (dispatcher overhead and regret), families (reduce/softmax benchmarks), quality
# (search strategies against exhaustive search).
stages=${STAGES:-tests pretuned bench dispatch families}
grid_db=${GRID_DB:-sqlite:///$out/pretuned.db}
status=0
# Each stage gets its own deadline, so one slow stage cannot starve the others.
limit=${STAGE_TIMEOUT:-300}
for stage in $stages; do
  case $stage in
    tests) timeout $limit python3 -m pytest -m gpu -q -p no:cacheprovider "$@" tests 2>&1 | tee "$out/gpu_tests.log" || status=1 ;;
    pretuned) timeout $limit python3 scripts/make_pretuned.py --out "$out" --db "$grid_db" 2>&1 | tail -n 3 | tee "$out/pretuned.log" || status=1 ;;
    bench) timeout $limit python3 scripts/bench_sgemv.py --out "$out" --db "$grid_db" 2>&1 | tee "$out/bench.log" || status=1 ;;
    dispatch) timeout $limit python3 scripts/bench_dispatch.py --db "$grid_db" --out "$out" ${DISPATCH_ARGS:-} 2>&1 | tee "$out/dispatch.log" || status=1 ;;
    families) timeout $limit python3 scripts/bench_reduce_softmax.py --out "$out" 2>&1 | tee "$out/families.log" || status=1 ;;
    quality) timeout $limit python3 scripts/search_quality.py --out "$out" --grid-db "$grid_db" 2>&1 | tee "$out/quality.log" || status=1 ;;
    *) echo "unknown stage $stage" >&2; status=1 ;;
  esac
done
exit $status
