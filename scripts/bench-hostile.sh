#!/usr/bin/env bash
# The tunnel under a hostile peer (issue 13): runs the end-to-end test
# `hostile_peer_flood_leaves_memory_bounded_and_throughput_intact` (crates/braid/tests/tunnel.rs)
# and prints its figures: the genuine client's TCP throughput without and with the flood, the
# server's VmRSS/VmHWM before and after, what the attacker sent and what the server dropped.
#
#   scripts/bench-hostile.sh
#
# Needs root (network namespaces), iperf3, tc (tbf) and python3. About 30 s once built.
# Setup: 3 client links shaped to 8 Mbit/s each (tbf, client -> server), so the tunnel is
# link-bound on this 2-core machine; an attacker namespace with its own 20 Mbit/s link to the
# server and 200 source addresses (198.18.100.1-200) offering ~24 Mbit/s (12,000 datagrams/s):
# garbage, truncated, replayed and reordered copies of captured genuine datagrams.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out=$(cargo test --release -p braid --test tunnel \
  hostile_peer_flood_leaves_memory_bounded_and_throughput_intact -- --nocapture 2>&1) || {
  echo "$out" >&2
  exit 1
}
echo "$out" | grep '^hostile:' | sed 's/; /\n  /g'
