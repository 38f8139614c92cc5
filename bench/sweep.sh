#!/usr/bin/env bash
# bench/sweep.sh — fsdp-bench --sweep (strategies x prefetch depths) at several
# world sizes, one mpirun launch per size, merged into one JSON document that
# bench/plot.py turns into charts. At even world sizes of 4 and more the sweep
# adds HSDP rows: 2 replica groups of N/2 ranks
# (SHARD_SIZES="0,S,..." overrides; 0 = the world), each with the bytes per
# step it moves in the shard group and in the replica group.
#
#   bench/sweep.sh [OUT.json] [fsdp-bench flags...]
#   NPS="1 2 4" BENCH=build/fsdp-bench bench/sweep.sh bench/results/sweep-cpu.json --iters 20
#   SHARD_SIZES="0,2,1" NPS=4 bench/sweep.sh out.json   (4 ranks as 1x4, 2x2, 4x1)
#
# Defaults: NPS="1 2 4", BENCH=build/fsdp-bench, OUT=bench/results/sweep.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/mpi-env.sh
out=${1:-bench/results/sweep.json}
shift || true
bench=${BENCH:-build/fsdp-bench}
[ -x "$bench" ] || { echo "sweep.sh: no $bench: build first (meson setup build && ninja -C build)" >&2; exit 2; }
parts=()
trap 'rm -f "${parts[@]}"' EXIT
for np in ${NPS:-1 2 4}; do
  part=$(mktemp "${TMPDIR:-/tmp}/fsdp-sweep-np$np.XXXXXX")
  parts+=("$part")
  shards=${SHARD_SIZES:-}
  if [ -z "$shards" ] && [ "$np" -ge 4 ] && [ $((np % 2)) -eq 0 ]; then shards="0,$((np / 2))"; fi
  hsdp=()
  [ -n "$shards" ] && hsdp=(--sweep-shard-sizes "$shards")
  echo "sweep.sh: $np rank(s): mpirun -np $np $bench --sweep ${hsdp[*]} --json $*" >&2
  mpirun "${FSDP_MPIRUN_ARGS[@]}" -np "$np" "$bench" --sweep "${hsdp[@]}" --json "$@" > "$part"
done
python3 - "$out" "${parts[@]}" <<'PY'
import json, sys
runs = [json.load(open(p)) for p in sys.argv[2:]]
wrong = sum(r["wrong"] for r in runs)
json.dump({"bench": "fsdp-bench sweep", "world_sizes": [r["world_size"] for r in runs],
           "machine": runs[0]["machine"], "wrong": wrong, "runs": runs}, open(sys.argv[1], "w"),
          indent=1)
print(f"sweep.sh: {sum(len(r['results']) for r in runs)} configurations at N = "
      f"{[r['world_size'] for r in runs]}, {wrong} wrong -> {sys.argv[1]}", file=sys.stderr)
sys.exit(1 if wrong else 0)
PY
