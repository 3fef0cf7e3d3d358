#!/usr/bin/env bash
# The simulator's TCP table over several start offsets of the inner flow, summed up per cell
# (median, least and most of the goodput as a share of the links' sum, median inner
# retransmissions and longest stall). One run of the simulator is deterministic but chaotic: a
# flow started a millisecond later, or one more control packet on a link, can move a cell by
# 20 points (BENCHMARKS.md §4, "The simulator is chaotic"), so a change is judged over offsets.
#
#   scripts/sim-ensemble.sh [sim_tcp arguments...]
#   e.g. scripts/sim-ensemble.sh --no-single --scenario 3
#        OFFSETS="0 1 2 3 5 7" SIM=/tmp/sim_tcp scripts/sim-ensemble.sh --failover --no-single
#
# OFFSETS: start offsets in ms (default "0 1 2 3 5 7"); SIM: a sim_tcp binary (default: the
# example built from this tree in release mode). Runs two offsets at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
OFFSETS=${OFFSETS:-0 1 2 3 5 7}
if [ -z "${SIM:-}" ]; then
  cargo build --release -q -p braid-core --example sim_tcp
  SIM=target/release/examples/sim_tcp
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
pids=()
for off in $OFFSETS; do
  "$SIM" "$@" --json --start-offset "$off" >"$OUT/$off.json" &
  pids+=($!)
  if [ ${#pids[@]} -eq 2 ]; then
    for p in "${pids[@]}"; do wait "$p"; done
    pids=()
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
python3 - "$OUT" $OFFSETS <<'PY'
import json, statistics, sys
out, offsets = sys.argv[1], sys.argv[2:]
cells = {}
for off in offsets:
    for line in open(f"{out}/{off}.json"):
        if not line.startswith("{"):
            continue  # not a report (--list, --help)
        r = json.loads(line)
        key = (r["name"], r["cc"], r["direction"], r["scheduler"])
        cells.setdefault(key, []).append(r)
if not cells:
    sys.exit("sim-ensemble: the simulator printed no report (see its arguments)")
print(f"offsets (ms): {' '.join(offsets)}")
print("| scenario | cc | direction | scheduler | of sum: median | least | most | retransmits (median) | longest stall ms (median, most) |")
print("|---|---|---|---|---|---|---|---|---|")
for (name, cc, d, s), rs in cells.items():
    share = [r["of_sum"] * 100 for r in rs]
    rtx = statistics.median(r["retransmits"] for r in rs)
    stall = [r["longest_stall_ms"] for r in rs]
    print(f"| {name} | {cc} | {d} | {s} | {statistics.median(share):.1f}% | {min(share):.1f}% "
          f"| {max(share):.1f}% | {rtx:.0f} | {statistics.median(stall):.0f}, {max(stall):.0f} |")
PY
