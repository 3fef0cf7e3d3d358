//! The data plane's helper threads (issue 12 item 4): sealing, per-link sending and opening on
//! more than one core.
//!
//! The pipeline is wireguard-go's, in fork-join form: the sans-I/O core assigns every datagram
//! its link, key and counter in order and hands it out laid out but unsealed
//! ([`braid_core::Endpoint::set_deferred_sealing`]); at each flush the runner seals the batch in
//! parallel chunks and sends each socket's queue (one per client link) on its own thread, in
//! order; then, back on the data-plane thread alone, it recycles the buffers and reads the
//! send reports.
//!
//! Receiving is the same split the other way round, per socket batch of [`PARALLEL_MIN`]
//! datagrams or more: the core checks each datagram in arrival order (header, session, replay
//! window: [`braid_core::Endpoint::open_job`]), the batch's jobs are opened in place in parallel
//! parts, and the core commits them in arrival order ([`braid_core::Endpoint::handle_opened`]:
//! replay window, parsing, link health, reorder buffer). A handshake datagram may replace a
//! session, so the jobs before it are opened and committed first and it is handled inline.
//!
//! Nothing but the datagrams and the session's keys crosses threads, so the core stays
//! single-threaded and deterministic.
//!
//! Why `rayon`: a pool of parked threads with scoped spawning (jobs borrow the batch, no
//! copies, no channels to size) and the data-plane thread working alongside in
//! `in_place_scope`; its idle threads spin only briefly before they sleep, which matters on a
//! 2-core box shared with the inner TCP. Hand-written channels and threads would give the same
//! shape with more code to get right.
//!
//! What stays on the data-plane thread: TUN reads and writes, scheduling, the receive system
//! call (`recvmmsg`), the checks and commits around opening (replay windows, parsing, link
//! health, reordering, delivery), and the opening of small batches (see docs/guide.md "Worker
//! threads" for the limit this sets).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Fewer datagrams than this to seal in one flush (or to open in one receive batch) are sealed
/// (opened) on the data-plane thread: waking a helper costs more than sealing a few.
pub const PARALLEL_MIN: usize = 32;
/// The most threads the automatic setting (`workers = 0`) takes, whatever the cores.
pub const AUTO_MAX: usize = 4;

/// The helper threads: none when `workers` is 1 (everything on the data-plane thread).
pub struct Workers {
    pool: Option<rayon::ThreadPool>,
}

