//! Who gets a data connection: the cap shared by all workers (`limits.max_connections`), the per-address cap
//! (`limits.max_connections_per_ip`), and the keep-alive timeout under pressure.
//!
//! At the cap, a worker that holds a new client closes an idle connection to make room, as nginx does with its
//! reusable-connections queue: the one idle the longest of all workers. When that one is its own it closes it at
//! once; else it asks the worker that has it (a cross-thread wake-up, paid only at the cap). So a cap full of
//! idle keep-alive connections never locks new clients out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::idle::{self, WorkerIdle};

/// How often a worker still waiting at the cap asks again for an idle connection to close (its first request
/// may have freed a slot that another waiting worker took, or found no idle connection anywhere).
const CLOSE_RETRY: Duration = Duration::from_millis(200);

pub struct Admission {
    slots: Arc<Semaphore>,
    cap: usize,
    /// One per data worker, indexed like the workers.
    workers: Vec<Arc<WorkerIdle>>,
    /// Open connections by client address; `None` when `limits.max_connections_per_ip` is 0 (unlimited).
    per_ip: Option<PerIp>,
}

struct PerIp {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl Admission {
    pub fn new(cap: usize, max_per_ip: usize, workers: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(cap)),
            cap,
            workers: (0..workers).map(|_| Arc::default()).collect(),
            per_ip: (max_per_ip > 0).then(|| PerIp { max: max_per_ip, open: Mutex::default() }),
        }
    }

    pub fn worker(&self, n: usize) -> Arc<WorkerIdle> {
        self.workers[n].clone()
    }

    /// Counts a new connection from `ip`; `None` when that address already has its maximum open.
    pub fn admit_address(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let Some(per_ip) = &self.per_ip else {
            return Some(AddressSlot { admission: None, ip });
        };
        // IPv4 clients of a dual-stack socket arrive as ::ffff:a.b.c.d; count them as the IPv4 address.
        let ip = ip.to_canonical();
        let mut open = per_ip.open.lock().expect("the per-address map is never poisoned");
        let count = open.entry(ip).or_insert(0);
        if *count >= per_ip.max {
            return None;
        }
        *count += 1;
        Some(AddressSlot { admission: Some(self.clone()), ip })
    }

    /// A slot under the cap for a connection accepted on worker `worker`. At the cap, idle connections are
    /// closed to make room (see the module doc). `None` when `shutdown` fires first.
    pub async fn slot(&self, worker: usize, shutdown: &CancellationToken) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        // Queue for the next free slot first (the semaphore is fair), then make one free.
        let acquire = self.slots.clone().acquire_owned();
        tokio::pin!(acquire);
        let mut retry = tokio::time::interval(CLOSE_RETRY);
        loop {
            tokio::select! {
                biased;
                permit = &mut acquire => return Some(permit.expect("the semaphore is never closed")),
                _ = shutdown.cancelled() => return None,
                _ = retry.tick() => self.close_an_idle_connection(worker),
            }
        }
    }

    /// The idle timeout for a connection that starts waiting now (see [`keep_alive_under_pressure`]).
    pub fn keep_alive_idle(&self, configured: Duration) -> Duration {
        keep_alive_under_pressure(configured, self.cap.saturating_sub(self.slots.available_permits()), self.cap)
    }

    /// Closes the longest-idle connection of all workers (each worker publishes when its oldest started
    /// waiting); this thread is worker `worker`.
    fn close_an_idle_connection(&self, worker: usize) {
        let oldest =
            self.workers.iter().enumerate().filter(|(_, w)| w.idle() > 0).min_by_key(|(_, w)| w.oldest_since());
        match oldest {
            Some((n, _)) if n == worker => {
                idle::close_oldest_idle();
            }
            Some((_, other)) => other.request_close(),
            None => {}
        }
    }
}

