#!/usr/bin/env bash
# Benchmark: `braid balance` in proxy mode under a flood (issue 13).
#
#   client ns ── balancer ns ── bridge ── 3 backend ns (asyncio HTTP + UDP echo, Python)
#
# 1. TCP: one host opens IDLE (default 10000) connections and holds them, sending nothing. Then
#    20 new clients make a request each (new connection each): how many are served and how fast,
#    whether any backend went down, the balancer's memory (RSS) and descriptors.
# 2. UDP: one host sweeps SWEEP (default 100000) source ports, one datagram each, while a prober
#    opens a new socket (a new client) every 100 ms and waits for its reply: how many probes are
#    answered, how many sessions the balancer holds, its memory and descriptors.
# The balancer runs with its default limits and the machine's open-files limit (NOFILE to set
# one at most the hard limit, e.g. NOFILE=4096). Needs root and python3. Knobs: IDLE, SWEEP, NOFILE, BRAID (path of the
# braid binary, default target/release/braid).
set -euo pipefail

IDLE=${IDLE:-10000}
SWEEP=${SWEEP:-100000}
NOFILE=${NOFILE:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$ROOT/target/release/braid}
TAG=bpf$$
DIR=$(mktemp -d /tmp/braid-flood-XXXXXX)
PIDS=()

[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
[ -x "$BRAID" ] || (cd "$ROOT" && cargo build --release -p braid >/dev/null)

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for n in c b s1 s2 s3; do ip netns del "$TAG$n" 2>/dev/null || true; done
    rm -rf "$DIR"
}
trap cleanup EXIT

C=${TAG}c; B=${TAG}b
for n in c b s1 s2 s3; do ip netns add "$TAG$n"; ip -n "$TAG$n" link set lo up; done
ip -n "$B" link add vc0 type veth peer name eth0 netns "$C"
ip -n "$C" addr add 198.18.10.1/24 dev eth0; ip -n "$C" addr add 198.18.10.21/24 dev eth0
ip -n "$C" link set eth0 up
ip -n "$B" addr add 198.18.10.2/24 dev vc0; ip -n "$B" link set vc0 up
ip -n "$B" link add br0 type bridge
ip -n "$B" addr add 198.18.20.1/24 dev br0; ip -n "$B" link set br0 up
for ns in "$C" "$B"; do ip netns exec "$ns" sysctl -qw net.ipv4.ip_local_port_range="1024 65000"; done

cat > "$DIR/backend.py" <<'PY'
import asyncio, sys, resource
name, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
async def http(r, w):
    try:
        while True:
            line = await r.readline()
            if not line:
                break
            while (await r.readline()) not in (b"\r\n", b"\n", b""):
                pass
            body = (name + "\n").encode()
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Backend: %s\r\n\r\n%s" % (len(body), name.encode(), body))
            await w.drain()
    except Exception:
        pass
    w.close()
class Echo(asyncio.DatagramProtocol):
    def connection_made(self, t): self.t = t
    def datagram_received(self, d, a): self.t.sendto(name.encode() + b":" + d, a)
async def main():
    srv = await asyncio.start_server(http, host, port, backlog=4096)
    await asyncio.get_running_loop().create_datagram_endpoint(Echo, local_addr=(host, port))
    await srv.serve_forever()
asyncio.run(main())
PY

cat > "$DIR/client.py" <<'PY'
import sys, socket, time, json, resource, threading
h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "hold":
    n = int(sys.argv[4]); socks = []
    for i in range(n):
        s = socket.socket(); s.settimeout(5)
        try:
            s.connect((host, port)); socks.append(s)
        except Exception:
            s.close()
    print("HELD %d" % len(socks), flush=True)
    time.sleep(3600)
