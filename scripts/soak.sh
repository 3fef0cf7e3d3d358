#!/usr/bin/env bash
# Soak test of `braid up` under faults (issue 13): one long TCP transfer (iperf3, server to
# client, 0.2 s interval reports) through a 3-link bundle between two network namespaces while
#   - links flap (interface down for FLAP_DOWN seconds, then up), FLAPS times in all,
#   - one uplink changes its address (as an LTE modem does when it reconnects),
#   - the server and the client are each restarted RESTARTS times (SIGTERM, started again).
# It passes if the transfer completes, it never moves nothing for more than MAX_STALL seconds
# (measured to the 0.2 s report interval), and every link is UP at both ends at the end.
#
# Usage: sudo scripts/soak.sh            (about 100 s)
#        SOAK_SECS=600 FLAPS=1000 RESTARTS=10 sudo -E scripts/soak.sh   (a longer run)
# Environment: BRAID (the binary; default target/release/braid), SOAK_SECS (transfer length),
# FLAPS, RESTARTS (of each endpoint), FLAP_DOWN (seconds), MAX_STALL (seconds), RATE (iperf3 -b),
# SOAK_TAG (namespace name suffix). Needs root, iproute2, iperf3, python3.
# Hosts only in the namespaces it creates; addresses from 198.18.0.0/15; it ends only the
# processes it started (by PID) and deletes its namespaces on exit, whatever happens.
set -euo pipefail

BRAID=${BRAID:-$(cd "$(dirname "$0")/.." && pwd)/target/release/braid}
SOAK_SECS=${SOAK_SECS:-90}
FLAPS=${FLAPS:-100}
RESTARTS=${RESTARTS:-2}
FLAP_DOWN=${FLAP_DOWN:-0.15}
MAX_STALL=${MAX_STALL:-2.0}
RATE=${RATE:-100M}
TAG=${SOAK_TAG:-$$}
C=brsoak${TAG}c
S=brsoak${TAG}s
DIR=$(mktemp -d)
PIDS=()

