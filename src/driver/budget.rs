//! The budget of request-body bytes in memory, shared by every body at once on both listeners
//! (`limits.upload_buffer_bytes`). A body read takes its share before it reads, and the share travels with the
//! bytes ([`budgeted`]): it is given back when the last view of them is dropped, after the handler wrote them.
//! Beyond the budget, reads wait, so TCP back-pressure slows the clients and the server's memory stays flat
//! however many uploads run.
//!
//! **Architecture Invariant:** a handler never waits for more body while it holds budgeted bytes that only it
//! can give back (`http::upload::Staging` writes whatever it holds whenever no write is in flight); otherwise
//! uploads holding part-filled batches could take the whole budget and wait for each other forever.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The shared budget: one semaphore permit per byte.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    total: usize,
}

impl BodyBudget {
    pub fn new(total: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(total)), total }
    }

    /// Waits (first come, first served) for `bytes` of the budget. A request beyond the whole budget takes all of
    /// it, so it waits for the others rather than forever.
    pub async fn acquire(&self, bytes: usize) -> OwnedSemaphorePermit {
        let bytes = bytes.min(self.total).min(u32::MAX as usize) as u32;
        self.permits.clone().acquire_many_owned(bytes).await.expect("the body budget is never closed")
    }
}

/// Body bytes and their share of the budget: the share goes back when the bytes (every slice of them) are dropped.
struct Budgeted<T> {
    bytes: T,
    _share: OwnedSemaphorePermit,
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Budgeted<T> {
    fn as_ref(&self) -> &[u8] {
        self.bytes.as_ref()
    }
}

/// `bytes` as a [`Bytes`] that holds `share` until its last slice is dropped.
pub fn budgeted<T: AsRef<[u8]> + Send + 'static>(bytes: T, share: OwnedSemaphorePermit) -> Bytes {
    Bytes::from_owner(Budgeted { bytes, _share: share })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_share_returns_when_the_last_slice_is_dropped() {
        let budget = BodyBudget::new(100);
        let bytes = budgeted(vec![7u8; 60], budget.acquire(60).await);
        let (head, tail) = (bytes.slice(..10), bytes.slice(50..));
        drop(bytes);
        assert_eq!(budget.permits.available_permits(), 40);
        drop(head);
        assert_eq!(budget.permits.available_permits(), 40, "a slice still holds the share");
        assert_eq!(&tail[..], &[7u8; 10]);
        drop(tail);
        assert_eq!(budget.permits.available_permits(), 100);
    }

    #[tokio::test]
    async fn a_request_beyond_the_whole_budget_takes_all_of_it() {
        let budget = BodyBudget::new(100);
        let all = budget.acquire(1000).await;
        assert_eq!(all.num_permits(), 100);
        let waiting = budget.acquire(1);
        tokio::pin!(waiting);
        let early = futures_util::FutureExt::now_or_never(&mut waiting);
        assert!(early.is_none(), "nothing is left while the whole budget is held");
        drop(all);
        assert_eq!(waiting.await.num_permits(), 1);
    }
}
