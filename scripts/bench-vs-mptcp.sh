#!/usr/bin/env bash
# braid against kernel MPTCP, side by side in the same lab run, over the scenarios of issue 10:
# one TCP flow, CUBIC and BBR, upload and download. Prints a markdown table (and keeps each
# run's JSON in $OUT).
#
#   scripts/bench-vs-mptcp.sh [SECONDS] [SCENARIO...]     (as root; needs mptcpize)
#   SCENARIOS: default 10-20-50 ratio7 lossy lte spread100 mixed lossy-fast far spread200   (default: all)
#   CCS="cubic bbr" DIRS="up down" EXTRA="--scheduler adaptive" BRAID=/tmp/braid scripts/bench-vs-mptcp.sh 20
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-20}
shift || true
SCENARIOS=("$@")
# shellcheck source=scripts/lab-scenarios.sh
. scripts/lab-scenarios.sh
((${#SCENARIOS[@]})) || SCENARIOS=("${SCENARIO_NAMES[@]}")
for sc in "${SCENARIOS[@]}"; do scenario_links "$sc" >/dev/null || exit 2; done
CCS=${CCS:-"cubic bbr"}
DIRS=${DIRS:-"up down"}
EXTRA=${EXTRA:-}
OUT=${OUT:-$(mktemp -d /tmp/braid-vs-mptcp.XXXXXX)}
mkdir -p "$OUT"
command -v mptcpize >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mptcpize >/dev/null; }
# BRAID=path runs that binary (e.g. a copy, so that a rebuild cannot change it mid-run).
if [ -z "${BRAID:-}" ]; then
  cargo build --release -q
  BRAID=target/release/braid
fi

# "behind pacing": the share of the run in which that sender, not window-limited, sent under
# 80% of its own pacing rate (the lab's `sender_behind_pacing`): a run far below its usual
# figure with a high share measured the host's CPU, not the scheduler (README, "The lab").
# "from the 2nd second": the ratio of the two runs' mean goodput over their seconds after the
# first (each run's seconds count from its first byte read), the start-up left out: braid's
# inner flow starts at the equalised round trip, MPTCP's first subflow at the fastest link's
# (docs/scheduling.md, "What is still open").
echo "| scenario | cc | direction | best link alone | MPTCP | braid | braid / MPTCP | from the 2nd second | braid retrans | MPTCP retrans | behind pacing braid / MPTCP |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for sc in "${SCENARIOS[@]}"; do
  for cc in $CCS; do
    for dir in $DIRS; do
      rev=""; [ "$dir" = down ] && rev="--reverse"
      f="$OUT/$sc-$cc-$dir.json"
      # shellcheck disable=SC2046
      if ! $BRAID lab --quiet --json --duration "$DUR" --cc "$cc" $rev --compare mptcp \
          $(scenario_links "$sc") $EXTRA >"$f" 2>"$f.err"; then
        echo "| $sc | $cc | $dir | failed: $(head -c 200 "$f.err") |"
        continue
      fi
      python3 - "$f" "$sc" "$cc" "$dir" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
sc, cc, d = sys.argv[2:5]
n = r["nominal_sum_bps"]
b = r["bundle"]["run"]; m = r["compare"]["run"]
best = r.get("best_single_bps") or 0
pct = lambda x: f"{100*x/n:.1f}%"
rt = lambda x: f"{100*x['tcp_retransmits']/max(1,x['tcp_segments']):.2f}%"
bp = lambda x: "-" if x.get("sender_behind_pacing") is None else f"{x['sender_behind_pacing']:.2f}"
def later(x):
    s = x.get("per_second_bps") or []
    return sum(s[1:]) / max(1, len(s) - 1)
after = f"{later(b) / later(m):.2f}x" if later(m) > 0 else "-"
print(f"| {sc} | {cc} | {d} | {pct(best)} | {pct(m['goodput_bps'])} | {pct(b['goodput_bps'])} | "
      f"{r['bundle_vs_compare']:.2f}x | {after} | {rt(b)} | {rt(m)} | {bp(b)} / {bp(m)} |")
PY
    done
  done
done
echo
echo "(goodput as % of the nominal sum of link rates; $DUR s per run; JSON in $OUT)"
