#!/usr/bin/env python3
"""Sums up scripts/inner-arrivals.bt's output: the inner flow's data arrivals at the receiving host
grouped into bursts (gaps over GAP_MS, default 5), each with its length in time, bytes, segments
and the rate within it, and the receive-buffer measurements that fell in the first SECONDS.

    scripts/inner-bursts.py /tmp/arr.txt [SECONDS]
"""
import sys

GAP_US = 5000


def main():
    path = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    segs, drs = [], []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "seg":
                segs.append((int(parts[1]), int(parts[2])))
            elif parts and parts[0] == "drs":
                drs.append((int(parts[1]), " ".join(parts[2:])))
    if not segs:
        sys.exit("no data segments in " + path)
    t0 = segs[0][0]
    bursts = []
    start, last, size, count = segs[0][0], segs[0][0], segs[0][1], 1
    for t, n in segs[1:]:
        if t - last > GAP_US:
            bursts.append((start, last, size, count))
            start, size, count = t, 0, 0
        last, size, count = t, size + n, count + 1
    bursts.append((start, last, size, count))
    for b_start, b_end, size, count in bursts:
        if (b_start - t0) / 1e6 > seconds:
            break
        span = (b_end - b_start) / 1e3
        rate = size * 8 / (span * 1e3) if span > 0 else float("inf")
        print(f"burst at {(b_start - t0) / 1e3:9.1f} ms: {span:7.1f} ms, {size} bytes, "
              f"{count} segments, {rate:8.1f} Mbit/s")
    for t, text in drs:
        if (t - t0) / 1e6 > seconds:
            break
        print(f"receive buffer at {(t - t0) / 1e3:9.1f} ms: {text}")


if __name__ == "__main__":
    main()
