#!/usr/bin/env bash
# On a GPU machine: install what is missing, run the GPU tests, then the benchmarks.
# Usage: [STAGES="tests bench"] scripts/gpu_check.sh OUT_DIR [pytest args and test paths; default tests]
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
# Byte-compiled as a pip install leaves it: process wall times (the speed stage) then measure
# autogen, not the compiling of its modules (and CuPy's, NumPy's...) on every start.
scripts/bytecode.sh
# Kept out of OUT_DIR: only a few files come back from the device machine.
export AUTOGEN_CACHE_DIR=${AUTOGEN_CACHE_DIR:-/tmp/autogen-kernel-cache}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
# Stages (default: tests pretuned bench dispatch families): tests (every GPU test), pretuned (tune
# the shipped sgemv grid), bench (sgemv vs cuBLAS), dispatch (host cost per family, regret),
# families (reduce/softmax), quality (search strategies against exhaustive search), and the
# benchmarks of the families and features added since: sgemm, hgemv, elementwise, gemm_bias_act,
# scan, transpose_concat, histogram_copy_if, speed (tuning wall time with phases), pdl (programmatic dependent launch),
# multi_gpu (needs two GPUs), driver_only (a fresh venv from wheels, the system toolkit hidden). Each bench stage stores its winners in $GRID_DB or its own database
# under OUT_DIR; scripts/catalog_from.py turns them into the shipped catalog of the GPU.
stages=${STAGES:-tests pretuned bench dispatch families}
grid_db=${GRID_DB:-sqlite:///$out/pretuned.db}
status=0
# Each stage gets its own deadline, so one slow stage cannot starve the others.
limit=${STAGE_TIMEOUT:-300}
run_stage() {  # name, then the command; its output goes to OUT_DIR/<name>.log
  local name=$1
  shift
  timeout $limit "$@" 2>&1 | tee "$out/$name.log" || status=1
}
# The GPU suite: one pytest process per two cores at most 8 (each holds a CUDA context and its
# memory pool; the suite took 342 s with 8 on a 16-core H100 machine), its own deadline, short
# tracebacks, and the log gzipped (a failing run's log passed 16 MiB, over what a device call
# brings back).
run_tests() {
  local procs=${GPU_TEST_PROCS:-$(( $(nproc) / 2 < 8 ? ($(nproc) / 2 > 0 ? $(nproc) / 2 : 1) : 8 ))}
  timeout ${TESTS_TIMEOUT:-540} python3 -m pytest -m gpu -q -p no:cacheprovider -n "$procs" --dist loadfile \
    --tb=short -rfE --durations=30 "$@" > "$out/gpu_tests.log" 2>&1 || status=1
  grep -E "^(FAILED|ERROR) " "$out/gpu_tests.log" | cut -c1-200 | head -40
  tail -n 1 "$out/gpu_tests.log"
  gzip -f -9 "$out/gpu_tests.log"
}
for stage in $stages; do
  case $stage in
    tests) run_tests "${@:-tests}" ;;
    pretuned) run_stage pretuned python3 scripts/make_pretuned.py --out "$out" --db "$grid_db" ;;
    bench) run_stage bench python3 scripts/bench_sgemv.py --out "$out" --db "$grid_db" ;;
    dispatch) run_stage dispatch python3 scripts/bench_dispatch.py --db "$grid_db" --out "$out" ${DISPATCH_ARGS:-} ;;
    families) run_stage families python3 scripts/bench_reduce_softmax.py --out "$out" ;;
    quality) run_stage quality python3 scripts/search_quality.py --out "$out" --grid-db "$grid_db" ;;
    sgemm) run_stage sgemm python3 scripts/bench_sgemm.py --out "$out/sgemm" --db "sqlite:///$out/sgemm.db" ;;
    hgemv) run_stage hgemv python3 scripts/bench_hgemv.py --out "$out/hgemv" --db "sqlite:///$out/hgemv.db" ;;
    elementwise) run_stage elementwise python3 scripts/bench_elementwise.py --out "$out/elementwise" --db "sqlite:///$out/elementwise.db" ;;
    gemm_bias_act) run_stage gemm_bias_act python3 scripts/bench_gemm_bias_act.py --out "$out/gemm_bias_act" --db "sqlite:///$out/gemm_bias_act.db" --trials 24 --budget 220 ;;
    scan) run_stage scan python3 scripts/bench_scan.py --out "$out/scan" --db "sqlite:///$out/scan.db" --trials 12 --budget 240 ;;
    transpose_concat) run_stage transpose_concat python3 scripts/bench_transpose_concat.py --out "$out/tc" --trials 24 --budget 150 ;;
    histogram_copy_if) run_stage histogram_copy_if python3 scripts/bench_histogram_copy_if.py --out "$out/hc" --db "sqlite:///$out/hc.db" ;;
    speed) run_stage speed python3 scripts/bench_tune_speed.py --out "$out/speed" ;;
    pdl) run_stage pdl python3 scripts/bench_pdl.py --out "$out/pdl" ;;
    multi_gpu) run_stage multi_gpu python3 scripts/bench_multi_gpu.py --out "$out/multi_gpu" ;;
    driver_only) run_stage driver_only scripts/driver_only_install.sh "$out/driver_only" ;;
    *) echo "unknown stage $stage" >&2; status=1 ;;
  esac
done
exit $status
