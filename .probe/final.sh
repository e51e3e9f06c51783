# Final GPU run: GPU tests, the vocabulary softmax, first-contact timings. Results under $1.
set -u
R=$1; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 AUTOGEN_CACHE_DIR=/tmp/kc
python3 -m compileall -q -j0 autogen tuning_db >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
stage=${STAGE:-all}
if [ "$stage" = tests ] || [ "$stage" = all ]; then
  timeout ${TEST_TIMEOUT:-480} python3 -m pytest -m gpu -q -p no:cacheprovider -n ${NPROC:-4} --dist loadfile --durations=25 ${TESTS:-tests} > $R/gpu_tests.log 2>&1
  echo "gpu tests exit $?"; tail -n 40 $R/gpu_tests.log | grep -E "passed|failed|FAIL|Error" | head -30
fi
if [ "$stage" = demo ] || [ "$stage" = all ]; then
  export AUTOGEN_DB=sqlite:////tmp/vocab.db HOME=/tmp/vocabhome
  mkdir -p $HOME
  timeout 120 python3 -m autogen tune softmax --rows 32 --cols 128256 --dtype float16 > $R/vocab_tune.txt 2> $R/vocab_tune.err
  echo "vocab tune exit $?"; cat $R/vocab_tune.txt; grep -c "failed validation\|relative L2" $R/vocab_tune.err
  timeout 120 python3 - > $R/vocab_dispatch.txt 2>&1 <<'PY'
import cupy, autogen
from autogen.measure import rounding_error
x = (cupy.random.default_rng(0).random((3, 100003), dtype=cupy.float32) - 0.5).astype(cupy.float16)
y = autogen.softmax(x)
k = autogen.lookup("softmax", dtype="float16", rows=3, cols=100003)
r = x.astype(cupy.float64); r = cupy.exp(r - r.max(1, keepdims=True)); r /= r.sum(1, keepdims=True)
err = float(cupy.linalg.norm(y.astype(cupy.float64) - r) / cupy.linalg.norm(r))
print(k.served_by, k.name, f"error {err:.3g}, rounded reference {rounding_error(cupy, r, 'float16'):.3g}")
PY
  echo "vocab dispatch exit $?"; cat $R/vocab_dispatch.txt
  unset AUTOGEN_DB; export HOME=/root
  timeout ${FC_TIMEOUT:-300} scripts/bench_first_contact.sh $R/first_contact ${FC_FAMILIES:-hgemv gelu copy_if}
fi