[ -x "$BRAID" ] || { echo "soak: $BRAID is not executable (cargo build --release)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "soak: needs root (network namespaces)" >&2; exit 2; }

log() { printf '%(%H:%M:%S)T soak: %s\n' -1 "$*"; }

cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  ip netns del "$C" 2>/dev/null || true
  ip netns del "$S" 2>/dev/null || true
  if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "soak: logs in $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT

ip netns add "$C"
ip netns add "$S"
ip -n "$C" link set lo up
ip -n "$S" link set lo up
for i in 1 2 3; do
  ip link add "c$i" netns "$C" type veth peer name "s$i" netns "$S"
  ip -n "$C" addr add "198.18.$i.1/24" dev "c$i"
  ip -n "$S" addr add "198.18.$i.2/24" dev "s$i"
  ip -n "$C" link set "c$i" up
  ip -n "$S" link set "s$i" up
done

KEY=$("$BRAID" keygen)
cat >"$DIR/s.toml" <<EOF
[bundle]
name = "braid0"
role = "server"
key = "$KEY"
address = "198.19.0.1/30"
mtu = 1400
listen = "0.0.0.0:5050"
control = "$DIR/s.sock"
EOF
cat >"$DIR/c.toml" <<EOF
[bundle]
name = "braid0"
role = "client"
key = "$KEY"
address = "198.19.0.2/30"
mtu = 1400
control = "$DIR/c.sock"

[[link]]
name = "isp1"
bind = "198.18.1.1"
remote = "198.18.1.2:5050"

[[link]]
name = "isp2"
bind = "198.18.2.1"
remote = "198.18.2.2:5050"

[[link]]
name = "isp3"
dev = "c3"
remote = "198.18.3.2:5050"
EOF

SERVER_PID=
CLIENT_PID=
start() { # start server|client
  local who=$1 ns cfg
  if [ "$who" = server ]; then ns=$S cfg=$DIR/s.toml; else ns=$C cfg=$DIR/c.toml; fi
  ip netns exec "$ns" "$BRAID" --log-level info up "$cfg" >>"$DIR/$who.log" 2>&1 &
  PIDS+=("$!")
  if [ "$who" = server ]; then SERVER_PID=$!; else CLIENT_PID=$!; fi
}
stop() { # stop server|client: SIGTERM, wait for the exit (at most 5 s)
  local pid
  if [ "$1" = server ]; then pid=$SERVER_PID; else pid=$CLIENT_PID; fi
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}
links_up() { # links_up c|s: how many links that end sees UP
  "$BRAID" --control "$DIR/$1.sock" status --json 2>/dev/null |
    python3 -c 'import json,sys; print(sum(l["state"]=="up" for l in json.load(sys.stdin)["links"]))' 2>/dev/null ||
    echo 0
}
wait_up() { # wait_up N SECONDS: until both ends see N links UP
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    [ "$(links_up c)" -ge "$1" ] && [ "$(links_up s)" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

start server
sleep 0.5
start client
wait_up 3 10 || { echo "soak: links did not come up" >&2; cat "$DIR"/*.log >&2; exit 1; }
log "3 links up; transfer of ${SOAK_SECS}s at $RATE with $FLAPS flaps, 1 address change, $RESTARTS restarts of each end"

ip netns exec "$S" iperf3 -s -1 -p 5201 -B 198.19.0.1 >/dev/null 2>&1 &
PIDS+=("$!")
sleep 0.3
ip netns exec "$C" iperf3 -c 198.19.0.1 -p 5201 -R -t "$SOAK_SECS" -i 0.2 -b "$RATE" -J \
  --connect-timeout 3000 >"$DIR/iperf.json" 2>"$DIR/iperf.err" &
IPERF=$!
PIDS+=("$IPERF")

# The faults, spread over the first 85% of the transfer: FLAPS flaps, one address change at a
# third, server and client restarts alternating between.
faults=$((FLAPS + 1 + 2 * RESTARTS))
gap=$(python3 -c "print(max(0.05, ($SOAK_SECS * 0.85 - 2) / $faults - $FLAP_DOWN))")
sleep 2
flaps=0 restarts=0 k=0
restart_every=$((faults / (2 * RESTARTS + 1)))
addr_at=$((faults / 3))
while [ $k -lt $faults ]; do
  k=$((k + 1))
  if [ $k -eq "$addr_at" ]; then
    log "isp3: address 198.18.3.1 -> 198.18.3.77"
    ip -n "$C" addr del 198.18.3.1/24 dev c3
    ip -n "$C" addr add 198.18.3.77/24 dev c3
  elif [ $restarts -lt $((2 * RESTARTS)) ] && [ $((k % restart_every)) -eq 0 ]; then
    who=server
    [ $((restarts % 2)) -eq 1 ] && who=client
    restarts=$((restarts + 1))
    log "restart $restarts: $who"
    stop "$who"
    start "$who"
  else
    i=$((flaps % 3 + 1))
    flaps=$((flaps + 1))
    ip -n "$C" link set "c$i" down
    sleep "$FLAP_DOWN"
    ip -n "$C" link set "c$i" up
  fi
  sleep "$gap"
done
log "$flaps flaps, $restarts restarts, 1 address change done; waiting for the transfer"

wait "$IPERF" || true
fail=0
python3 - "$DIR/iperf.json" "$MAX_STALL" <<'EOF' || fail=1
import json, sys
path, max_stall = sys.argv[1], float(sys.argv[2])
try:
    v = json.load(open(path))
except Exception as e:
    sys.exit(f"soak: no iperf3 report: {e}")
if v.get("error"):
    sys.exit(f"soak: iperf3: {v['error']}")
iv = [(i["sum"]["start"], i["sum"]["end"], i["sum"]["bytes"]) for i in v["intervals"]]
run = worst = 0.0
worst_at = 0.0
for start, end, b in iv:
    run = run + (end - start) if b == 0 else 0.0
    if run > worst:
        worst, worst_at = run, end
got = v["end"]["sum_received"]["bytes"]
secs = v["end"]["sum_received"]["seconds"]
print(f"soak: {got / 1e6:.0f} MB received in {secs:.1f} s ({got * 8 / secs / 1e6:.0f} Mbit/s), "
      f"longest stall {worst:.1f} s (ending at {worst_at:.1f} s)")
if secs < iv[-1][1] - 1 or got == 0:
    sys.exit("soak: the transfer did not complete")
if worst > max_stall:
    sys.exit(f"soak: the transfer moved nothing for {worst:.1f} s (> {max_stall} s)")
EOF
if ! wait_up 3 10; then
  echo "soak: not every link UP at the end: client $(links_up c), server $(links_up s)" >&2
  fail=1
fi
if [ "$fail" -ne 0 ]; then
  tail -n 40 "$DIR/client.log" "$DIR/server.log" >&2
  exit 1
fi
log "pass: every link UP at both ends"
