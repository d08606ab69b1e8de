//! The cost of limits configured but not reached, per request: a bearer token's limit and its bucket's, each with
//! a request rate, a read bandwidth and a concurrency limit, admitted, one 4 KiB body granted, released. Run on one
//! thread, then on two at once (the data workers of a 2-core machine share the counters): the difference is what
//! the counters' shared cache lines cost.
//!
//!     cargo bench --bench throttle
//!
//! Prints ns per request for each; compare builds side by side in one run, not absolute figures.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use blobgate::file_body::Pace;
use blobgate::throttle::state::{LimitTable, Throttle, Who};
use blobgate::throttle::{LimitSet, RequestRate, Subject};

const REQUESTS: u32 = 2_000_000;

fn never_reached() -> LimitSet {
    LimitSet {
        requests: Some(RequestRate { count: 1_000_000_000, period_secs: 1 }),
        read_bytes: Some(1 << 40),
        concurrent: Some(1_000_000),
        ..Default::default()
    }
}

/// ns per request on each of `threads` threads, every thread with its own copy of the table (as each data worker
/// has).
fn run(throttle: &Arc<Throttle>, table: &LimitTable, threads: usize) -> f64 {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (throttle, table, barrier) = (throttle.clone(), table.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                for _ in 0..REQUESTS {
                    let (permit, share) = throttle.admit_shared(&table, Who::Token("bench-token"), "bench").unwrap();
                    black_box(share);
                    black_box(permit.grant(4096).unwrap());
                    drop(permit);
                }
                start.elapsed().as_nanos() as f64 / f64::from(REQUESTS)
            })
        })
        .collect();
    let each: Vec<f64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    each.iter().sum::<f64>() / each.len() as f64
}

fn main() {
    let table = LimitTable::new([
        (Subject::Token("bench-token".into()), never_reached()),
        (Subject::Bucket("bench".into()), never_reached()),
    ]);
    let throttle = Arc::new(Throttle::default());
    for round in 1..=3 {
        let one = run(&throttle, &table, 1);
        let two = run(&throttle, &table, 2);
        println!("round {round}: one thread {one:.1} ns/request, two threads {two:.1} ns/request each");
    }
}
