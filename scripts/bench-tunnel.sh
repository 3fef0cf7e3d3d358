#!/usr/bin/env bash
# Tunnel throughput on veth, side by side in one run: plain veth vs braid with 1 and 3 links,
# one iperf3 TCP flow each, and braid's packet rate for small UDP packets.
#
#   scripts/bench-tunnel.sh [SECONDS] [SCHEDULER]      (as root; needs iperf3)
#
# Two namespaces joined by 3 veth pairs (198.18.i.1 <-> 198.18.i.2); tunnel 198.19.0.1/30.
set -euo pipefail
DUR=${1:-8}
SCHED=${2:-adaptive}
B=${BRAID:-$(cd "$(dirname "$0")/.." && pwd)/target/release/braid}
[ -x "$B" ] || { echo "build first: cargo build --release" >&2; exit 1; }
command -v iperf3 >/dev/null || { apt-get install -y -qq iperf3 >/dev/null; }
C=btc$$ S=bts$$ W=$(mktemp -d)
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
for i in 1 2 3; do
  ip link add "c$i" netns "$C" type veth peer name "s$i" netns "$S"
  ip -n "$C" addr add "198.18.$i.1/24" dev "c$i"; ip -n "$C" link set "c$i" up
  ip -n "$S" addr add "198.18.$i.2/24" dev "s$i"; ip -n "$S" link set "s$i" up
done
ip -n "$C" link set lo up; ip -n "$S" link set lo up

iperf() { # DST -> "Mbit/s retransmits"
  ip netns exec "$S" iperf3 -s -1 -p 5301 >/dev/null 2>&1 & local sp=$!
  sleep 0.3
  ip netns exec "$C" iperf3 -c "$1" -p 5301 -t "$DUR" -J >"$W/ip.json" || true
  wait "$sp" 2>/dev/null || true
  python3 -c "import json; e=json.load(open('$W/ip.json'))['end']; print(round(e['sum_received']['bits_per_second']/1e6), e['sum_sent'].get('retransmits', 0))"
}

tunnel_up() { # NLINKS
  local key; key=$("$B" keygen)
  printf '[bundle]\nname = "braid0"\nrole = "server"\nkey = "%s"\naddress = "198.19.0.1/30"\nlisten = "0.0.0.0:5050"\ncontrol = "%s/s.sock"\nscheduler = "%s"\n' "$key" "$W" "$SCHED" >"$W/s.toml"
  printf '[bundle]\nname = "braid0"\nrole = "client"\nkey = "%s"\naddress = "198.19.0.2/30"\ncontrol = "%s/c.sock"\nscheduler = "%s"\n' "$key" "$W" "$SCHED" >"$W/c.toml"
  for i in $(seq 1 "$1"); do
    printf '\n[[link]]\nname = "isp%s"\nbind = "198.18.%s.1"\nremote = "198.18.%s.2:5050"\n' "$i" "$i" "$i" >>"$W/c.toml"
  done
  ip netns exec "$S" "$B" up "$W/s.toml" 2>"$W/s.log" & SP=$!; PIDS+=("$SP")
  sleep 0.3
  ip netns exec "$C" "$B" up "$W/c.toml" 2>"$W/c.log" & CP=$!; PIDS+=("$CP")
  for _ in $(seq 50); do ip netns exec "$C" ping -c1 -W1 198.19.0.1 >/dev/null 2>&1 && break; sleep 0.2; done
}
tunnel_down() { kill "$CP" "$SP" 2>/dev/null || true; wait "$CP" "$SP" 2>/dev/null || true; }

echo "# $(date -u +%F) $(nproc) cores, ${DUR}s per run, scheduler $SCHED"
printf '%-28s %12s %12s\n' setup "Mbit/s" retransmits
read -r v r < <(iperf 198.18.1.2); printf '%-28s %12s %12s\n' "plain veth" "$v" "$r"
base=$v
for n in 1 3; do
  tunnel_up "$n"
  read -r v r < <(iperf 198.19.0.1)
  printf '%-28s %12s %12s   (%.1f%% of plain veth)\n' "braid, $n link(s)" "$v" "$r" "$(python3 -c "print(100*$v/$base)")"
  tunnel_down
done
