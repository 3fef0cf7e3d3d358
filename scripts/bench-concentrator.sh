#!/usr/bin/env bash
# One concentrator, many client bundles (issue 14 item 5): runs the end-to-end test
# `concentrator_serves_many_bundles_at_once_with_memory_and_cpu_per_client_measured`
# (crates/braid/tests/concentrator_scale.rs) at the benchmark's size and prints its figures:
# the server's RSS with no client, one, all idle and all active (KiB per idle and per active
# client), its CPU time per TUN packet with one client carrying the whole rate and with all
# clients sharing it, every client's echoes, and its open files.
#
#   scripts/bench-concentrator.sh [CLIENTS [PPS [SECS]]]     # default 100 clients, 10000/s, 8 s
#
# Needs root (network namespaces, bridges, veths) and a release build. Each client is a
# namespace with 2 or 3 veth links and its own `braid up`; about 1-2 minutes for 100 clients.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export BRAID_SCALE_CLIENTS="${1:-100}" BRAID_SCALE_PPS="${2:-10000}" BRAID_SCALE_SECS="${3:-8}"
out=$(cargo test --release -p braid --test concentrator_scale -- --nocapture 2>&1) || {
  echo "$out" >&2
  exit 1
}
echo "$out" | grep '^scale:' | sed 's/ | /\n  /g'
