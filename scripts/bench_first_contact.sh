#!/usr/bin/env bash
# On a GPU machine: what a newcomer waits for. (1) `autogen tune sgemv --m 16384 --n 16` answered
# from the database, as a second run in the same HOME and in a fresh HOME holding only the database
# (every cache under ~/.cache/autogen rebuilt); (2) `autogen export FAMILY --self-test` then the
# build (make) and the self-test (make check) of each family named, from the shipped catalog's
# winners for this GPU. Writes OUT_DIR/first_contact.json and prints a table.
# Usage: scripts/bench_first_contact.sh OUT_DIR [FAMILY ...] (default: hgemv gelu copy_if)
set -uo pipefail
out=${1:?usage: scripts/bench_first_contact.sh OUT_DIR [FAMILY ...]}
shift
families=("$@")
[ ${#families[@]} -gt 0 ] || families=(hgemv gelu copy_if)
mkdir -p "$out"
cd "$(dirname "$0")/.."
autogen=(python3 -m autogen)
command -v autogen >/dev/null && autogen=(autogen)
results="$out/first_contact.jsonl"
: > "$results"

seconds() {  # label, command...: runs it, appends {"label", "seconds", "status"} to the results
  local label=$1 start status
  shift
  start=$(date +%s%N)
  "$@" > "$out/$label.log" 2>&1
  status=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '{"label": "%s", "seconds": %d.%03d, "status": %d}\n' "$label" $((ms / 1000)) $((ms % 1000)) $status >> "$results"
  printf '%-28s %8d ms  exit %d\n' "$label" $ms $status
}

home=$(mktemp -d)
HOME=$home seconds tune_first "${autogen[@]}" tune sgemv --m 16384 --n 16
for i in 1 2 3; do HOME=$home seconds "tune_again_$i" "${autogen[@]}" tune sgemv --m 16384 --n 16; done
db=$home/.cache/autogen/tuning.db
for i in 1 2 3; do
  HOME=$(mktemp -d) AUTOGEN_DB=sqlite:///$db seconds "tune_again_fresh_home_$i" "${autogen[@]}" tune sgemv --m 16384 --n 16
done

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
for family in "${families[@]}"; do
  dir=/tmp/first-contact-export-$family
  rm -rf "$dir"
  seconds "export_$family" "${autogen[@]}" export "$family" --out "$dir" --self-test --gpu "$gpu"
  seconds "build_$family" make -C "$dir"
  seconds "check_$family" make -C "$dir" check
  tail -n 5 "$out/check_$family.log"
done
python3 - "$results" "$out/first_contact.json" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
json.dump(rows, open(sys.argv[2], "w"), indent=1)
PY
