//! Idle data connections on one worker, oldest first, so that a worker at `limits.max_connections` can close
//! one to admit a new client (nginx's reusable-connections queue).
//!
//! A connection is idle while it waits for a request head and has read zero bytes of it: between keep-alive
//! requests, or after accept before the client sent anything. Closing it then is clean: no response is cut and
//! no request is half read. The list lives in a thread-local (each data worker is one thread), so joining and
//! leaving it costs a slab insert and remove, with no lock, atomic read-modify-write or wake-up. Only the
//! worker's idle count and the idle-since time of its oldest idle connection are published (plain atomic stores),
//! for a worker at the cap to find the oldest idle connection of all workers.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Waker;
use std::time::Instant;

use slab::Slab;
use tokio::sync::Notify;

/// A doubly linked list threaded through a slab: O(1) to join at the tail, leave from anywhere, and take the
/// head (the connection idle the longest). Joining happens in time order, so the list is sorted by idle-since.
#[derive(Default)]
pub struct IdleList {
    slots: Slab<Slot>,
    oldest: Option<usize>,
    newest: Option<usize>,
    linked: usize,
}

struct Slot {
    prev: Option<usize>,
    next: Option<usize>,
    /// The connection task to wake when it is chosen for closing.
    waker: Waker,
    /// When it started waiting, in nanoseconds since [`clock_base`].
    since: u64,
    /// Chosen for closing: unlinked, but the slot stays until its connection leaves, so its key is not reused
    /// while the connection still holds it.
    evicted: bool,
}

impl IdleList {
    /// Adds a connection as the newest idle one (idle since `since`, no earlier than any other's); returns its
    /// key.
    pub fn join(&mut self, waker: Waker, since: u64) -> usize {
        let key = self.slots.insert(Slot { prev: self.newest, next: None, waker, since, evicted: false });
        match self.newest {
            Some(newest) => self.slots[newest].next = Some(key),
            None => self.oldest = Some(key),
        }
        self.newest = Some(key);
        self.linked += 1;
        key
    }

    /// Keeps the waker current (a task's waker can change between polls).
    pub fn refresh(&mut self, key: usize, waker: &Waker) {
        let slot = &mut self.slots[key];
        if !slot.waker.will_wake(waker) {
            slot.waker = waker.clone();
        }
    }

    /// Whether this connection was chosen for closing.
    pub fn is_evicted(&self, key: usize) -> bool {
        self.slots[key].evicted
    }

    /// The connection is no longer idle (it read bytes, or it is closing).
    pub fn leave(&mut self, key: usize) {
        if !self.slots[key].evicted {
            self.unlink(key);
        }
        self.slots.remove(key);
    }

    /// Chooses the connection idle the longest for closing; returns its waker, to be woken once the list is no
    /// longer borrowed.
    pub fn evict_oldest(&mut self) -> Option<Waker> {
        let key = self.oldest?;
        self.unlink(key);
        let slot = &mut self.slots[key];
        slot.evicted = true;
        Some(slot.waker.clone())
    }

    /// Idle connections not yet chosen for closing.
    pub fn len(&self) -> usize {
        self.linked
    }

    /// When the longest-idle connection started waiting; `u64::MAX` when there is none.
    pub fn oldest_since(&self) -> u64 {
        self.oldest.map_or(u64::MAX, |key| self.slots[key].since)
    }

    fn unlink(&mut self, key: usize) {
        let (prev, next) = (self.slots[key].prev, self.slots[key].next);
        match prev {
            Some(p) => self.slots[p].next = next,
            None => self.oldest = next,
        }
        match next {
            Some(n) => self.slots[n].prev = prev,
            None => self.newest = prev,
        }
        self.linked -= 1;
    }
}

/// What other threads see of one worker's idle list, and how they ask it to close idle connections.
pub struct WorkerIdle {
    /// This worker's idle count, stored (not incremented) by the worker itself after each change.
    idle: AtomicUsize,
    /// Its oldest idle connection's [`IdleList::oldest_since`], stored likewise.
    oldest_since: AtomicU64,
    /// Idle connections other workers asked this one to close.
    close_requests: AtomicUsize,
    wake: Notify,
}

impl Default for WorkerIdle {
    fn default() -> Self {
        Self {
            idle: AtomicUsize::new(0),
            oldest_since: AtomicU64::new(u64::MAX),
            close_requests: AtomicUsize::new(0),
            wake: Notify::new(),
        }
    }
}

impl WorkerIdle {
    pub fn idle(&self) -> usize {
        self.idle.load(Ordering::Relaxed)
    }

    /// When this worker's longest-idle connection started waiting; `u64::MAX` when it has none.
    pub fn oldest_since(&self) -> u64 {
        self.oldest_since.load(Ordering::Relaxed)
    }

