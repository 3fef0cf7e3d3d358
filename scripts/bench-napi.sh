#!/usr/bin/env bash
# NAPI's trade-off as braid's `batch_wait_us` (issue 12 item 5): CPU of both tunnel endpoints and
# ping latency through the tunnel against the packet rate, with 60-byte packets, for a few
# settings of `batch_wait_us`; then a PNG drawn by scripts/plot-napi.py.
#
#   scripts/bench-napi.sh [SECONDS] [RATES] [WAITS]          (as root, after cargo build --release)
#   scripts/bench-napi.sh 5 "5000 20000 50000 100000" "0 20 50 100 200"    (the defaults)
#   BRAID=/tmp/braid-copy OUT=docs/napi.png scripts/bench-napi.sh
#
# One veth link (198.18.1.1 <-> 198.18.1.2) between namespaces bnc$$/bns$$, braid at each end
# (tunnel 198.19.0.0/30). Per (wait, rate): iperf3 sends UDP with 32-byte payloads (60-byte IP
# packets) client -> server through the tunnel at RATE packets/s, while ping (every 10 ms) measures
# the RTT through the tunnel; CPU% is utime + stime of both braid processes (from /proc) over the
# run, in % of one core; with `perf` installed, also the context switches per second of both
# (`perf stat -e context-switches`: one per sleep and wake-up, so fewer means bigger batches). Writes CSV (OUT with .csv) and the PNG (OUT, default docs/napi-tradeoff.png).
# Installs iperf3 and python3-matplotlib if missing. Cleans up on exit.
set -euo pipefail
DUR=${1:-5}
RATES=${2:-"5000 20000 50000 100000"}
WAITS=${3:-"0 20 50 100 200"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${BRAID:-$ROOT/target/release/braid}
OUT=${OUT:-$ROOT/docs/napi-tradeoff.png}
CSV=${OUT%.png}.csv
[ -x "$B" ] || { echo "build first: cargo build --release (or set BRAID=)" >&2; exit 1; }
need=()
command -v iperf3 >/dev/null || need+=(iperf3)
# The plot wants matplotlib: the first python3 on PATH that has it, else Debian's.
PLOT_PY=python3
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  PLOT_PY=/usr/bin/python3
  /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || need+=(python3-matplotlib)
fi
if ((${#need[@]})); then
  apt-get install -y -qq "${need[@]}" >/dev/null || { apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; }
fi
C=bnc$$ S=bns$$ W=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$C" 2>/dev/null || true
  ip netns del "$S" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT INT TERM
ip netns add "$C"; ip netns add "$S"
ip link add c1 netns "$C" type veth peer name s1 netns "$S"
ip -n "$C" addr add 198.18.1.1/24 dev c1; ip -n "$C" link set c1 up
ip -n "$S" addr add 198.18.1.2/24 dev s1; ip -n "$S" link set s1 up
ip -n "$C" link set lo up; ip -n "$S" link set lo up

ticks() { # PID... -> utime+stime summed, in clock ticks
  local t=0 p
  for p in "$@"; do
    t=$((t + $(sed -E 's/^.*\) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$t"
}

braid_up() { # WAIT_US
  local key; key=$("$B" keygen)
  printf '[bundle]\nname = "braid0"\nrole = "server"\nkey = "%s"\naddress = "198.19.0.1/30"\nlisten = "0.0.0.0:5050"\ncontrol = "%s/s.sock"\nbatch_wait_us = %s\n' "$key" "$W" "$1" >"$W/s.toml"
  printf '[bundle]\nname = "braid0"\nrole = "client"\nkey = "%s"\naddress = "198.19.0.2/30"\ncontrol = "%s/c.sock"\nbatch_wait_us = %s\n\n[[link]]\nname = "isp1"\nbind = "198.18.1.1"\nremote = "198.18.1.2:5050"\n' "$key" "$W" "$1" >"$W/c.toml"
  ip netns exec "$S" "$B" up "$W/s.toml" 2>"$W/s.log" & SP=$!; PIDS+=("$SP")
  sleep 0.3
  ip netns exec "$C" "$B" up "$W/c.toml" 2>"$W/c.log" & CP=$!; PIDS+=("$CP")
  for _ in $(seq 50); do ip netns exec "$C" ping -c1 -W1 198.19.0.1 >/dev/null 2>&1 && return; sleep 0.2; done
  echo "tunnel did not come up:" >&2; cat "$W/c.log" "$W/s.log" >&2; exit 1
}
braid_down() { kill "$CP" "$SP" 2>/dev/null || true; wait "$CP" "$SP" 2>/dev/null || true; }

run() { # WAIT RATE -> CSV row
  local wait=$1 rate=$2 t0 t1 sent
  ip netns exec "$S" iperf3 -s -1 -p 5302 >/dev/null 2>&1 & local isp=$!
  sleep 0.3
  t0=$(ticks "$CP" "$SP")
  local w0; w0=$(date +%s.%N)
  ip netns exec "$C" ping -q -i 0.01 -w "$DUR" 198.19.0.1 >"$W/ping.txt" 2>&1 & local pp=$!
  : >"$W/perf.txt"
  local perfp=""
  if command -v perf >/dev/null; then
    perf stat -x, -e context-switches -p "$CP,$SP" -o "$W/perf.txt" -- sleep "$DUR" 2>/dev/null & perfp=$!
  fi
  ip netns exec "$C" iperf3 -c 198.19.0.1 -p 5302 -u -l 32 -b $((rate * 32 * 8)) -t "$DUR" -J \
    >"$W/ip.json" 2>/dev/null || true
  wait "$pp" || true
  [ -n "$perfp" ] && { wait "$perfp" || true; }
  t1=$(ticks "$CP" "$SP")
  local w1; w1=$(date +%s.%N)
  wait "$isp" 2>/dev/null || true
  python3 - "$W/ip.json" "$W/ping.txt" "$W/perf.txt" "$DUR" "$wait" "$rate" "$t0" "$t1" "$w0" "$w1" "$(getconf CLK_TCK)" <<'PY'
import json, re, sys
ipj, pingf, perff, dur, wait, rate, t0, t1, w0, w1, hz = sys.argv[1:]
try:
    e = json.load(open(ipj))["end"]["sum"]
    pps = e["packets"] / e["seconds"]
    lost = e["lost_percent"]
except Exception:
    pps, lost = 0.0, 100.0
text = open(pingf).read()
m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", text)
avg, mx = (float(m.group(2)), float(m.group(3))) if m else (float("nan"), float("nan"))
cpu = 100.0 * (int(t1) - int(t0)) / int(hz) / (float(w1) - float(w0))
cs = ""
for line in open(perff):
    f = line.split(",")
    if len(f) > 2 and f[2].startswith("context-switches") and f[0].isdigit():
        cs = f"{int(f[0]) / float(dur):.0f}"
print(f"{wait},{rate},{pps:.0f},{lost:.2f},{cpu:.1f},{avg:.3f},{mx:.3f},{cs}")
PY
}

echo "wait_us,rate_pps,sent_pps,loss_pct,cpu_pct,ping_avg_ms,ping_max_ms,cswitch_per_s" >"$CSV"
echo "# $(date -u +%F) $(nproc) cores, ${DUR}s per point, braid $("$B" --version)" >&2
for wait in $WAITS; do
  braid_up "$wait"
  for rate in $RATES; do
    row=$(run "$wait" "$rate")
    echo "$row" | tee -a "$CSV" >&2
  done
  braid_down
done
"$PLOT_PY" "$ROOT/scripts/plot-napi.py" "$CSV" "$OUT"
echo "wrote $CSV and $OUT" >&2