/// The per-address count of one connection; released when dropped.
pub struct AddressSlot {
    admission: Option<Arc<Admission>>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let Some(per_ip) = self.admission.as_ref().and_then(|a| a.per_ip.as_ref()) else { return };
        let mut open = per_ip.open.lock().expect("the per-address map is never poisoned");
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The keep-alive idle timeout when `open` of `cap` connections are in use. Up to 90% of the cap it is the
/// configured one; above, a tenth of it, but at least one second (and never more than configured): idle
/// connections then give their slots back sooner, before new clients have to wait for an eviction.
pub fn keep_alive_under_pressure(configured: Duration, open: usize, cap: usize) -> Duration {
    if open.saturating_mul(10) <= cap.saturating_mul(9) {
        return configured;
    }
    (configured / 10).max(Duration::from_secs(1)).min(configured)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::idle::IdleEntry;
    use std::task::Poll;

    #[test]
    fn at_the_cap_the_longest_idle_connection_of_all_workers_is_closed() {
        let admission = Arc::new(Admission::new(1, 0, 2));
        let other = admission.worker(1);
        let (idle_tx, idle_rx) = std::sync::mpsc::channel();
        let (closed_tx, closed_rx) = std::sync::mpsc::channel();
        // Worker 1: one idle "connection", a task that ends only once it is chosen for closing.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                idle::attach_worker(other.clone());
                tokio::spawn(other.serve_close_requests());
                let mut entry = None;
                std::future::poll_fn(|cx| {
                    if entry.as_ref().is_some_and(IdleEntry::evicted) {
                        return Poll::Ready(());
                    }
                    if entry.is_none() {
                        IdleEntry::mark(&mut entry, cx.waker(), std::time::Instant::now());
                        idle_tx.send(()).unwrap();
                    }
                    Poll::Pending
                })
                .await;
                closed_tx.send(()).unwrap();
            });
        });
        idle_rx.recv_timeout(Duration::from_secs(5)).expect("worker 1 went idle");
        assert_eq!(admission.workers[1].idle(), 1, "worker 1 publishes its idle count");
        // This thread plays worker 0, whose own idle connection is younger than worker 1's.
        idle::attach_worker(admission.worker(0));
        let mut ours = None;
        IdleEntry::mark(&mut ours, std::task::Waker::noop(), std::time::Instant::now());
        admission.close_an_idle_connection(0);
        closed_rx.recv_timeout(Duration::from_secs(5)).expect("worker 1 closed its idle connection on request");
        assert_eq!(admission.workers[1].idle(), 0);
        assert!(!ours.as_ref().unwrap().evicted(), "the younger one, here, stays");
        // Now ours is the oldest of all.
        admission.close_an_idle_connection(0);
        assert!(ours.as_ref().unwrap().evicted());
        assert_eq!(admission.workers[0].idle(), 0);
    }

    #[test]
    fn keep_alive_shrinks_above_ninety_percent_of_the_cap() {
        let base = Duration::from_secs(75);
        assert_eq!(keep_alive_under_pressure(base, 0, 100), base);
        assert_eq!(keep_alive_under_pressure(base, 90, 100), base);
        assert_eq!(keep_alive_under_pressure(base, 91, 100), Duration::from_millis(7500));
        assert_eq!(keep_alive_under_pressure(base, 100, 100), Duration::from_millis(7500));
        assert_eq!(keep_alive_under_pressure(base, 9000, 10_000), base);
        assert_eq!(keep_alive_under_pressure(base, 9001, 10_000), Duration::from_millis(7500));
        // A tenth, but at least a second, and never longer than configured.
        assert_eq!(keep_alive_under_pressure(Duration::from_secs(5), 10, 10), Duration::from_secs(1));
        assert_eq!(keep_alive_under_pressure(Duration::from_millis(300), 10, 10), Duration::from_millis(300));
        // A cap of one: the only connection is 100% of it.
        assert_eq!(keep_alive_under_pressure(base, 1, 1), Duration::from_millis(7500));
    }

    #[test]
    fn the_per_address_cap_counts_open_connections_and_frees_on_drop() {
        let admission = Arc::new(Admission::new(10, 2, 1));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = admission.admit_address(a).expect("first");
        let _second = admission.admit_address(a).expect("second");
        assert!(admission.admit_address(a).is_none(), "a third from the same address is refused");
        // The IPv4-mapped form is the same client.
        assert!(admission.admit_address("::ffff:192.0.2.1".parse().unwrap()).is_none());
        let _other = admission.admit_address(b).expect("another address has its own count");
        drop(first);
        assert!(admission.admit_address(a).is_some(), "a closed connection frees its place");
    }

    #[test]
    fn no_per_address_cap_when_zero() {
        let admission = Arc::new(Admission::new(10, 0, 1));
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let held: Vec<_> = (0..100).map(|_| admission.admit_address(ip).expect("unlimited")).collect();
        assert_eq!(held.len(), 100);
    }
}
