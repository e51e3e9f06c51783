#!/usr/bin/env bash
# A CPU build of PyTorch for the tests of autogen.torch (registration, schemas, fake kernels,
# tracing), into the current Python environment: never the CUDA build PyPI serves by default
# (several GB). In order: torch already importable -> nothing; PyTorch's CPU index -> its wheel;
# else a CPU wheel that pip finds locally (its find-links) for torch==$AUTOGEN_CPU_TORCH (default
# 2.13.0), checked to be "+cpu" before installing. Where none can be had, says so: the torch
# tests then skip. Always exits 0: the rest of the suite does not need torch.
set -uo pipefail
python=${PYTHON:-python}
version=${AUTOGEN_CPU_TORCH:-2.13.0}
if "$python" -c "import torch" 2>/dev/null; then
  echo "install_cpu_torch: torch $("$python" -c 'import torch; print(torch.__version__)') already installed"
  exit 0
fi
if "$python" -m pip install -q --timeout 20 --retries 0 --index-url https://download.pytorch.org/whl/cpu \
     "torch==$version" 2>/dev/null; then
  echo "install_cpu_torch: torch $version (CPU build)"
  exit 0
fi
report=$(mktemp)
trap 'rm -f "$report"' EXIT
if "$python" -m pip install -q --dry-run --ignore-installed --no-deps --report "$report" "torch==$version" 2>/dev/null \
   && grep -q "+cpu" "$report"; then
  if "$python" -m pip install -q "torch==$version"; then
    echo "install_cpu_torch: torch $version (CPU) from a local wheel"
    exit 0
  fi
fi
echo "install_cpu_torch: no CPU build of torch could be installed here; the torch tests will be skipped" >&2
exit 0
