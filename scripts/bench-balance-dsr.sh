#!/usr/bin/env bash
# DSR vs proxy, side by side in one run: the balancer's link is shaped to RATE (tbf, both
# directions), three backends serve large responses, several clients download in parallel.
# In DSR mode the replies go from the backends straight to the clients, so the clients receive
# far more than the balancer's link carries; in proxy mode every reply byte crosses that link.
#
#   client 198.18.0.1 ─┐
#   balancer 198.18.0.2 ┼─ bridge ── backends 198.18.0.11-13 (VIP 198.18.0.100 on lo)
#        (eth0 shaped to RATE both ways)
#
# Usage (root): scripts/bench-balance-dsr.sh [SECONDS] [PARALLEL] [RATE]
#   defaults: 10 s per mode, 8 parallel downloads, 100mbit
# Needs: ip, tc (tbf), python3, curl; builds target/release/braid if missing.
set -euo pipefail

DUR=${1:-10}
PAR=${2:-8}
RATE=${3:-100mbit}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$ROOT/target/release/braid}
P=bbd$$
VIP=198.18.0.100
WORK=$(mktemp -d)
PIDS=()

[ "$(id -u)" = 0 ] || { echo "run as root (network namespaces)" >&2; exit 1; }
[ -x "$BRAID" ] || (cd "$ROOT" && cargo build --release -p braid >&2)
PY=$(python3 -c 'import sys; print(sys.executable)')

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for ns in cl lb b1 b2 b3 sw; do ip netns del "$P-$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/server.py" <<'EOF'
import sys, socketserver, http.server
name, port = sys.argv[1], int(sys.argv[2])
CHUNK = b"x" * 262144
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        n = int(self.path[5:]) if self.path.startswith("/big/") else 0
        body = (name + "\n").encode() if n == 0 else None
        self.send_response(200)
        self.send_header("Content-Length", str(n if body is None else len(body)))
        self.end_headers()
        if body is not None:
            self.wfile.write(body)
            return
        while n > 0:
            k = min(n, len(CHUNK))
            self.wfile.write(CHUNK[:k] if k < len(CHUNK) else CHUNK)
            n -= k
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
S(("0.0.0.0", port), H).serve_forever()
EOF

ip netns add "$P-sw"
ip -n "$P-sw" link add br0 type bridge
ip -n "$P-sw" link set br0 up
host() { # role addr
    ip netns add "$P-$1"
    ip -n "$P-$1" link set lo up
    ip -n "$P-sw" link add "p-$1" type veth peer name eth0 netns "$P-$1"
    ip -n "$P-sw" link set "p-$1" master br0 up
    ip -n "$P-$1" addr add "$2/24" dev eth0
    ip -n "$P-$1" link set eth0 up
}
host cl 198.18.0.1
host lb 198.18.0.2
for i in 1 2 3; do
    host "b$i" "198.18.0.1$i"
    ip -n "$P-b$i" addr add "$VIP/32" dev lo
    for k in all eth0; do
        ip netns exec "$P-b$i" sysctl -qw "net.ipv4.conf.$k.arp_ignore=1" "net.ipv4.conf.$k.arp_announce=2"
    done
    ip netns exec "$P-b$i" "$PY" "$WORK/server.py" "b$i" 80 >/dev/null 2>&1 &
    PIDS+=($!)
done
# The balancer's link: RATE out of the balancer, and RATE into it (egress of its bridge port).
tc -n "$P-lb" qdisc add dev eth0 root tbf rate "$RATE" burst 64kb latency 50ms
tc -n "$P-sw" qdisc add dev "p-lb" root tbf rate "$RATE" burst 64kb latency 50ms

for i in 1 2 3; do
    for _ in $(seq 100); do
        ip netns exec "$P-lb" curl -s -m 1 -o /dev/null "http://198.18.0.1$i/" && break
        sleep 0.05
    done
done

bytes() { ip netns exec "$P-$1" cat "/sys/class/net/eth0/statistics/$2"; }

# run_mode MODE URL -> prints "client_mbit lb_mbit"
run_mode() {
    local mode=$1 url=$2 cfg="$WORK/$1.toml"
    {
        echo "[balance]"
        echo "name = \"bench-$mode\""
        echo "mode = \"$mode\""
        echo "protocol = \"tcp\""
        if [ "$mode" = dsr ]; then
            echo "vip = \"$VIP:80\""
            echo "interface = \"eth0\""
        else
            echo "listen = \"198.18.0.2:8080\""
        fi
        echo "algorithm = \"maglev\""
        echo "health = { interval_ms = 500, timeout_ms = 300, fall = 2, rise = 2 }"
        echo "control = \"$WORK/$mode.sock\""
        for i in 1 2 3; do printf '\n[[backend]]\naddress = "198.18.0.1%s:80"\n' "$i"; done
    } >"$cfg"
    # (Runs in a subshell: it stops the balancer it starts itself.)
    ip netns exec "$P-lb" "$BRAID" --log-level warn balance "$cfg" 2>"$WORK/$mode.log" >/dev/null &
    local lb=$!
    for _ in $(seq 100); do
        ip netns exec "$P-cl" curl -s -m 1 -o /dev/null "$url/" && break
        sleep 0.1
    done
    local crx0 lrx0 ltx0 crx1 lrx1 ltx1 t0 t1
    crx0=$(bytes cl rx_bytes); lrx0=$(bytes lb rx_bytes); ltx0=$(bytes lb tx_bytes)
    t0=$(date +%s.%N)
    local cl=()
    for k in $(seq "$PAR"); do
        # Back-to-back 64 MiB downloads until the time is up (new connection each: new 5-tuple).
        ip netns exec "$P-cl" bash -c "end=\$((SECONDS+$DUR)); while [ \$SECONDS -lt \$end ]; do curl -s -o /dev/null -m \$((end-SECONDS+1)) '$url/big/67108864' || true; done" &
        cl+=($!)
    done
    for pid in "${cl[@]}"; do wait "$pid" || true; done
    t1=$(date +%s.%N)
    crx1=$(bytes cl rx_bytes); lrx1=$(bytes lb rx_bytes); ltx1=$(bytes lb tx_bytes)
    kill "$lb"; wait "$lb" 2>/dev/null || true
    awk -v c=$((crx1 - crx0)) -v l=$((lrx1 - lrx0 + ltx1 - ltx0)) -v lr=$((lrx1 - lrx0)) -v lt=$((ltx1 - ltx0)) -v t0="$t0" -v t1="$t1" \
        'BEGIN { d = t1 - t0; printf "%.1f %.1f %.1f %.1f %.2f\n", c*8/d/1e6, l*8/d/1e6, lr*8/d/1e6, lt*8/d/1e6, d }'
}

