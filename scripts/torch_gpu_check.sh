#!/usr/bin/env bash
# On a GPU machine with torch (CUDA build) and CuPy: the autogen.torch checks in one command.
#   scripts/torch_gpu_check.sh OUT_DIR
# 1. the GPU tests of autogen.torch (opcheck per family, torch.compile fullgraph and reduce-overhead
#    with no graph break, patch vs F.linear, unpatch): OUT_DIR/torch_tests.log
# 2. autogen tune-model llama-3-8b (the database $AUTOGEN_DB, default /tmp/autogen-torch-check.db;
#    resumed if run again): its table in OUT_DIR/tune_model.log, OUT_DIR/tune_model.json, OUT_DIR/tune_model_llama-3-8b.html
# 3. scripts/bench_llama_decode.py at batch 1 and 4 on that database's winners:
#    OUT_DIR/llama_decode_<gpu>.{json,html} and llama_decode.log
# STAGES (default "tests tune bench") picks steps. Each step has its own time limit (STEP_TIMEOUT,
# default 540 s); a tune cut short keeps every completed trial and problem, and the same command
# continues it, so under a 10-minute command limit run STAGES=tune until its table has every
# kernel, then STAGES="tests bench". BATCHES (default 1,2,4,8) and TRIALS (default 30) are
# tune-model's --batch and --trials. The exit status is the worst of the steps'.
set -uo pipefail
out=${1:?usage: scripts/torch_gpu_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
# Dependencies: from wheels carried in .whl/ when the machine has no network (as gpu_check.sh).
if ! python3 -c 'import optuna, sqlalchemy, alembic' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/autogen-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/autogen-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
export AUTOGEN_CACHE_DIR=${AUTOGEN_CACHE_DIR:-/tmp/autogen-kernel-cache}
# Outside OUT_DIR: a device machine's OUT_DIR starts empty on every command; /tmp stays while it is held.
export AUTOGEN_DB=${AUTOGEN_DB:-sqlite:////tmp/autogen-torch-check.db}
python3 -c 'import torch, cupy; assert torch.cuda.is_available()' || { echo "torch_gpu_check: needs torch with CUDA and CuPy" >&2; exit 1; }
status=0
stages=${STAGES:-tests tune bench}
limit=${STEP_TIMEOUT:-540}
batches=${BATCHES:-1,2,4,8}
trials=${TRIALS:-30}
step() {  # step NAME LIMIT_S COMMAND...: run with a deadline, log to OUT_DIR/NAME.log
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$out/summary.txt"
  timeout --kill-after=30 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "   exit $rc" | tee -a "$out/summary.txt"
  [ $rc -gt $status ] && status=$rc
  return 0
}
case " $stages " in *" tests "*)
  step torch_tests "$limit" python3 -m pytest -q -p no:cacheprovider tests/pytorch ;; esac
case " $stages " in *" tune "*)
  step tune_model "$limit" python3 -m autogen tune-model llama-3-8b --batch "$batches" --trials "$trials" \
    --report "$out/tune_model_llama-3-8b.html"
  # Once complete, the same command answers from the database: the JSON, with no more search.
  step tune_model_json 120 sh -c "python3 -m autogen tune-model llama-3-8b --batch '$batches' --trials '$trials' --json > '$out/tune_model.json'" ;; esac
case " $stages " in *" bench "*)
  step llama_decode "$limit" python3 scripts/bench_llama_decode.py --out "$out" --batches 1,4 ;; esac
tail -n 5 "$out"/*.log 2>/dev/null
exit $status
