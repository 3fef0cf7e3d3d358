//! Scheduler pick (each scheduler, 3 links) and reorder buffer push+pop, in order and reordered.
//!
//! `cargo bench -p braid-core --bench sched`

use std::hint::black_box;
use std::time::{Duration, Instant};

use braid_core::reorder::{ReorderBuffer, ReorderConfig};
use braid_core::sched::{self, LinkView};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn three_links() -> Vec<LinkView> {
    [
        (1u16, 10_000_000u64, 5u64),
        (2, 20_000_000, 20),
        (3, 50_000_000, 40),
    ]
    .iter()
    .map(|&(id, bw, owd)| LinkView {
        bandwidth_bps: Some(bw),
        delivery_rate_bps: bw as f64,
        srtt: Some(Duration::from_millis(2 * owd)),
        owd: Duration::from_millis(owd),
        qdelay: Duration::from_millis(7),
        priority: if id == 3 { 0 } else { 1 },
        ..LinkView::new(id)
    })
    .collect()
}

fn pick(c: &mut Criterion) {
    let links = three_links();
    let mut g = c.benchmark_group("sched_pick_3_links");
    g.throughput(Throughput::Elements(1));
    for &name in sched::NAMES {
        let mut s = sched::by_name(name).unwrap();
        let t0 = Instant::now();
        let mut k = 0u64;
        let mut out = Vec::with_capacity(4);
        // 1400-byte packets at 80 Mbit/s: one every 140 us of virtual time.
        g.bench_function(name, |b| {
            b.iter(|| {
                k += 1;
                out.clear();
                let now = t0 + Duration::from_micros(140 * k);
                s.pick(
                    now,
                    black_box(1400),
                    k.wrapping_mul(0x9e37_79b9),
                    &links,
                    &mut out,
                );
                black_box(out.len())
            })
        });
    }
    g.finish();
}

fn reorder(c: &mut Criterion) {
    let mut g = c.benchmark_group("reorder_push_pop");
    g.throughput(Throughput::Elements(1));
    let t0 = Instant::now();
    let cfg = ReorderConfig::default();

    // In order: every push is delivered at once.
    {
        let mut r = ReorderBuffer::new(cfg.clone());
        r.set_links(&[1, 2, 3]);
        let mut seq = 0u64;
        let mut spare = vec![0u8; 64];
        g.bench_function("in_order", |b| {
            b.iter(|| {
                let now = t0 + Duration::from_micros(seq);
                r.push(now, seq, (seq % 3) as u16 + 1, std::mem::take(&mut spare));
                seq += 1;
                while let Some(p) = r.pop(now) {
                    spare = p;
                }
            })
        });
    }

    // Reordered: three links whose packets arrive in interleaved bursts of 8 (the pattern of a
    // striping scheduler with a few packets of delay difference), so about two thirds of the
    // packets wait in the buffer for a moment.
    {
        let mut r = ReorderBuffer::new(cfg.clone());
        r.set_links(&[1, 2, 3]);
        // Arrival order within each block of 24: link 3's 8, then link 1's 8, then link 2's 8.
        let order: Vec<u64> = (16..24).chain(0..8).chain(8..16).collect();
        let mut i = 0u64;
        let mut spare = vec![0u8; 64];
        g.bench_function("reordered_bursts_of_8", |b| {
            b.iter(|| {
                let block = i / 24;
                let seq = block * 24 + order[(i % 24) as usize];
                let link = (order[(i % 24) as usize] / 8) as u16 + 1;
                let now = t0 + Duration::from_micros(i);
                r.push(now, seq, link, std::mem::take(&mut spare));
                i += 1;
                while let Some(p) = r.pop(now) {
                    spare = p;
                }
            })
        });
    }

    // With loss: 1 packet in 100 never arrives; its gap is given up once every link has passed it.
    {
        let mut r = ReorderBuffer::new(cfg);
        r.set_links(&[1, 2, 3]);
        let mut seq = 0u64;
        let mut spare = vec![0u8; 64];
        g.bench_function("in_order_1pct_loss", |b| {
            b.iter(|| {
                if seq % 100 == 99 {
                    seq += 1;
                }
                let now = t0 + Duration::from_micros(seq);
                r.push(now, seq, (seq % 3) as u16 + 1, std::mem::take(&mut spare));
                seq += 1;
                while let Some(p) = r.pop(now) {
                    spare = p;
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, pick, reorder);
criterion_main!(benches);
