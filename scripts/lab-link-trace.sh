#!/usr/bin/env bash
# One bundle run of `braid lab` with one endpoint's view of its links sampled every 0.5 s
# (EVERY below; the `status` request on the lab's control socket, what `braid status --json`
# shows): per link the scheduler's rate, the queueing delay the peer reports, the delivery rate
# and our send rate. What the run's JSON
# leaves out: how the scheduler's picture of the links moves during the run.
#
#   scripts/lab-link-trace.sh OUT client|server [braid lab arguments...]     (as root)
#   e.g. scripts/lab-link-trace.sh /tmp/r7 server --cc bbr --reverse --duration 30 \
#          --link 50mbit/10ms --link 20mbit/60ms --link 7mbit/150ms
#
# Writes OUT.json (the lab's report), OUT.err and OUT.trace: one line per sample,
#   t=<s since the run began> hold=<ms in force>/<ms wanted>,queued=..,qdrops=..,marked=..,
#     skipped=..,late=..,timeouts=..,reinjected=.. (the bundle queue's, reorder buffer's and
#     repair's counters so far)
#     <link>:rate=<Mbit/s>,qdelay=<ms>,believed=<ms>,delivered=<Mbit/s>,sent=<Mbit/s>,loss=<%>[,pulled-back] ...
# and prints a summary of the queueing delay reported per link (median, 90th percentile).
# The trace's first line gives its t=0 on CLOCK_MONOTONIC.
# BRAID=path runs that binary (default: a release build of this tree). EVERY=seconds samples that
# often (default 0.5; 0.05 shows a probe's rise and fall, at some CPU cost to the run).
# EMU_TRACE=1 also has the lab's emulator write every frame it takes to OUT.emu.link<i>.<ab|ba>
# (what the link's queue held when it came; crates/lab/src/emulator.rs, `FrameTrace`) and
# prints the true queues' spread beside the reported one: a queue the endpoints misread, or one
# that swings, shows there.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT prefix}
SIDE=${2:?client or server}
shift 2
case $SIDE in client | server) ;; *) echo "side must be client or server" >&2; exit 2 ;; esac
if [ -z "${BRAID:-}" ]; then
  cargo build --release -q
  BRAID=target/release/braid
fi
if [ "${EMU_TRACE:-0}" = 1 ]; then
  rm -f "$OUT".emu.link*
  export BRAID_LAB_EMU_TRACE=$OUT.emu
fi
"$BRAID" lab --quiet --json --skip-single "$@" >"$OUT.json" 2>"$OUT.err" &
LAB=$!
python3 - "$BRAID" "$SIDE" "$LAB" "$OUT.trace" "${EVERY:-0.5}" <<'PY'
import glob, json, os, socket, sys, time
braid, side, lab, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
every = float(sys.argv[5])
def alive():
    try:
        os.kill(lab, 0)
        return True
    except OSError:
        return False
# The lab's run directory appears once its endpoints start (after the link setup): the newest
# socket made since this run began (a directory left by another run is older).
started = time.time()
sock = None
while alive() and sock is None:
    found = [p for p in glob.glob(f"/tmp/braid-lab-*/{side}.sock")
             if os.stat(p).st_mtime >= started - 1]
    sock = max(found, key=lambda p: os.stat(p).st_mtime) if found else None
    time.sleep(0.05)
if sock is None:
    sys.exit("the lab ended before its endpoints started (see the .err file)")
t0 = time.monotonic()
qd = {}
with open(out, "w") as f:
    f.write("# t=0 at CLOCK_MONOTONIC %.6f s\n" % t0)
    while alive():
        try:
            # The control socket's protocol (crates/linux/src/control.rs): a JSON line each way.
            with socket.socket(socket.AF_UNIX) as c:
                c.settimeout(5)
                c.connect(sock)
                c.sendall(b'{"cmd":"status"}\n')
                reply = c.makefile("rb").readline()
            st = json.loads(reply)
            links = st["links"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.5)
            continue
        cols = []
        for l in links:
            q = (l.get("qdelay_us") or 0) / 1e3
            qd.setdefault(l["name"], []).append(q)
            cols.append("%s:rate=%.1f,qdelay=%.1f,believed=%.1f,delivered=%.1f,sent=%.1f,loss=%.1f%s" % (
                l["name"], (l.get("sched_rate_bps") or 0) / 1e6, q,
                (l.get("sched_queue_us") or 0) / 1e3,
                (l.get("delivery_rate_bps") or 0) / 1e6, (l.get("tx_rate_bps") or 0) / 1e6,
                100 * (l.get("loss") or 0), ",pulled-back" if l.get("pulled_back") else ""))
        ro, rp = st.get("reorder") or {}, st.get("repair") or {}
        dr = st.get("drops") or {}
        hold = ("hold=%.1f/%.1f,queued=%s,qdrops=%s,marked=%s,skipped=%s,late=%s,timeouts=%s,"
                "reinjected=%s") % (
            (st.get("equalize_us") or 0) / 1e3, (st.get("equalize_wanted_us") or 0) / 1e3,
            st.get("queued"), dr.get("queue_delay"), st.get("queue_marked"), ro.get("skipped"),
            ro.get("late"), ro.get("timeouts"), rp.get("reinjected"))
        f.write("t=%.2f %s %s\n" % (time.monotonic() - t0, hold, " ".join(cols)))
        f.flush()
        time.sleep(every)
for name, qs in sorted(qd.items()):
    qs.sort()
    print(f"{side} {name}: queueing delay reported, median {qs[len(qs) // 2]:.1f} ms, "
          f"90th percentile {qs[int(len(qs) * 0.9)]:.1f} ms ({len(qs)} samples)")
PY
wait "$LAB"
if [ "${EMU_TRACE:-0}" = 1 ]; then
  python3 - "$OUT".emu.link* <<'PY'
import sys
for path in sys.argv[1:]:
    waits, dropped, size = [], 0, 0
    try:
        f = open(path)
    except OSError as e:
        sys.exit(f"no emulator trace: {e}")
    with f:
        for line in f:
            fields = line.split()
            if line.startswith("#") or len(fields) != 4:  # the last line may be cut short
                continue
            _, waited, length, due = fields
            size += int(length)
            if due == "-1":
                dropped += 1
            else:
                waits.append(int(waited) / 1e3)
    if not waits or size / (len(waits) + dropped) < 300:
        continue  # the way back: acknowledgements and probes
    waits.sort()
    p = lambda q: waits[min(len(waits) - 1, int(len(waits) * q))]
    print(f"emulator {path.rsplit('.emu.', 1)[1]}: queue a frame found, 10th/50th/90th "
          f"percentile {p(0.1):.1f}/{p(0.5):.1f}/{p(0.9):.1f} ms, {dropped} dropped "
          f"({len(waits)} frames)")
PY
fi
