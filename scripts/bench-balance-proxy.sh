#!/usr/bin/env bash
# Benchmark: `braid balance` (proxy mode) against Pen, side by side in one run, same backends,
# same load generator.
#
#   client ns ── balancer ns (braid on :8080, then pen on :8081) ── bridge ── 3 backend ns (nginx)
#
# 1. connections per second: short requests, a new connection each (wrk, "Connection: close");
# 2. throughput: 1 MiB responses over keep-alive connections (wrk), in Gbit/s.
# Both balancers use plain round robin (pen -r). Needs root. Installs wrk and nginx-light with
# apt-get if they are missing. Knobs: DUR (s per run, default 8), ROUNDS (default 3), CONNS (default 64),
# BIG_CONNS (default 16), BRAID (path of the braid binary, default target/release/braid).
set -euo pipefail

DUR=${DUR:-8}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
BIG_CONNS=${BIG_CONNS:-16}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$ROOT/target/release/braid}
TAG=bbp$$
DIR=$(mktemp -d /tmp/braid-bench-XXXXXX)
PIDS=()

[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y wrk nginx-light >/dev/null
fi
command -v pen >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y pen >/dev/null
[ -x "$BRAID" ] || (cd "$ROOT" && cargo build --release -p braid >/dev/null)

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.2
    for n in c b s1 s2 s3; do ip netns del "$TAG$n" 2>/dev/null || true; done
    rm -rf "$DIR"
}
trap cleanup EXIT

C=${TAG}c; B=${TAG}b
for n in c b s1 s2 s3; do ip netns add "$TAG$n"; ip -n "$TAG$n" link set lo up; done
ip -n "$B" link add vc0 type veth peer name eth0 netns "$C"
ip -n "$C" addr add 198.18.10.1/24 dev eth0; ip -n "$C" link set eth0 up
ip -n "$B" addr add 198.18.10.2/24 dev vc0; ip -n "$B" link set vc0 up
ip -n "$B" link add br0 type bridge
ip -n "$B" addr add 198.18.20.1/24 dev br0; ip -n "$B" link set br0 up
head -c 1048576 /dev/zero | tr '\0' 'x' > "$DIR/big"
for i in 1 2 3; do
    S=$TAG"s$i"
    ip -n "$B" link add "vs$i" type veth peer name eth0 netns "$S"
    ip -n "$B" link set "vs$i" master br0 up
    ip -n "$S" addr add "198.18.20.1$i/24" dev eth0; ip -n "$S" link set eth0 up
    mkdir -p "$DIR/s$i"
    cat > "$DIR/s$i/nginx.conf" <<NGX
user root;
worker_processes 1;
daemon off;
pid $DIR/s$i/nginx.pid;
error_log $DIR/s$i/error.log;
events { worker_connections 16384; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $DIR/s$i;
    proxy_temp_path $DIR/s$i;
    fastcgi_temp_path $DIR/s$i;
    uwsgi_temp_path $DIR/s$i;
    scgi_temp_path $DIR/s$i;
    server {
        listen 198.18.20.1$i:8080 backlog=4096 reuseport;
        location = / { default_type text/plain; return 200 "s$i\n"; }
        location = /big { default_type application/octet-stream; alias $DIR/big; }
    }
}
NGX
    ip netns exec "$S" nginx -c "$DIR/s$i/nginx.conf" &
    PIDS+=($!)
done
sleep 0.5
for ns in "$C" "$B"; do
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_local_port_range="1024 65000" net.ipv4.tcp_tw_reuse=1 || true
done

cat > "$DIR/braid.toml" <<TOML
[balance]
name = "bench$$"
listen = "198.18.10.2:8080"
control = "$DIR/braid.sock"
algorithm = "round-robin"
${BRAID_WORKERS:+workers = $BRAID_WORKERS}
health = { interval_ms = 1000, timeout_ms = 500, fall = 2, rise = 2 }
[[backend]]
address = "198.18.20.11:8080"
[[backend]]
address = "198.18.20.12:8080"
[[backend]]
address = "198.18.20.13:8080"
TOML

wrk_run() { # port path conns extra-args...
    local port=$1 path=$2 conns=$3; shift 3
    ip netns exec "$C" wrk -t2 -c"$conns" -d"${DUR}s" "$@" "http://198.18.10.2:$port$path" 2>&1
}
rps() { awk '/Requests\/sec/ {print $2}'; }
gbps() { # wrk's "Transfer/sec: X.XXMB|GB" -> Gbit/s
    awk '/Transfer\/sec/ { v=$2; u=v; gsub(/[0-9.]/,"",u); gsub(/[A-Za-z]/,"",v);
         m=(u=="GB")?8:(u=="MB")?8/1024:(u=="KB")?8/1048576:8/1073741824; printf "%.2f\n", v*m }'
}
errors() { awk '/Socket errors|Non-2xx/ {print}' | tr '\n' ' '; }

