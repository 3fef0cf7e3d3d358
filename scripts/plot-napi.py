#!/usr/bin/env python3
"""Draws scripts/bench-napi.sh's CSV: CPU% of both braid endpoints, the mean ping RTT through the
tunnel and the share of the 60-byte packets lost, against the offered packet rate, one line per
`batch_wait_us`.

    python3 scripts/plot-napi.py docs/napi-tradeoff.csv docs/napi-tradeoff.png
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    series = defaultdict(list)
    with open(src) as f:
        for row in csv.DictReader(f):
            series[int(row["wait_us"])].append(
                (
                    int(row["rate_pps"]),
                    float(row["cpu_pct"]),
                    float(row["ping_avg_ms"]),
                    float(row["loss_pct"]),
                )
            )
    fig, (ax_cpu, ax_rtt, ax_loss) = plt.subplots(1, 3, figsize=(15, 4.4))
    for wait in sorted(series):
        pts = sorted(series[wait])
        rates = [p[0] / 1000 for p in pts]
        label = f"batch_wait_us = {wait}"
        ax_cpu.plot(rates, [p[1] for p in pts], marker="o", label=label)
        ax_rtt.plot(rates, [p[2] for p in pts], marker="o", label=label)
        ax_loss.plot(rates, [p[3] for p in pts], marker="o", label=label)
    ax_cpu.set_xlabel("offered rate, thousand 60-byte packets/s")
    ax_cpu.set_ylabel("CPU of both endpoints, % of one core")
    ax_cpu.set_title("CPU against packet rate")
    ax_rtt.set_xlabel("offered rate, thousand 60-byte packets/s")
    ax_rtt.set_ylabel("ping RTT through the tunnel, ms (mean)")
    ax_rtt.set_title("Latency against packet rate")
    ax_loss.set_xlabel("offered rate, thousand 60-byte packets/s")
    ax_loss.set_ylabel("60-byte packets lost, %")
    ax_loss.set_title("Loss against packet rate")
    for ax in (ax_cpu, ax_rtt, ax_loss):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_cpu.legend(fontsize=8)
    fig.suptitle("braid over one veth link: the batch_wait_us trade-off (scripts/bench-napi.sh)")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot-napi.py CSV PNG")
    main(sys.argv[1], sys.argv[2])
