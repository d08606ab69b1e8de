//! Fair shares of a data worker's sends between principals (start-time fair queueing over sendfile chunks): when
//! several principals have large bodies ready to send on one worker, each chunk goes to the principal that has
//! had the least, by bytes over its weight, so that 64 connections of one principal do not get 16 times the
//! bytes of 4 of another. A principal counts only while one of its responses is ready to send: one waiting for its
//! client (a full socket) or for its pace holds no one back. Uncontended, a turn is one map lookup.
//!
//! Per worker thread (a connection lives on one), so the state is a `RefCell` and wakers are local. The admin
//! listener (the main runtime, where tasks move between threads) does not take part.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::task::{Poll, Waker};

use crate::file_body::Share;

/// How far ahead (in weighted bytes) of the one that has had least a principal may be and still send: 2 MiB at
/// weight 1, four of a shared worker's chunks, so that several of its chunks can be in flight on the pool at once
/// (at a sixty-fourth of that, each principal's sends went one at a time, and the worker sent less in all).
const AHEAD: u64 = (2 << 20) * SCALE;
/// Weighted bytes are bytes times this over the weight.
const SCALE: u64 = 64;

#[derive(Debug, Default)]
struct Principal {
    /// Weighted bytes sent (start-time fair queueing's virtual time).
    sent: u64,
    /// Its responses ready to send on this worker.
    ready: u32,
    /// Tasks waiting for a turn, woken one at a time.
    waiting: VecDeque<Waker>,
}

/// One worker's principals with bodies in progress.
#[derive(Debug, Default)]
pub struct Shares {
    principals: HashMap<u64, Principal>,
}

impl Shares {
    /// The least weighted bytes among the principals other than `key` that are ready to send.
    fn floor(&self, key: u64) -> Option<u64> {
        self.principals.iter().filter(|(k, p)| **k != key && p.ready > 0).map(|(_, p)| p.sent).min()
    }

    /// A response of `key` is ready to send. A principal that was idle starts level with the others, so that
    /// being idle earns no credit.
    pub fn ready(&mut self, key: u64) {
        let floor = self.floor(key);
        let p = self.principals.entry(key).or_default();
        if p.ready == 0 {
            p.sent = p.sent.max(floor.unwrap_or(0));
        }
        p.ready += 1;
    }

    /// A response of `key` is no longer ready (it waits for its client or its pace, or it ended).
    pub fn not_ready(&mut self, key: u64) {
        if let Some(p) = self.principals.get_mut(&key) {
            p.ready = p.ready.saturating_sub(1);
            if p.ready == 0 && p.waiting.is_empty() {
                self.principals.remove(&key);
            }
        }
        self.wake_eligible();
    }

    /// Whether `key` may send now.
    pub fn may_send(&self, key: u64) -> bool {
        let sent = self.principals.get(&key).map_or(0, |p| p.sent);
        self.floor(key).is_none_or(|floor| sent <= floor + AHEAD)
    }

    /// `bytes` of `share` went out.
    pub fn charge(&mut self, share: Share, bytes: u64) {
        if let Some(p) = self.principals.get_mut(&share.key) {
            p.sent += bytes * SCALE / u64::from(share.weight.max(1));
        }
        self.wake_eligible();
    }

    fn park(&mut self, key: u64, waker: &Waker) {
        self.principals.entry(key).or_default().waiting.push_back(waker.clone());
    }

    /// Wakes one waiting task of each principal that may send now.
    fn wake_eligible(&mut self) {
        let eligible: Vec<u64> = self
            .principals
            .iter()
            .filter(|(k, p)| !p.waiting.is_empty() && self.may_send(**k))
            .map(|(k, _)| *k)
            .collect();
        for key in eligible {
            if let Some(waker) = self.principals.get_mut(&key).and_then(|p| p.waiting.pop_front()) {
                waker.wake();
            }
        }
    }
}

thread_local! {
    /// Set on data worker threads only.
    static SHARES: RefCell<Option<Shares>> = const { RefCell::new(None) };
}

/// Makes this thread (a data worker's) share its sends fairly.
pub fn attach_worker() {
    SHARES.with(|s| *s.borrow_mut() = Some(Shares::default()));
}

