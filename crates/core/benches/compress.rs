//! CPU cost per packet of inner header compression: compress and decompress one TCP segment of a
//! flow whose context and reference are established (the steady state: a delta packet, the TCP
//! checksum verified by the compressor and computed by the decompressor), IPv4 and IPv6, small
//! and full-size.
//! And of fragmentation (group `frag`): a 1500-byte TCP/IPv4 segment compressed to 1474 bytes
//! does not fit a 1500-byte path's 1440 bytes of room, so it is cut in two pieces (`split`: the
//! cut and a copy of each piece, as sealing makes) and put back together (`reassemble`: both
//! pieces through `frag::Reassembler`, the whole packet out).
//!
//!   cargo bench -p braid-core --bench compress
//!   cargo bench -p braid-core --bench compress -- --quick      (a short run)
//!
//! Compare with `--bench wire` (seal and open of the same sizes): compression should cost a small
//! fraction of sealing.

use std::hint::black_box;
use std::time::Instant;

use braid_core::compress::{Compressor, Decompressor, Encoding, Limits};
use braid_core::frag::{self, Piece, Reassembler};
use braid_core::inner::{fold16, sum16};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// A TCP segment with timestamps: 52 bytes of headers over IPv4, 72 over IPv6.
fn segment(v6: bool, seq: u32, payload: usize) -> Vec<u8> {
    let tcp_len = 32 + payload;
    let mut p = Vec::new();
    if v6 {
        p.extend_from_slice(&[0x60, 0, 0, 0]);
        p.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        p.extend_from_slice(&[6, 64]);
        p.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        p.extend_from_slice(&[0x45, 0]);
        p.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        p.extend_from_slice(&[
            0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2,
        ]);
        let mut sum: u32 = p
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    }
    p.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 1, 0x80, 0x10, 0xfa, 0xf0, 0x12, 0x34, 0, 0]);
    p.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    p.resize(p.len() + payload, 0xab);
    // A right TCP checksum, as a host sends: the compressor then leaves it out and the
    // decompressor computes it, the costs measured here.
    let ip_len = if v6 { 40 } else { 20 };
    let addrs = if v6 { &p[8..40] } else { &p[12..20] };
    let pseudo = sum16(addrs, 6 + tcp_len as u64);
    p[ip_len + 16..ip_len + 18].fill(0);
    let csum = !fold16(sum16(&p[ip_len..], pseudo));
    p[ip_len + 16..ip_len + 18].copy_from_slice(&csum.to_be_bytes());
    p
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("compress");
    let now = Instant::now();
    for v6 in [false, true] {
        for payload in [0usize, 1400] {
            let name = format!("{}-{}", if v6 { "ipv6" } else { "ipv4" }, payload);
            let packet = segment(v6, 1, payload);
            let (mut comp, mut decomp) = (
                Compressor::new(Limits::default()),
                Decompressor::new(Limits::default()),
            );
            // Establish the context, then the reference: what follows are delta packets.
            let mut wire = Vec::with_capacity(2048);
            let mut out = Vec::with_capacity(2048);
            for _ in 0..2 {
                wire.clear();
                comp.compress(now, &packet, &mut wire);
                decomp.decompress(&wire, &mut out).unwrap();
                decomp
                    .take_feedback()
                    .into_iter()
                    .for_each(|f| comp.on_feedback(f));
            }
            wire.clear();
            assert_eq!(comp.compress(now, &packet, &mut wire), Encoding::Compressed);
            assert_eq!(wire[0] >> 6, 0b00, "a delta packet");

            g.throughput(Throughput::Elements(1));
            g.bench_with_input(BenchmarkId::new("compress", &name), &packet, |b, p| {
                b.iter(|| {
                    let mut w = std::mem::take(&mut wire);
                    w.clear();
                    black_box(comp.compress(now, black_box(p), &mut w));
                    wire = w;
                })
            });
            let compressed = wire.clone();
            g.bench_with_input(
                BenchmarkId::new("decompress", &name),
                &compressed,
                |b, w| {
                    b.iter(|| {
                        out.clear();
                        black_box(decomp.decompress(black_box(w), &mut out).unwrap());
                    })
                },
            );
        }
    }
    g.finish();
}

fn bench_frag(c: &mut Criterion) {
    let mut g = c.benchmark_group("frag");
    let now = Instant::now();
    // A full 1500-byte TCP/IPv4 segment, compressed (26 bytes fewer), on a 1500-byte path.
    let payload: Vec<u8> = (0..1474u32).map(|i| i as u8).collect();
    let room = 1500 - 28 - braid_core::wire::DATA_OVERHEAD;
    let pieces: Vec<(u64, Piece, Vec<u8>)> = frag::split(payload.len(), room)
        .enumerate()
        .map(|(i, (r, p))| (i as u64, p, payload[r].to_vec()))
        .collect();
    assert_eq!(pieces.len(), 2);
    g.throughput(Throughput::Elements(1));
    let mut bufs: Vec<Vec<u8>> = (0..2).map(|_| Vec::with_capacity(2048)).collect();
    g.bench_function("split-1474", |b| {
        b.iter(|| {
            for ((r, p), buf) in frag::split(black_box(payload.len()), room).zip(bufs.iter_mut()) {
                buf.clear();
                buf.extend_from_slice(&payload[r]);
                black_box((p, &buf));
            }
        })
    });
    let mut r = Reassembler::new(1502);
    let mut seq = 0u64;
    g.bench_function("reassemble-1474", |b| {
        b.iter(|| {
            let mut out = None;
            for (i, p, bytes) in &pieces {
                out = r.push(now, seq + i, *p, black_box(bytes));
            }
            seq += 2;
            assert_eq!(out.map(|o| o.len()), Some(1474));
        })
    });
    g.finish();
}

criterion_group!(benches, bench, bench_frag);
criterion_main!(benches);