elif mode == "new":
    n = int(sys.argv[4]); ok = 0; lat = []
    for i in range(n):
        t = time.time()
        try:
            s = socket.create_connection((host, port), timeout=15)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            d = s.recv(4096)
            if d.startswith(b"HTTP/1.1 200"):
                ok += 1; lat.append(time.time() - t)
            s.close()
        except Exception:
            pass
    lat.sort()
    print(json.dumps({"served": ok, "of": n, "median_ms": round(1000 * lat[len(lat) // 2], 1) if lat else None, "max_ms": round(1000 * lat[-1], 1) if lat else None}))
elif mode == "sweep":
    n, src = int(sys.argv[4]), sys.argv[5]
    done = [False]; probes = [0, 0]
    def probe():
        while not done[0]:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
            probes[0] += 1
            try:
                s.sendto(b"probe", (host, port)); s.recv(100); probes[1] += 1
            except Exception:
                pass
            s.close(); time.sleep(0.1)
    th = threading.Thread(target=probe); th.start()
    t = time.time()
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((src, 0))
        s.sendto(b"sweep", (host, port)); s.close()
    dt = time.time() - t
    time.sleep(1); done[0] = True; th.join()
    print(json.dumps({"sent": n, "seconds": round(dt, 1), "probes": probes[0], "answered": probes[1]}))
PY

for i in 1 2 3; do
    S=$TAG"s$i"
    ip -n "$B" link add "vs$i" type veth peer name eth0 netns "$S"
    ip -n "$B" link set "vs$i" master br0 up
    ip -n "$S" addr add "198.18.20.1$i/24" dev eth0; ip -n "$S" link set eth0 up
    ip netns exec "$S" python3 "$DIR/backend.py" "s$i" "198.18.20.1$i" 8080 &
    PIDS+=($!)
done
sleep 1

start_balancer() { # $1 = protocol
    cat > "$DIR/b.toml" <<TOML
[balance]
name = "flood"
protocol = "$1"
listen = "198.18.10.2:8080"
control = "$DIR/b.sock"
algorithm = "round-robin"
health = { interval_ms = 500, timeout_ms = 1000, fall = 2, rise = 2 }
[[backend]]
address = "198.18.20.11:8080"
[[backend]]
address = "198.18.20.12:8080"
[[backend]]
address = "198.18.20.13:8080"
TOML
    if [ -n "$NOFILE" ]; then
        ip netns exec "$B" prlimit --nofile="$NOFILE:$NOFILE" "$BRAID" balance "$DIR/b.toml" 2>"$DIR/b.log" &
    else
        ip netns exec "$B" "$BRAID" balance "$DIR/b.toml" 2>"$DIR/b.log" &
    fi
    BPID=$!
    sleep 1.5
}
stop_balancer() { kill "$BPID"; wait "$BPID" 2>/dev/null || true; }
status() { "$BRAID" --control "$DIR/b.sock" status --json; }
mem() { # RSS and peak RSS in MiB, open descriptors
    awk '/VmRSS|VmHWM/ {printf "%s %.1f MiB  ", $1, $2/1024}' "/proc/$BPID/status"
    echo "fds $(ls "/proc/$BPID/fd" | wc -l)"
}
summary() {
    status | python3 -c '
import json, sys
s = json.load(sys.stdin); t = s["totals"]; p = s.get("proxy", {})
print("  open %s of max %s (open-files limit %s); backends %s; passive failures %d" % (p.get("open"), p.get("max_connections"), p.get("open_files_limit"), ",".join(b["state"] for b in s["backends"]), sum(b["passive_failures"] for b in s["backends"])))
print("  accepted %d evicted %d idle-closed %d limit waits %d accept errors %d local errors %d rejected %d" % (t["accepted"], t["evicted"], t["idle_closed"], t["limit_waits"], t["accept_errors"], t["local_errors"] + t["health_local_errors"], t["rejected"]))'
}

echo "machine: $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
LIMIT=${NOFILE:-$(ulimit -Hn)}
echo "open-files limit of the balancer: $LIMIT"

echo "== TCP: $IDLE idle connections from one host, then 20 new clients"
start_balancer tcp
echo "  before: $(mem)"
ip netns exec "$C" python3 "$DIR/client.py" hold 198.18.10.2 8080 "$IDLE" > "$DIR/hold.out" &
HOLD=$!; PIDS+=($HOLD)
for _ in $(seq 600); do grep -q HELD "$DIR/hold.out" 2>/dev/null && break; sleep 0.1; done
echo "  flood: $(cat "$DIR/hold.out")"
sleep 12   # longer than evict_idle_after_ms (10 s): the held connections count as idle
echo "  during: $(mem)"
echo "  new clients: $(ip netns exec "$C" python3 "$DIR/client.py" new 198.18.10.2 8080 20)"
summary
kill "$HOLD"; stop_balancer

echo "== UDP: $SWEEP source ports from one host, a new client every 100 ms meanwhile"
start_balancer udp
echo "  before: $(mem)"
echo "  sweep: $(ip netns exec "$C" python3 "$DIR/client.py" sweep 198.18.10.2 8080 "$SWEEP" 198.18.10.21)"
echo "  after: $(mem)"
summary
stop_balancer