fn with<T>(f: impl FnOnce(&mut Shares) -> T) -> Option<T> {
    SHARES.with(|s| s.borrow_mut().as_mut().map(f))
}

/// A response of `share` ready to send on this worker until the guard drops (or [`Ready::pause`]).
#[derive(Debug)]
pub struct Ready {
    share: Option<Share>,
    counted: bool,
}

impl Ready {
    /// `None` off a data worker, or for a body that takes no part.
    pub fn new(share: Option<Share>) -> Ready {
        let counted = share.is_some_and(|s| with(|shares| shares.ready(s.key)).is_some());
        Ready { share, counted }
    }

    /// Waits until this principal may send its next chunk.
    pub async fn turn(&self) {
        let Some(key) = self.share.filter(|_| self.counted).map(|s| s.key) else { return };
        poll_fn(|cx| match with(|shares| shares.may_send(key)) {
            Some(false) => {
                with(|shares| shares.park(key, cx.waker()));
                Poll::Pending
            }
            _ => Poll::Ready(()),
        })
        .await
    }

    /// `bytes` went out.
    pub fn sent(&self, bytes: u64) {
        if let (Some(share), true) = (self.share, self.counted) {
            with(|shares| shares.charge(share, bytes));
        }
    }

    /// Not ready while it waits for its client or its pace.
    pub fn pause(&mut self) {
        if let (Some(share), true) = (self.share, self.counted) {
            with(|shares| shares.not_ready(share.key));
            self.counted = false;
        }
    }

    /// Ready again.
    pub fn resume(&mut self) {
        if let (Some(share), false) = (self.share, self.counted) {
            self.counted = with(|shares| shares.ready(share.key)).is_some();
        }
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        self.pause();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(key: u64, weight: u32) -> Share {
        Share { key, weight }
    }

    /// Who sends next when `many` connections of principal 1 and `few` of principal 2 are always ready and each
    /// turn goes to the first ready connection that may send (the worker's run queue, in order).
    fn bytes_sent(many: usize, few: usize, weights: (u32, u32), chunks: usize) -> (u64, u64) {
        let mut shares = Shares::default();
        let mut queue: VecDeque<Share> = VecDeque::new();
        for _ in 0..many {
            shares.ready(1);
            queue.push_back(share(1, weights.0));
        }
        for _ in 0..few {
            shares.ready(2);
            queue.push_back(share(2, weights.1));
        }
        let (mut one, mut two) = (0, 0);
        for _ in 0..chunks {
            // The first in the queue that may send sends a chunk and goes to the back.
            let at = queue.iter().position(|s| shares.may_send(s.key)).expect("someone may always send");
            let s = queue.remove(at).unwrap();
            shares.charge(s, AHEAD);
            if s.key == 1 {
                one += AHEAD
            } else {
                two += AHEAD
            }
            queue.push_back(s);
        }
        (one, two)
    }

    #[test]
    fn sixty_four_connections_get_no_more_than_four_at_equal_weight() {
        let (one, two) = bytes_sent(64, 4, (1, 1), 10_000);
        let share = two as f64 / (one + two) as f64;
        assert!((0.49..=0.51).contains(&share), "the few got {share:.3}");
    }

    #[test]
    fn weights_divide_the_bytes() {
        let (one, two) = bytes_sent(8, 8, (1, 3), 10_000);
        let share = two as f64 / (one + two) as f64;
        assert!((0.74..=0.76).contains(&share), "weight 3 of 4 got {share:.3}");
    }

    #[test]
    fn a_principal_that_is_not_ready_holds_no_one_back_and_comes_back_level() {
        let mut shares = Shares::default();
        shares.ready(1);
        shares.ready(2);
        shares.charge(share(1, 1), 100 * AHEAD);
        assert!(!shares.may_send(1), "far ahead of 2");
        shares.not_ready(2);
        assert!(shares.may_send(1), "2 waits for its client: 1 goes on");
        shares.ready(2);
        assert!(shares.may_send(1) && shares.may_send(2), "2 comes back level, with no credit for its pause");
        shares.not_ready(1);
        shares.not_ready(2);
        assert!(shares.principals.is_empty(), "nothing kept for principals with nothing to send");
    }
}