# Forwarding rate of the DSR data path: one client floods 60-byte UDP frames at the VIP from 64
# source ports for DUR seconds (no shaping); prints "sent_pps forwarded_pps socket_drops".
run_pps() {
    tc -n "$P-lb" qdisc del dev eth0 root
    tc -n "$P-sw" qdisc del dev "p-lb" root
    cat >"$WORK/sink.py" <<'EOT'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 9))
while True:
    s.recvfrom(2048)  # health probes only: the flood goes to the VIP, where nothing listens
EOT
    cat >"$WORK/flood.py" <<'EOT'
import socket, sys, time
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(64)]
for s in socks:
    s.connect((sys.argv[1], 9))
n, t0, payload = 0, time.time(), b"x" * 18
while time.time() - t0 < float(sys.argv[2]):
    for s in socks:
        try:
            s.send(payload)
        except OSError:
            pass
    n += 64
print(n / (time.time() - t0))
EOT
    # (This function runs in a subshell: it must stop what it starts itself.)
    local sinks=()
    for i in 1 2 3; do
        ip netns exec "$P-b$i" "$PY" "$WORK/sink.py" "198.18.0.1$i" >/dev/null 2>&1 &
        sinks+=($!)
    done
    {
        echo "[balance]"
        echo "name = \"bench-pps\""
        echo "mode = \"dsr\""
        echo "protocol = \"udp\""
        echo "vip = \"$VIP:9\""
        echo "interface = \"eth0\""
        echo "health = { interval_ms = 500, timeout_ms = 300, fall = 2, rise = 2 }"
        echo "control = \"$WORK/pps.sock\""
        for i in 1 2 3; do printf '\n[[backend]]\naddress = "198.18.0.1%s:9"\n' "$i"; done
    } >"$WORK/pps.toml"
    ip netns exec "$P-lb" "$BRAID" --log-level warn balance "$WORK/pps.toml" 2>"$WORK/pps.log" >/dev/null &
    local lb=$!
    sleep 1
    local st='import json,sys; d=json.load(sys.stdin)["dsr"]; print(d["forwarded_packets"], d["socket_drops"])'
    local f0 d0 f1 d1 sent
    read -r f0 d0 < <("$BRAID" --control "$WORK/pps.sock" status --json | python3 -c "$st")
    sent=$(ip netns exec "$P-cl" "$PY" "$WORK/flood.py" "$VIP" "$DUR")
    sleep 0.5
    read -r f1 d1 < <("$BRAID" --control "$WORK/pps.sock" status --json | python3 -c "$st")
    kill "$lb" "${sinks[@]}"; wait "$lb" "${sinks[@]}" 2>/dev/null || true
    awk -v s="$sent" -v f=$((f1 - f0)) -v d=$((d1 - d0)) -v t="$DUR" 'BEGIN { printf "%.0f %.0f %d\n", s, f/t, d }'
}

echo "machine: $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "balancer link shaped to $RATE each way (tbf); $PAR parallel downloads of 64 MiB objects, ${DUR}s per mode"
read -r d_cl d_lb d_lr d_lt d_t < <(run_mode dsr "http://$VIP")
read -r p_cl p_lb p_lr p_lt p_t < <(run_mode proxy "http://198.18.0.2:8080")
printf '%-6s %22s %28s\n' mode "clients receive Mbit/s" "balancer link rx/tx Mbit/s"
printf '%-6s %22s %28s\n' dsr "$d_cl" "$d_lr / $d_lt"
printf '%-6s %22s %28s\n' proxy "$p_cl" "$p_lr / $p_lt"
awk -v d="$d_cl" -v p="$p_cl" -v r="$RATE" 'BEGIN { printf "dsr / proxy = %.2fx; dsr clients get %.2fx the balancer link rate (%s)\n", d/p, d/(r+0), r }'
read -r s_pps f_pps drops < <(run_pps)
echo "dsr forwarding, 60-byte UDP frames, unshaped: client sent $s_pps pps, balancer forwarded $f_pps pps ($drops dropped in its socket queue)"
