#!/usr/bin/env bash
# The data path against its anchors, side by side in one run (issue 12):
#   1. one unshaped veth link, one iperf3 TCP flow: plain veth, wireguard-go (Debian's package),
#      braid over one link; Gbit/s and CPU seconds per gigabyte of both tunnel endpoints together
#      (utime + stime from /proc/PID/stat, before and after the transfer);
#   2. two veth links shaped to RATE each (tbf, default 1gbit): each link alone, summed, and braid
#      over both; upload and download (iperf3 -R).
#
#   scripts/bench-datapath.sh [SECONDS] [RATE]         (as root; installs iperf3, wireguard-go,
#                                                       wireguard-tools if missing)
#   BRAID=/tmp/braid-copy scripts/bench-datapath.sh    (a fixed binary: rebuilds cannot change it
#                                                       mid-run)
#   TASKSET=0 scripts/bench-datapath.sh                (pin every process to CPU 0: the 1-core case)
#   EXTRA='batch_wait_us = 50' scripts/bench-datapath.sh   (more [bundle] keys for both ends)
#   PART=1 scripts/bench-datapath.sh                   (only the one veth link)
#   PART=2 DIRS=down REPEAT=5 scripts/bench-datapath.sh    (only the 2-link bundle, download,
#                                                       braid run 5 times: run-to-run spread)
#   SECONDS_TOO=1 scripts/bench-datapath.sh            (each run's Gbit/s second by second too)
#   OMIT=2 scripts/bench-datapath.sh                   (every iperf3 run leaves out its first 2 s:
#                                                       steady state, start-up excluded alike;
#                                                       the CPU column counts the CPU of those
#                                                       seconds but not their bytes: overstated)
#
# Namespaces bdc$$/bds$$, veth 198.18.i.1 <-> 198.18.i.2, tunnels 198.19.0.0/30 (braid) and
# 198.19.1.0/30 (wireguard-go). Cleans up on exit.
set -euo pipefail
DUR=${1:-8}
RATE=${2:-1gbit}
B=${BRAID:-$(cd "$(dirname "$0")/.." && pwd)/target/release/braid}
[ -x "$B" ] || { echo "build first: cargo build --release (or set BRAID=)" >&2; exit 1; }
need=()
command -v iperf3 >/dev/null || need+=(iperf3)
command -v wireguard-go >/dev/null || need+=(wireguard-go)
command -v wg >/dev/null || need+=(wireguard-tools)
if ((${#need[@]})); then
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
case ${PART:-all} in all|1|2) ;; *) echo "PART is all, 1 or 2, not $PART" >&2; exit 2 ;; esac
for d in ${DIRS:-up down}; do
  case $d in up|down) ;; *) echo "DIRS holds up and/or down, not $d" >&2; exit 2 ;; esac
done
PIN=()
[ -n "${TASKSET:-}" ] && PIN=(taskset -c "$TASKSET")
C=bdc$$ S=bds$$ W=$(mktemp -d)
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
for i in 1 2; do
  ip link add "c$i" netns "$C" type veth peer name "s$i" netns "$S"
  ip -n "$C" addr add "198.18.$i.1/24" dev "c$i"; ip -n "$C" link set "c$i" up
  ip -n "$S" addr add "198.18.$i.2/24" dev "s$i"; ip -n "$S" link set "s$i" up
done
ip -n "$C" link set lo up; ip -n "$S" link set lo up

cpu_ticks() { # PID... -> utime+stime summed, in clock ticks
  local t=0 p f
  for p in "$@"; do
    f=$(sed -E 's/^.*\) //' "/proc/$p/stat")
    t=$((t + $(awk '{print $12 + $13}' <<<"$f")))
  done
  echo "$t"
}

iperf() { # DST [-R] -> "Gbit/s bytes"
  ip netns exec "$S" "${PIN[@]}" iperf3 -s -1 -p 5301 >/dev/null 2>&1 & local sp=$!
  sleep 0.3
  ip netns exec "$C" "${PIN[@]}" iperf3 -c "$1" -p 5301 -t "$DUR" -O "${OMIT:-0}" ${2:-} -J >"$W/ip.json" || true
  wait "$sp" 2>/dev/null || true
  python3 -c "import json; e=json.load(open('$W/ip.json'))['end']['sum_received']; print(round(e['bits_per_second']/1e9, 3), e['bytes'])"
  # SECONDS_TOO=1: each second's Gbit/s as well (on stderr), to see the start-up.
  [ -z "${SECONDS_TOO:-}" ] || python3 -c "import json; print('  per second:', ' '.join(str(round(i['sum']['bits_per_second']/1e9, 2)) for i in json.load(open('$W/ip.json'))['intervals']))" >&2
}