    /// Asks this worker (from any thread) to close its oldest idle connection.
    pub fn request_close(&self) {
        self.close_requests.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// The worker's own task that serves `request_close`; runs until the worker's runtime ends.
    pub async fn serve_close_requests(self: Arc<Self>) {
        loop {
            self.wake.notified().await;
            for _ in 0..self.close_requests.swap(0, Ordering::AcqRel) {
                if !close_oldest_idle() {
                    break;
                }
            }
        }
    }
}

#[derive(Default)]
struct LocalIdle {
    list: IdleList,
    shared: Option<Arc<WorkerIdle>>,
}

impl LocalIdle {
    fn publish(&self) {
        if let Some(shared) = &self.shared {
            shared.idle.store(self.list.len(), Ordering::Relaxed);
            shared.oldest_since.store(self.list.oldest_since(), Ordering::Relaxed);
        }
    }
}

thread_local! {
    static LOCAL: RefCell<LocalIdle> = RefCell::new(LocalIdle::default());
}

/// Makes this thread a data worker whose idle count `shared` publishes.
pub fn attach_worker(shared: Arc<WorkerIdle>) {
    LOCAL.with_borrow_mut(|local| local.shared = Some(shared));
}

/// The process-wide origin of idle-since times, so that workers' times compare.
fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Closes this worker's longest-idle connection, if it has one: marks it and wakes its task, which then ends
/// without writing anything. Returns whether there was one.
pub fn close_oldest_idle() -> bool {
    let waker = LOCAL.with_borrow_mut(|local| {
        let waker = local.list.evict_oldest();
        local.publish();
        waker
    });
    let Some(waker) = waker else { return false };
    crate::metrics::idle_connection_reclaimed();
    waker.wake();
    true
}

/// A connection's place in its worker's idle list; leaving the list when dropped.
pub struct IdleEntry {
    key: usize,
}

impl IdleEntry {
    /// Joins the list as idle since `since`, or (already in it) refreshes the waker.
    pub fn mark(entry: &mut Option<IdleEntry>, waker: &Waker, since: Instant) {
        LOCAL.with_borrow_mut(|local| match entry {
            Some(e) => local.list.refresh(e.key, waker),
            None => {
                let since = since.saturating_duration_since(clock_base()).as_nanos() as u64;
                *entry = Some(IdleEntry { key: local.list.join(waker.clone(), since) });
                local.publish();
            }
        });
    }

    /// Whether the worker chose this connection to close.
    pub fn evicted(&self) -> bool {
        LOCAL.with_borrow(|local| local.list.is_evicted(self.key))
    }
}

impl Drop for IdleEntry {
    fn drop(&mut self) {
        // try_with: at thread exit the list may be gone already, and then there is nothing to leave.
        let _ = LOCAL.try_with(|local| {
            let mut local = local.borrow_mut();
            local.list.leave(self.key);
            local.publish();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::task::Wake;

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn flag() -> (Arc<Flag>, Waker) {
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        (flag.clone(), Waker::from(flag))
    }

    #[test]
    fn the_oldest_idle_connection_is_evicted_first() {
        let mut list = IdleList::default();
        let (first_flag, first) = flag();
        let (_, second) = flag();
        let (_, third) = flag();
        let a = list.join(first, 1);
        let b = list.join(second, 2);
        let c = list.join(third, 3);
        assert_eq!(list.len(), 3);
        assert_eq!(list.oldest_since(), 1);
        list.evict_oldest().expect("one to evict").wake();
        assert!(first_flag.0.load(Ordering::SeqCst), "the oldest connection's task was woken");
        assert!(list.is_evicted(a) && !list.is_evicted(b) && !list.is_evicted(c));
        assert_eq!(list.len(), 2);
        assert_eq!(list.oldest_since(), 2);
        // Leaving from the middle keeps the order of the rest.
        list.leave(b);
        list.evict_oldest().unwrap();
        assert!(list.is_evicted(c));
        assert!(list.evict_oldest().is_none(), "evicted entries are not chosen twice");
        list.leave(a);
        list.leave(c);
        assert!(list.len() == 0 && list.slots.is_empty());
        assert_eq!(list.oldest_since(), u64::MAX);
    }

    #[test]
    fn an_evicted_key_is_not_reused_until_its_connection_leaves() {
        let mut list = IdleList::default();
        let (_, w) = flag();
        let a = list.join(w.clone(), 0);
        list.evict_oldest().unwrap();
        let b = list.join(w.clone(), 1);
        assert_ne!(a, b);
        assert!(list.is_evicted(a) && !list.is_evicted(b));
        list.leave(a);
        assert_eq!(list.len(), 1);
        assert!(list.evict_oldest().is_some());
    }

    #[test]
    fn joins_and_leaves_in_any_order_keep_the_list_consistent() {
        // A small model check: the list evicts in join order whatever left in between.
        let (_, w) = flag();
        for seed in 0u64..200 {
            let mut list = IdleList::default();
            let mut model: std::collections::VecDeque<usize> = Default::default();
            let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            for t in 0..60 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 3 {
                    0 | 1 => model.push_back(list.join(w.clone(), t)),
                    _ if !model.is_empty() => {
                        let i = (x >> 8) as usize % model.len();
                        list.leave(model.remove(i).unwrap());
                    }
                    _ => {}
                }
                assert_eq!(list.len(), model.len());
            }
            while let Some(expected) = model.pop_front() {
                list.evict_oldest().unwrap();
                assert!(list.is_evicted(expected), "seed {seed}: evicted out of join order");
                list.leave(expected);
            }
            assert!(list.evict_oldest().is_none());
        }
    }
}
