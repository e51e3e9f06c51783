#!/usr/bin/env bash
# Byte-compile autogen and the packages a tune imports, in place, as a pip install leaves them
# (called by gpu_check.sh and bench_scale_out.sh before they time anything). The GPU machine's
# Python runs with PYTHONDONTWRITEBYTECODE=1 and ships CuPy, NumPy and Jinja2 without bytecode,
# so every process compiled them from source on import: part of each GPU worker's cold start
# (docs/distributed.md, "Measured on two H200s") that a user's installed environment does not pay.
# Packages already compiled are skipped (compileall checks each file's time stamp); a folder that
# cannot be written is left as it is.
cd "$(dirname "$0")/.."
dirs=$(python3 - <<'PY' 2>/dev/null
import importlib.util
for name in ("cupy", "cupy_backends", "numpy", "optuna", "sqlalchemy", "alembic", "jinja2", "torch"):
    spec = importlib.util.find_spec(name)
    if spec and spec.submodule_search_locations:
        print(list(spec.submodule_search_locations)[0])
PY
)
python3 -m compileall -q -j 0 autogen tuning_db $dirs >/dev/null 2>&1 || true