impl Workers {
    /// `threads`: how many threads share the data plane's sealing, sending and opening, the data-plane
    /// thread included. 0: one per two cores the process may run on (`taskset` counts), at
    /// least 1 and at most [`AUTO_MAX`]: the kernel's share of each packet (UDP, the NIC or
    /// veth, the TUN, the inner TCP) needs cores too. On 2 cores a helper thread cost about a
    /// quarter of the throughput over one veth link, 4.21 -> 3.25 Gbit/s (BENCHMARKS.md §3).
    /// A concentrator (`[[client]]`) runs on one thread: its endpoints seal and open as they go.
    pub fn new(threads: usize) -> anyhow::Result<Workers> {
        let n = match threads {
            0 => {
                (std::thread::available_parallelism().map_or(1, |n| n.get()) / 2).clamp(1, AUTO_MAX)
            }
            n => n,
        };
        if n <= 1 {
            return Ok(Workers { pool: None });
        }
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n - 1)
            .thread_name(|_| format!("braid-dp{}", NEXT.fetch_add(1, Ordering::Relaxed)))
            .build()?;
        Ok(Workers { pool: Some(pool) })
    }

    /// Threads sharing the work, the data-plane thread included.
    pub fn threads(&self) -> usize {
        self.pool
            .as_ref()
            .map_or(1, |p| p.current_num_threads() + 1)
    }

    /// Runs `f` on every item: the first on this thread, the others on the helpers, and returns
    /// when all are done. On this thread alone without helpers, or for fewer than two items.
    pub fn for_each<T: Send>(&self, items: Vec<T>, f: impl Fn(T) + Sync) {
        let pool = match &self.pool {
            Some(p) if items.len() > 1 => p,
            _ => {
                items.into_iter().for_each(f);
                return;
            }
        };
        let mut items = items.into_iter();
        let first = items.next();
        let f = &f;
        pool.in_place_scope(|scope| {
            for item in items {
                scope.spawn(move |_| f(item));
            }
            if let Some(item) = first {
                f(item);
            }
        });
    }

    /// Runs `f` on every item of `items`, cut into [`Workers::parts`] runs of consecutive
    /// items: the first run on this thread, the others on the helpers; returns when all are
    /// done. Nothing is collected to hand the runs out (no allocation of ours per call).
    pub fn for_each_in_parts<T: Send>(&self, items: &mut [T], f: impl Fn(&mut T) + Sync) {
        let parts = self.parts(items.len());
        let pool = match &self.pool {
            Some(p) if parts > 1 => p,
            _ => {
                items.iter_mut().for_each(f);
                return;
            }
        };
        let mut runs = items.chunks_mut(items.len().div_ceil(parts));
        let first = runs.next();
        let f = &f;
        pool.in_place_scope(|scope| {
            for run in runs {
                scope.spawn(move |_| run.iter_mut().for_each(f));
            }
            if let Some(run) = first {
                run.iter_mut().for_each(f);
            }
        });
    }

    /// How many parts a job of `n` small items is worth cutting into.
    pub fn parts(&self, n: usize) -> usize {
        if n < PARALLEL_MIN {
            1
        } else {
            self.threads().min(n / (PARALLEL_MIN / 2)).max(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_done_once_whatever_the_threads() {
        for threads in [1, 2, 3] {
            let w = Workers::new(threads).unwrap();
            assert_eq!(w.threads(), threads);
            let mut items: Vec<Vec<u32>> = (0..7).map(|i| vec![i]).collect();
            w.for_each(items.iter_mut().collect(), |v: &mut Vec<u32>| {
                v.push(v[0] * 10)
            });
            for (i, v) in items.iter().enumerate() {
                assert_eq!(v, &vec![i as u32, i as u32 * 10], "{threads} threads");
            }
        }
    }

    /// Parts run on the helpers too, each item once, in place.
    #[test]
    fn parts_run_on_several_threads_each_item_once() {
        for threads in [1, 2, 3] {
            let w = Workers::new(threads).unwrap();
            let mut items: Vec<(u32, Option<std::thread::ThreadId>)> =
                (0..1000).map(|i| (i, None)).collect();
            w.for_each_in_parts(&mut items, |(v, on)| {
                assert!(on.is_none(), "item done twice");
                *v *= 3;
                *on = Some(std::thread::current().id());
            });
            let mut seen: Vec<std::thread::ThreadId> = Vec::new();
            for (i, (v, on)) in items.iter().enumerate() {
                assert_eq!(*v, i as u32 * 3, "{threads} threads");
                let on = on.expect("every item done");
                if !seen.contains(&on) {
                    seen.push(on);
                }
            }
            // The first part on this thread, the others on helpers (one may take two parts).
            assert_eq!(seen.len() > 1, threads > 1, "{threads} threads: {seen:?}");
            assert_eq!(seen[0], std::thread::current().id());
        }
    }

    #[test]
    fn small_jobs_stay_in_one_part() {
        let w = Workers::new(3).unwrap();
        assert_eq!(w.parts(PARALLEL_MIN - 1), 1);
        assert_eq!(w.parts(PARALLEL_MIN), 2);
        assert_eq!(w.parts(10_000), 3);
        assert_eq!(Workers::new(1).unwrap().parts(10_000), 1);
        assert!(Workers::new(0).unwrap().threads() <= AUTO_MAX);
    }
}
