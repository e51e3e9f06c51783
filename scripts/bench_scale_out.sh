#!/usr/bin/env bash
# Issue 38's runs on a machine with two GPUs (nvidia-h100-x2 or nvidia-h200-x2), each cold (its own
# database, kernel cache and CuPy cache): 8 sgemv shapes x 60 trials and 1 shape x 240 trials on 1
# vs 2 GPUs, then 1 vs 2 processes (one per GPU) sharing a SQLite file, then sharing a PostgreSQL
# server started here from the folder scripts/pack_postgres.sh packs (.pg). About 5 minutes.
#   scripts/bench_scale_out.sh OUT      (carry .whl and .pg; OUT gets multi_gpu_<gpu>.json and logs.tar.gz)
set -uo pipefail
out=${1:?usage: scripts/bench_scale_out.sh OUT}
mkdir -p "$out"
cd "$(dirname "$0")/.."
work=/tmp/autogen-scale-out
rm -rf "$work" && mkdir -p "$work"
site=/tmp/autogen-site
# Dependencies as scripts/gpu_check.sh installs them, with psycopg's wheels from .pg.
if ! python3 -c 'import optuna, sqlalchemy, alembic' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl || exit 1
fi
if ! python3 -c 'import psycopg' 2>/dev/null && ls .pg/wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$site" .pg/wheels/*.whl >/dev/null 2>&1 || true
fi
export PYTHONPATH=$PWD:$site:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
scripts/bytecode.sh  # as a pip install leaves the packages: with bytecode, so a cold start is a user's
nvidia-smi --query-gpu=name,driver_version --format=csv > "$work/gpu.txt" 2>&1
status=0
step() {  # step NAME TIMEOUT_S COMMAND...: its output in $work/NAME.log
  local name=$1 limit=$2; shift 2
  echo "== $name" >&2
  timeout "$limit" "$@" > "$work/$name.log" 2>&1 || { echo "$name failed ($?)" >&2; status=1; }
  tail -n 8 "$work/$name.log" >&2
}
step gpus 240 python3 scripts/bench_multi_gpu.py --out "$work" --part all
step procs_sqlite 150 python3 scripts/bench_multi_gpu.py --out "$work" --part procs
if [ -x .pg/pg.sh ] && url=$(.pg/pg.sh start "$work/pg" 55432 2>"$work/pg_start.log"); then
  step procs_postgresql 150 python3 scripts/bench_multi_gpu.py --out "$work" --part procs --db "$url"
  .pg/pg.sh stop "$work/pg"
else
  echo "no PostgreSQL here: $(tail -n 3 "$work/pg_start.log" 2>/dev/null)" >&2
  status=1
fi
cp "$work"/multi_gpu_*.json "$work/gpu.txt" "$out/" 2>/dev/null
tar -czf "$out/logs.tar.gz" -C "$work" --exclude='*/kernels' --exclude='*/cupy' --exclude='*/cache' \
  --exclude='*.db' --exclude='pg' . 2>/dev/null
exit $status
