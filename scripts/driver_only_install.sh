#!/usr/bin/env bash
# A driver-only install, checked on a GPU machine with no package index: autogen goes into a fresh
# virtual environment with `pip install --no-index '.[EXTRA]'`, from wheels of the distributions
# that extra reaches (carried in .whl/ where the machine lacks them, else the machine's own,
# repacked by scripts/repack_installed.py: the files pip installed from the index). Then, with the
# system CUDA toolkit hidden (its folders covered in a private mount namespace where `unshare`
# works; CUDA_HOME/CUDA_PATH unset and no toolkit folder on PATH or LD_LIBRARY_PATH either way), it
# reports where NVRTC and cuBLAS are loaded from and runs the main command twice (cold, then answered
# from the database), then three times more, each in a fresh HOME that holds nothing but is pointed
# at that database (AUTOGEN_DB): every cache under ~/.cache/autogen is rebuilt, as for a new user of
# a shared database.
# Usage: scripts/driver_only_install.sh OUT_DIR [EXTRA, default cuda13]
set -uo pipefail
out=${1:?usage: scripts/driver_only_install.sh OUT_DIR [EXTRA]}
extra=${2:-cuda13}
cd "$(dirname "$0")/.."
mkdir -p "$out"
work=/tmp/driver-only
rm -rf "$work" && mkdir -p "$work/home"

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$work/site" .whl/*.whl || exit 1
fi
mapfile -t roots < <(python3 - "$extra" <<'PY'
import importlib.util, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
roots = project["project"]["dependencies"] + project["project"]["optional-dependencies"][sys.argv[1]]
roots += ["setuptools"] + [name for name in ("wheel",) if importlib.util.find_spec(name)]
print("\n".join(roots))
PY
)
PYTHONPATH="$work/site" python3 scripts/repack_installed.py "$work/wheels" "${roots[@]}" > "$out/repacked.txt" || exit 1
python3 -m venv "$work/venv" || exit 1
pip=("$work/venv/bin/python" -m pip install -q --no-index --find-links "$work/wheels")
{ "${pip[@]}" setuptools $(ls "$work/wheels" | grep -q '^wheel-' && echo wheel) &&
  "${pip[@]}" --no-build-isolation ".[$extra]"; } > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
"$work/venv/bin/python" -m pip list > "$out/venv_packages.txt" 2>&1

without_toolkit() {  # the command, with the system CUDA toolkit out of reach
  local keep_path keep_ld
  keep_path=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd:)
  keep_ld=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | grep -v -i cuda | paste -sd:)
  local cmd=(env -u CUDA_HOME -u CUDA_PATH -u CUDA_ROOT -u PYTHONPATH HOME="${HOME_FOR_RUN:-$work/home}" PATH="$keep_path"
             LD_LIBRARY_PATH="$keep_ld" "$@")
  if unshare -m --propagation private true 2>/dev/null; then
    unshare -m --propagation private sh -c \
      'for d in /usr/local/cuda*; do [ -d "$d" ] && mount -t tmpfs none "$d"; done; echo "hidden: $(ls -d /usr/local/cuda* 2>/dev/null | paste -sd" ") (empty here: $(ls /usr/local/cuda 2>/dev/null | wc -l) entries)" >&2; exec "$@"' sh "${cmd[@]}"
  else
    echo "unshare unavailable: toolkit hidden from PATH/LD_LIBRARY_PATH/CUDA_HOME only" >&2
    "${cmd[@]}"
  fi
}

without_toolkit "$work/venv/bin/python" - > "$out/libraries.txt" 2>&1 <<'PY'
import shutil
from cupy_backends.cuda.libs import nvrtc
from cuda.pathfinder import load_nvidia_dynamic_lib
print("nvrtc version", nvrtc.getVersion())
print("cublas", load_nvidia_dynamic_lib("cublas").abs_path)
print("nvcc on PATH:", shutil.which("nvcc"))
with open("/proc/self/maps") as maps:
    print("loaded:", *sorted({line.split()[-1] for line in maps if "nvrtc" in line or "cublas" in line}), sep="\n  ")
PY
cat "$out/libraries.txt"
for run in cold warm; do
  start=$(date +%s%N)
  without_toolkit "$work/venv/bin/autogen" tune sgemv --m 16384 --n 16 > "$out/tune_$run.txt" 2> "$out/tune_$run.err"
  status=$?
  echo "$run: exit $status, $(( ($(date +%s%N) - start) / 1000000 )) ms of process wall" | tee -a "$out/driver_only_summary.txt"
  tail -n 20 "$out/tune_$run.txt"
  [ $status -eq 0 ] || { tail -n 20 "$out/tune_$run.err"; exit 1; }
done
for run in 1 2 3; do
  fresh_home=$(mktemp -d)
  start=$(date +%s%N)
  HOME_FOR_RUN=$fresh_home without_toolkit "$work/venv/bin/autogen" tune sgemv --m 16384 --n 16 \
    --db "sqlite:///$work/home/.cache/autogen/tuning.db" > "$out/tune_fresh_home.txt" 2> "$out/tune_fresh_home.err"
  status=$?
  echo "fresh HOME $run: exit $status, $(( ($(date +%s%N) - start) / 1000000 )) ms of process wall" | tee -a "$out/driver_only_summary.txt"
  [ $status -eq 0 ] || { tail -n 20 "$out/tune_fresh_home.err"; exit 1; }
done
grep -h "answered from the database" "$out/tune_fresh_home.err" | tail -n 1