results=()
cpu_ticks() { # utime + stime of a process and its threads, in clock ticks
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}
run_balancer() { # name port command...
    local name=$1 port=$2; shift 2
    ip netns exec "$B" "$@" > "$DIR/$name.log" 2>&1 &
    local pid=$!
    PIDS+=($pid)
    for _ in $(seq 50); do
        ip netns exec "$C" curl -s -o /dev/null "http://198.18.10.2:$port/" && break
        sleep 0.1
    done
    if [ -n "${STRACE:-}" ]; then
        timeout 4 strace -c -f -p "$pid" -o "/tmp/strace-$name.txt" >/dev/null 2>&1 &
    fi
    if [ -n "${PERF:-}" ]; then
        perf record -F 999 -g -o "/tmp/perf-$name.data" -p "$pid" -- sleep "$DUR" >/dev/null 2>&1 &
    fi
    local t0 t1 t2
    t0=$(cpu_ticks "$pid")
    wrk_run "$port" / "$CONNS" -H "Connection: close" > "$DIR/$name.cps" || true
    t1=$(cpu_ticks "$pid")
    wrk_run "$port" /big "$BIG_CONNS" > "$DIR/$name.big" || true
    t2=$(cpu_ticks "$pid")
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    local cps tput
    cps=$(rps < "$DIR/$name.cps"); tput=$(gbps < "$DIR/$name.big")
    local hz cpu1 cpu2
    hz=$(getconf CLK_TCK)
    cpu1=$(awk -v t="$((t1 - t0))" -v hz="$hz" -v d="$DUR" 'BEGIN { printf "%.0f", 100 * t / hz / d }')
    cpu2=$(awk -v t="$((t2 - t1))" -v hz="$hz" -v d="$DUR" 'BEGIN { printf "%.0f", 100 * t / hz / d }')
    local us
    us=$(awk -v t="$((t1 - t0))" -v hz="$hz" -v c="$cps" -v d="$DUR" 'BEGIN { if (c > 0) printf "%.1f", 1e6 * t / hz / (c * d); else print "-" }')
    echo "  $name: $cps conn/s (balancer CPU ${cpu1}%, ${us} us/conn; $(errors < "$DIR/$name.cps")), $tput Gbit/s (balancer CPU ${cpu2}%; $(errors < "$DIR/$name.big"))"
    results+=("$name $cps $tput")
}

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), kernel $(uname -r)"
echo "load: wrk -t2 -c$CONNS -d${DUR}s -H 'Connection: close' / ; wrk -t2 -c$BIG_CONNS -d${DUR}s /big (1 MiB); backends: 3 x nginx (1 worker)"
run_braid() { run_balancer braid 8080 "$BRAID" --log-level warn balance "$DIR/braid.toml"; }
run_pen() { run_balancer pen 8081 pen -f -r -x 20000 -c 20000 198.18.10.2:8081 198.18.20.11:8080 198.18.20.12:8080 198.18.20.13:8080; }
# Rounds alternate which balancer goes first, so that load from elsewhere on the machine and
# TIME_WAIT left by the previous run hit both alike; the medians are compared.
for r in $(seq "$ROUNDS"); do
    echo "round $r:"
    if [ $((r % 2)) = 0 ]; then run_pen; sleep 2; run_braid; else run_braid; sleep 2; run_pen; fi
    sleep 2
done

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
pick() { printf '%s\n' "${results[@]}" | awk -v n="$1" -v f="$2" '$1 == n { print $f }' | median; }
bc=$(pick braid 2); bt=$(pick braid 3); pc=$(pick pen 2); pt=$(pick pen 3)
echo
echo "medians of $ROUNDS rounds:"
awk -v bc="$bc" -v pc="$pc" -v bt="$bt" -v pt="$pt" 'BEGIN {
    printf "%-28s %12s %12s %8s\n", "", "braid", "pen", "ratio";
    printf "%-28s %12.0f %12.0f %7.2fx\n", "connections/s (new each)", bc, pc, (pc>0)?bc/pc:0;
    printf "%-28s %12.2f %12.2f %7.2fx\n", "throughput Gbit/s (1 MiB)", bt, pt, (pt>0)?bt/pt:0;
}'
