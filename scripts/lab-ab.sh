#!/usr/bin/env bash
# Two builds of braid (or one build in two environments) on the same lab cells, by turns seed by
# seed, summed up per cell: each side's mean, least and most goodput (% of the links' sum), its
# mean longest stall and retransmissions, and B's mean difference from A over the paired runs
# with its standard error. One lab run of a jittery or lossy mix spreads 20-30 points from seed
# to seed (BENCHMARKS.md §4, "Back-pressure: the queue's limit switched off"), so a change to the
# scheduler is judged over several seeds of both builds, run alternately on the same quiet machine.
#
#   scripts/lab-ab.sh A B [SCENARIO:CC:DIR ...]                  (as root)
#   A, B: a braid binary, optionally with environment settings after a colon, comma-separated
#         (/tmp/braid-main, /tmp/braid-new:BRAID_X=1,BRAID_Y=2)
#   SCENARIO: one of scripts/lab-scenarios.sh's, or "custom" (links from EXTRA only);
#   CC: cubic|bbr; DIR: up|down. Default cells: lte:cubic:up lte:cubic:down.
#   SEEDS="1 2 3 4" DUR=20 OUT=/tmp/ab EXTRA="--backpressure --no-bandwidth-hint" \
#     scripts/lab-ab.sh /tmp/braid-main /tmp/braid-new lte:cubic:up ratio7:bbr:down
#   EXTRA_A, EXTRA_B: lab arguments for one side only (one binary, two settings:
#     EXTRA_B="--equalize-max 150" scripts/lab-ab.sh /tmp/braid /tmp/braid ratio7:cubic:up)
#
# Each run is `braid lab --quiet --json --skip-single --duration DUR --seed S --cc CC [--reverse]
# <the scenario's links> EXTRA EXTRA_A|EXTRA_B`, under `flock /tmp/braid-lab.lock` (lab runs must not overlap:
# they are CPU-bound on this 2-core VM) and a timeout of 4 x DUR + 120 s; the JSON of every run
# stays in OUT (SCENARIO-CC-DIR-SEED-A|B.json).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lab-scenarios.sh
. scripts/lab-scenarios.sh
if [ $# -lt 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
A=$1 B=$2
shift 2
CELLS=("$@")
((${#CELLS[@]})) || CELLS=(lte:cubic:up lte:cubic:down)
SEEDS=${SEEDS:-"1 2 3 4"}
DUR=${DUR:-20}
EXTRA=${EXTRA:-}
EXTRA_A=${EXTRA_A:-}
EXTRA_B=${EXTRA_B:-}
OUT=${OUT:-$(mktemp -d /tmp/braid-ab.XXXXXX)}
mkdir -p "$OUT"

# The binary and the environment of a side ("path[:K=V,K=V]").
side_bin() { echo "${1%%:*}"; }
side_env() { [[ $1 == *:* ]] && echo "${1#*:}" | tr ',' ' ' || true; }
for s in "$A" "$B"; do
  [ -x "$(side_bin "$s")" ] || { echo "lab-ab: $(side_bin "$s") is not an executable" >&2; exit 2; }
done
for cell in "${CELLS[@]}"; do
  IFS=: read -r sc cc dir <<<"$cell"
  scenario_links "$sc" >/dev/null || exit 2
  case "$cc:$dir" in cubic:up | cubic:down | bbr:up | bbr:down) ;; *)
    echo "lab-ab: cell $cell: expected SCENARIO:cubic|bbr:up|down" >&2; exit 2 ;;
  esac
done

for cell in "${CELLS[@]}"; do
  IFS=: read -r sc cc dir <<<"$cell"
  rev=""; [ "$dir" = down ] && rev="--reverse"
  for seed in $SEEDS; do
    for label in A B; do
      spec=$A side_extra=$EXTRA_A
      [ $label = B ] && spec=$B side_extra=$EXTRA_B
      f="$OUT/$sc-$cc-$dir-$seed-$label.json"
      # shellcheck disable=SC2046,SC2086
      env $(side_env "$spec") flock /tmp/braid-lab.lock timeout $((DUR * 4 + 120)) \
        "$(side_bin "$spec")" lab --quiet --json --skip-single --duration "$DUR" --seed "$seed" \
        --cc "$cc" $rev $(scenario_links "$sc") $EXTRA $side_extra >"$f" 2>"$f.err" ||
        echo "lab-ab: $cell seed $seed $label failed: $(head -c 300 "$f.err")" >&2
    done
  done
done

python3 - "$OUT" "$A" "$B" "$SEEDS" "${CELLS[@]}" <<'PY'
import json, math, os, statistics as st, sys
out, a, b, seeds, cells = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5:]

def run(cell, seed, label):
    sc, cc, d = cell.split(":")
    try:
        r = json.load(open(f"{out}/{sc}-{cc}-{d}-{seed}-{label}.json"))
    except (OSError, ValueError):
        return None
    x = r["bundle"]["run"]
    return (100 * x["goodput_bps"] / r["nominal_sum_bps"], x["longest_gap_ms"],
            100 * x["tcp_retransmits"] / max(1, x["tcp_segments"]))

extra = {k: os.environ.get(k, "") for k in ("EXTRA", "EXTRA_A", "EXTRA_B")}
print(f"A = {a} {extra['EXTRA_A']}\nB = {b} {extra['EXTRA_B']}\nboth: {extra['EXTRA']}\nseeds: {' '.join(seeds)}\n")
print("| cell | A: mean (least-most) | B: mean (least-most) | B - A (s.e.) | stall ms A / B | retrans A / B | runs |")
print("|---|---|---|---|---|---|---|")
for cell in cells:
    pairs = [(run(cell, s, "A"), run(cell, s, "B")) for s in seeds]
    pairs = [(x, y) for x, y in pairs if x and y]
    if not pairs:
        print(f"| {cell} | no complete pair of runs | | | | | 0 |")
        continue
    ga = [x[0] for x, _ in pairs]; gb = [y[0] for _, y in pairs]
    diff = [y - x for x, y in zip(ga, gb)]
    se = st.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    mean = lambda v: sum(v) / len(v)
    print(f"| {cell} | {mean(ga):.1f}% ({min(ga):.1f}-{max(ga):.1f}) | {mean(gb):.1f}% ({min(gb):.1f}-{max(gb):.1f}) "
          f"| {mean(diff):+.1f} ({se:.1f}) | {mean([x[1] for x, _ in pairs]):.0f} / {mean([y[1] for _, y in pairs]):.0f} "
          f"| {mean([x[2] for x, _ in pairs]):.2f}% / {mean([y[2] for _, y in pairs]):.2f}% | {len(pairs)} |")
print(f"\n(goodput as % of the nominal sum of link rates; JSON in {out})")
PY
