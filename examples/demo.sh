#!/usr/bin/env bash
# The twice demo: train the bundled script twice under `twice run`, prove the weights are
# byte-identical, then show what plain runs (recorded with --observe) look like in comparison.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(pwd)/${DEMO_OUT:-demo-out}"
rm -rf "$out" && mkdir -p "$out"/{first,second,plain1,plain2,one,two}

train() {  # train FOLDER [twice run options...]: each run writes weights.pt in its own folder
  local folder="$1"; shift
  (cd "$out/$folder" && twice run --runs-dir "$out/runs" --name "$folder" "$@" -- python "$here/train.py" --workers 2)
}

echo "== 1. the same unmodified script, twice under twice run =="
train first
train second
cmp "$out/first/weights.pt" "$out/second/weights.pt" && echo "weights.pt: byte-identical"
echo
twice diff --runs-dir "$out/runs" "$out"/runs/*-first "$out"/runs/*-second

echo
echo "== 2. the same script as it behaves without twice (recorded with --observe) =="
train plain1 --observe > /dev/null
train plain2 --observe > /dev/null
cmp -s "$out/plain1/weights.pt" "$out/plain2/weights.pt" && echo "weights.pt: identical" || echo "weights.pt: differ"
twice diff "$out"/runs/*-plain1 "$out"/runs/*-plain2 || true

echo
echo "== 3. verify: run the first run again and prove every step matches =="
twice verify -q "$out"/runs/*-first

echo
echo "== 4. --portable: the same bits at 1 thread and at 2 with another instruction set =="
OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default train one --portable > /dev/null
OMP_NUM_THREADS=2 train two --portable > /dev/null
cmp "$out/one/weights.pt" "$out/two/weights.pt" && echo "weights.pt: byte-identical"
twice diff "$out"/runs/*-one "$out"/runs/*-two
