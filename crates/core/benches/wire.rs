//! Wire and crypto micro-benchmarks: seal and open of one DATA datagram per payload size and
//! cipher, and parse / emit of header + DATA body.
//!
//!   cargo bench -p braid-core --bench wire
//!   cargo bench -p braid-core --bench wire -- --quick          (a short run)
//!
//! Throughput is reported in payload bytes (the tunnelled IP packet), so Gbit/s reads as the
//! goodput one core could seal or open.

use std::hint::black_box;

use braid_core::crypto::{self, Aead};
use braid_core::wire::{
    Body, CipherId, Common, DataRepr, Header, PacketType, DATA_HEADER_LEN, TAG_LEN,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const SIZES: [usize; 4] = [64, 512, 1400, 8192];
const CIPHERS: [(CipherId, &str); 2] = [
    (CipherId::ChaCha20Poly1305, "chacha20-poly1305"),
    (CipherId::Aes256Gcm, "aes-256-gcm"),
];

fn header(counter: u64) -> Header {
    Header {
        ptype: PacketType::Data,
        link: 1,
        session: 0x1234_5678,
        counter,
    }
}

fn data(payload: &[u8]) -> Body<'_> {
    Body::Data(DataRepr {
        common: Common {
            link_seq: 17,
            ts: 123_456,
        },
        seq: 1 << 33,
        flags: 0,
        payload,
    })
}

fn seal_open(c: &mut Criterion) {
    for (cipher, cname) in CIPHERS {
        let key = Aead::new(cipher, &[7; 32]);
        let mut g = c.benchmark_group(format!("seal/{cname}"));
        for size in SIZES {
            let payload = vec![0x45u8; size];
            g.throughput(Throughput::Bytes(size as u64));
            g.bench_with_input(BenchmarkId::from_parameter(size), &payload, |b, p| {
                let mut out = Vec::with_capacity(size + 128);
                let mut counter = 0u64;
                b.iter(|| {
                    counter += 1;
                    crypto::seal(&key, &header(counter), &data(black_box(p)), &mut out);
                    black_box(out.len())
                })
            });
        }
        g.finish();

        let mut g = c.benchmark_group(format!("open/{cname}"));
        for size in SIZES {
            let payload = vec![0x45u8; size];
            let mut sealed = Vec::new();
            crypto::seal(&key, &header(9), &data(&payload), &mut sealed);
            let h = Header::parse(&sealed).unwrap();
            g.throughput(Throughput::Bytes(size as u64));
            // Open decrypts in place, so each iteration restores the sealed bytes first (a
            // memcpy of the datagram, small next to the AEAD; counted in the figure).
            let mut buf = sealed.clone();
            g.bench_function(BenchmarkId::from_parameter(size), |b| {
                b.iter(|| {
                    buf.copy_from_slice(&sealed);
                    let plain = crypto::open(&key, &h, black_box(&mut buf)).unwrap();
                    black_box(plain.len())
                })
            });
        }
        g.finish();
    }
}

fn parse_emit(c: &mut Criterion) {
    let payload = vec![0x45u8; 1400];
    let body = data(&payload);
    let h = header(42);
    let mut dgram = vec![0u8; DATA_HEADER_LEN + body.buffer_len() + TAG_LEN];
    if let Body::Data(d) = &body {
        d.emit_header(&h, &mut dgram);
    }
    body.emit(&mut dgram[DATA_HEADER_LEN..]);
    let plain_end = DATA_HEADER_LEN + body.buffer_len();

    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse header+data", |b| {
        b.iter(|| {
            let d = black_box(&dgram[..]);
            let h = Header::parse(d).unwrap();
            let data = DataRepr::parse_sent(d, &d[DATA_HEADER_LEN..plain_end]).unwrap();
            black_box((h.counter, data.seq, data.payload.len()))
        })
    });
    // Emit of the 14 header bytes only (DATA has no body header): the payload copy is
    // measured by seal.
    let mut out = [0u8; DATA_HEADER_LEN];
    let empty = DataRepr {
        common: Common::default(),
        seq: 42,
        flags: 0,
        payload: &[],
    };
    g.bench_function("emit header+data", |b| {
        b.iter(|| {
            black_box(&empty).emit_header(black_box(&h), &mut out);
            black_box(out[12])
        })
    });
    g.finish();
}

criterion_group!(benches, seal_open, parse_emit);
criterion_main!(benches);
