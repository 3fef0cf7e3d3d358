#!/usr/bin/env python3
"""UDP capture, replay and flood tools for braid's hostile-peer tests (tests/tunnel.rs).

Run inside a network namespace with `ip netns exec NS python3 udp_attack.py MODE ...`.
Files of datagrams are length-prefixed: a 2-byte big-endian length, then the bytes.

  listen ADDR PORT OUT N          bind ADDR:PORT, write the first N datagrams received to OUT
  sniff IFACE PORT OUT SECONDS    capture (AF_PACKET) the UDP payloads sent to PORT on IFACE
  replay IN DST PORT SRC INTERVAL_US SECONDS
                                  send every datagram of IN from SRC to DST:PORT, over and over,
                                  one every INTERVAL_US microseconds
  flood IN DST PORT SRC_PREFIX NSRC PPS SECONDS
                                  from NSRC source addresses SRC_PREFIX.1..NSRC (already on an
                                  interface), at PPS datagrams/s: a rotating mix of random
                                  garbage (random length, and braid-looking headers), truncated
                                  copies of IN's datagrams, exact replays of them, and replays in
                                  a shuffled order. Prints what it sent as one JSON line.
"""
import json
import os
import random
import socket
import struct
import sys
import time


def read_file(path):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i + 2 <= len(data):
        (n,) = struct.unpack(">H", data[i : i + 2])
        out.append(data[i + 2 : i + 2 + n])
        i += 2 + n
    return out


def write_file(path, datagrams):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for d in datagrams:
            f.write(struct.pack(">H", len(d)) + d)
    os.rename(tmp, path)


def listen(addr, port, out, n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, int(port)))
    got = []
    while len(got) < int(n):
        d, _ = s.recvfrom(65535)
        got.append(d)
    write_file(out, got)


def sniff(iface, port, out, seconds):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    s.bind((iface, 0))
    s.settimeout(0.2)
    end = time.monotonic() + float(seconds)
    got = []
    while time.monotonic() < end and len(got) < 20000:
        try:
            frame = s.recv(65535)
        except socket.timeout:
            continue
        if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 17:
            continue
        udp = ip[ihl:]
        (dport,) = struct.unpack(">H", udp[2:4])
        if dport == int(port):
            got.append(bytes(udp[8:]))
    write_file(out, got)


def replay(path, dst, port, src, interval_us, seconds):
    datagrams = read_file(path)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    gap = int(interval_us) / 1e6
    end = time.monotonic() + float(seconds)
    nxt = time.monotonic()
    while time.monotonic() < end:
        for d in datagrams:
            try:
                s.sendto(d, (dst, int(port)))
            except OSError:
                pass
            nxt += gap
            pause = nxt - time.monotonic()
            if pause > 0:
                time.sleep(pause)


def flood(path, dst, port, prefix, nsrc, pps, seconds):
    rng = random.Random(13)
    captured = read_file(path)
    socks = []
    for i in range(1, int(nsrc) + 1):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setblocking(False)
        s.bind(("%s.%d" % (prefix, i), 0))
        socks.append(s)
    target = (dst, int(port))
    # Pre-built datagrams, so that the loop only sends.
    garbage = []
    for _ in range(512):
        n = rng.randrange(0, 1500)
        g = bytearray(rng.getrandbits(8) for _ in range(n))
        if n >= 2 and rng.random() < 0.5:
            g[0] = rng.choice([1, 2, 3])  # a version byte braid knows or knew
            g[1] = rng.randrange(1, 7)  # a known packet type
        garbage.append(bytes(g))
    truncated = [d[: rng.randrange(0, len(d))] for d in captured if d] or [b""]
    shuffled = list(captured) or [b""]
    rng.shuffle(shuffled)
    kinds = {"garbage": garbage, "truncated": truncated, "replayed": captured or [b""], "reordered": shuffled}
    order = ["garbage", "truncated", "replayed", "reordered"]
    sent = {k: 0 for k in order}
    sent_bytes = 0
    errors = 0
    batch = 64
    gap = batch / float(pps)
    start = time.monotonic()
    end = start + float(seconds)
    nxt = start
    i = 0
    while time.monotonic() < end:
        for _ in range(batch):
            kind = order[i % 4]
            pool = kinds[kind]
            d = pool[(i // 4) % len(pool)]
            try:
                socks[i % len(socks)].sendto(d, target)
                sent[kind] += 1
                sent_bytes += len(d) + 28
            except OSError:
                errors += 1
            i += 1
        nxt += gap
        pause = nxt - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    took = time.monotonic() - start
    total = sum(sent.values())
    print(
        json.dumps(
            {
                "sent": sent,
                "errors": errors,
                "seconds": round(took, 2),
                "pps": round(total / took),
                # IP bytes offered per second (UDP payload + 28), in Mbit/s.
                "mbps": round(sent_bytes * 8 / took / 1e6, 1),
                "sources": len(socks),
            }
        )
    )


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    {"listen": listen, "sniff": sniff, "replay": replay, "flood": flood}[mode](*args)


if __name__ == "__main__":
    main()