measure() { # LABEL DST [-R] [PIDS...] -> prints a row; sets GBPS
  local label=$1 dst=$2 rev=$3; shift 3
  local t0 t1 g bytes cpu=""
  [ $# -gt 0 ] && t0=$(cpu_ticks "$@")
  read -r g bytes < <(iperf "$dst" "$rev")
  if [ $# -gt 0 ]; then
    t1=$(cpu_ticks "$@")
    cpu=$(python3 -c "print(round(($t1-$t0)/$(getconf CLK_TCK)/($bytes/1e9), 2))")
  fi
  GBPS=$g
  printf '%-40s %10s %16s\n' "$label" "$g" "${cpu:--}"
}

braid_up() { # NLINKS
  local key; key=$("$B" keygen)
  printf '[bundle]\nname = "braid0"\nrole = "server"\nkey = "%s"\naddress = "198.19.0.1/30"\nlisten = "0.0.0.0:5050"\ncontrol = "%s/s.sock"\n%s\n' "$key" "$W" "${EXTRA:-}" >"$W/s.toml"
  printf '[bundle]\nname = "braid0"\nrole = "client"\nkey = "%s"\naddress = "198.19.0.2/30"\ncontrol = "%s/c.sock"\n%s\n' "$key" "$W" "${EXTRA:-}" >"$W/c.toml"
  for i in $(seq 1 "$1"); do
    printf '\n[[link]]\nname = "isp%s"\nbind = "198.18.%s.1"\nremote = "198.18.%s.2:5050"\n' "$i" "$i" "$i" >>"$W/c.toml"
  done
  ip netns exec "$S" "${PIN[@]}" "$B" up "$W/s.toml" 2>"$W/s.log" & SP=$!; PIDS+=("$SP")
  sleep 0.3
  ip netns exec "$C" "${PIN[@]}" "$B" up "$W/c.toml" 2>"$W/c.log" & CP=$!; PIDS+=("$CP")
  for _ in $(seq 50); do ip netns exec "$C" ping -c1 -W1 198.19.0.1 >/dev/null 2>&1 && break; sleep 0.2; done
}
braid_down() { kill "$CP" "$SP" 2>/dev/null || true; wait "$CP" "$SP" 2>/dev/null || true; }

# wireguard-go's control socket is /var/run/wireguard/<ifname>.sock, in the one shared file system:
# the two ends need different interface names (wgc$$, wgs$$).
WC=wgc$$ WS=wgs$$
wg_up() {
  local ck sk
  ck=$(wg genkey); sk=$(wg genkey)
  WG_PROCESS_FOREGROUND=1 ip netns exec "$C" "${PIN[@]}" wireguard-go -f "$WC" >"$W/wgc.log" 2>&1 & WGC=$!; PIDS+=("$WGC")
  WG_PROCESS_FOREGROUND=1 ip netns exec "$S" "${PIN[@]}" wireguard-go -f "$WS" >"$W/wgs.log" 2>&1 & WGS=$!; PIDS+=("$WGS")
  for _ in $(seq 50); do
    [ -S "/var/run/wireguard/$WC.sock" ] && [ -S "/var/run/wireguard/$WS.sock" ] && break
    sleep 0.1
  done
  ip netns exec "$S" wg set "$WS" listen-port 51820 private-key <(echo "$sk") \
    peer "$(echo "$ck" | wg pubkey)" allowed-ips 198.19.1.2/32
  ip netns exec "$C" wg set "$WC" private-key <(echo "$ck") \
    peer "$(echo "$sk" | wg pubkey)" allowed-ips 198.19.1.1/32 endpoint 198.18.1.2:51820
  ip -n "$S" addr add 198.19.1.1/30 dev "$WS"; ip -n "$S" link set "$WS" up
  ip -n "$C" addr add 198.19.1.2/30 dev "$WC"; ip -n "$C" link set "$WC" up
  for _ in $(seq 50); do ip netns exec "$C" ping -c1 -W1 198.19.1.1 >/dev/null 2>&1 && break; sleep 0.2; done
}
wg_down() { kill "$WGC" "$WGS" 2>/dev/null || true; wait "$WGC" "$WGS" 2>/dev/null || true; }

echo "# $(date -u +%F) $(nproc) cores${TASKSET:+, pinned to CPU $TASKSET}, ${DUR}s per run${OMIT:+ after $OMIT s left out}, braid $("$B" --version)"
if [ "${PART:-all}" != 2 ]; then
echo "## 1. one unshaped veth link, one TCP flow"
printf '%-40s %10s %16s\n' setup "Gbit/s" "CPU s per GB"
measure "plain veth" 198.18.1.2 ""; plain=$GBPS
wg_up
measure "wireguard-go" 198.19.1.1 "" "$WGC" "$WGS"; wgg=$GBPS
wg_down
braid_up 1
measure "braid, 1 link" 198.19.0.1 "" "$CP" "$SP"; br=$GBPS
braid_down
python3 -c "print(f'braid / wireguard-go: {$br/max($wgg,1e-9):.2f}x; braid / plain veth: {100*$br/max($plain,1e-9):.1f}%')"
fi

[ "${PART:-all}" = 1 ] && exit 0
echo "## 2. two links shaped to $RATE each, one TCP flow"
for i in 1 2; do
  ip netns exec "$C" tc qdisc replace dev "c$i" root tbf rate "$RATE" burst 1mb latency 20ms
  ip netns exec "$S" tc qdisc replace dev "s$i" root tbf rate "$RATE" burst 1mb latency 20ms
done
printf '%-40s %10s %16s\n' setup "Gbit/s" "CPU s per GB"
for dir in ${DIRS:-up down}; do
  rev=""; [ "$dir" = down ] && rev="-R"
  measure "link 1 alone, $dir" 198.18.1.2 "$rev"; a=$GBPS
  measure "link 2 alone, $dir" 198.18.2.2 "$rev"; b=$GBPS
  for _ in $(seq "${REPEAT:-1}"); do
    braid_up 2
    measure "braid over both, $dir" 198.19.0.1 "$rev" "$CP" "$SP"; br=$GBPS
    braid_down
    python3 -c "print(f'{\"$dir\"}: braid {$br} of {$a}+{$b} = {100*$br/max($a+$b,1e-9):.1f}% of the links alone, summed')"
  done
done
