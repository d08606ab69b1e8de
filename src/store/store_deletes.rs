//! The timing rules of deleting object-store blobs outside the blob-reference lock (the argument is in
//! `store/mod.rs`): when a sweep may decide to delete a blob, how long its delete may still be sent, and whether
//! a put may commit a blob it made sure of in the store. Pure: unix seconds in, a verdict out.

use std::time::Duration;

use super::metadata::Retirement;

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// How long after its decision a sweep may still send the delete; a later one is skipped (a later sweep decides
/// again). The store client's timeouts and retries must end a delete sent by then within [`lapse`].
pub fn send_deadline(grace: Duration) -> i64 {
    secs(grace) / 4
}

/// After this long a decided delete counts as over even if its sweeper never said so (it died).
pub fn lapse(grace: Duration) -> i64 {
    secs(grace) / 2
}

/// The longest a put may take from reading its blobs' rows to its commit; a slower one starts again.
pub fn max_put_span(grace: Duration) -> i64 {
    secs(grace) / 2
}

/// Whether the delete a row records (if any) is over at `at`: it came back, or lapsed.
pub fn delete_over(row: &Retirement, at: i64, grace: Duration) -> bool {
    match row.deleting_at {
        None => true,
        Some(decided) => row.deleted_at.is_some() || at > decided.saturating_add(lapse(grace)),
    }
}

/// Whether a sweep may decide, at `now`, to delete a blob that no row references, given its retirement row: one
/// retired less than `grace` ago may still be read by a download that started before its last reference went,
/// and one whose delete is in flight is left to that delete. (A blob without a row was never retired: a crashed
/// put's upload, which the sweep takes only once the store says it is older than `grace`.)
pub fn may_decide(row: Option<&Retirement>, now: i64, grace: Duration) -> bool {
    row.is_none_or(|r| r.retired_at <= now.saturating_sub(secs(grace)) && delete_over(r, now, grace))
}

/// Under the blob-reference lock at `now`: may a put commit a blob whose row it read as `before` at `checked_at`,
/// then made sure of in the store (uploaded, or found there), and now reads as `after`? Only if no delete can land
/// after that: none was ever decided (or its tombstone is gone, so it landed long before `checked_at`), or the one
/// decided was already over when the put read the row.
pub fn may_commit(
    before: Option<&Retirement>,
    checked_at: i64,
    after: Option<&Retirement>,
    now: i64,
    grace: Duration,
) -> bool {
    if now.saturating_sub(checked_at) > max_put_span(grace) {
        return false;
    }
    let Some(decided) = after.and_then(|r| r.deleting_at) else { return true };
    before.is_some_and(|b| b.deleting_at == Some(decided) && delete_over(b, checked_at, grace))
}

/// Tombstones of deletes decided before this are dropped (`grace` old: they landed long before any live put
/// read its row).
pub fn prune_before(now: i64, grace: Duration) -> i64 {
    now.saturating_sub(secs(grace))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(3600);

    fn row(retired_at: i64, deleting_at: Option<i64>, deleted_at: Option<i64>) -> Retirement {
        Retirement { retired_at, deleting_at, deleted_at }
    }

    #[test]
    fn a_blob_is_decided_for_deletion_only_a_grace_period_after_its_last_reference_went() {
        let now = 100_000;
        assert!(may_decide(None, now, GRACE), "never retired: the listing's age decides");
        assert!(!may_decide(Some(&row(now - 3599, None, None)), now, GRACE));
        assert!(may_decide(Some(&row(now - 3600, None, None)), now, GRACE));
        let in_flight = row(now - 7200, Some(now - 10), None);
        assert!(!may_decide(Some(&in_flight), now, GRACE), "a delete in flight is left to finish");
        assert!(may_decide(Some(&row(now - 7200, Some(now - 10), Some(now - 5))), now, GRACE));
        assert!(may_decide(Some(&row(now - 7200, Some(now - 1801), None)), now, GRACE), "a lapsed one");
    }

    #[test]
    fn a_put_commits_unless_a_delete_may_land_after_it_read_the_row() {
        let (checked_at, now) = (100_000, 100_010);
        assert!(may_commit(None, checked_at, None, now, GRACE));
        let waiting = row(checked_at - 50, None, None);
        assert!(may_commit(None, checked_at, Some(&waiting), now, GRACE), "retired meanwhile, no delete decided");
        let decided = row(checked_at - 50, Some(checked_at + 5), None);
        assert!(!may_commit(None, checked_at, Some(&decided), now, GRACE), "decided after the read");
        assert!(!may_commit(Some(&waiting), checked_at, Some(&decided), now, GRACE));
        let in_flight = row(checked_at - 50, Some(checked_at - 5), None);
        assert!(!may_commit(Some(&in_flight), checked_at, Some(&in_flight), now, GRACE), "in flight at the read");
        let done = row(checked_at - 50, Some(checked_at - 5), Some(checked_at - 1));
        assert!(!may_commit(Some(&in_flight), checked_at, Some(&done), now, GRACE), "it came back after the read");
        assert!(may_commit(Some(&done), checked_at, Some(&done), now, GRACE), "over before the read");
        let lapsed = row(checked_at - 5000, Some(checked_at - 1801), None);
        assert!(may_commit(Some(&lapsed), checked_at, Some(&lapsed), now, GRACE));
        let again = row(checked_at - 50, Some(checked_at + 1), None);
        assert!(!may_commit(Some(&done), checked_at, Some(&again), now, GRACE), "a second decision");
        assert!(!may_commit(None, checked_at, None, checked_at + 1801, GRACE), "too slow a put starts again");
    }

    #[test]
    fn the_timing_bounds_leave_room_for_one_another() {
        // A delete is sent before `send_deadline`, over by `lapse`, and a tombstone outlives `prune_before` by
        // more than a put may take: a put that finds no tombstone read its row after the delete landed.
        assert!(send_deadline(GRACE) < lapse(GRACE));
        let decided = 0;
        // Pruned once `decided < prune_before(now)`: at `decided + grace + 1` at the earliest.
        let pruned_at = decided + secs(GRACE) + 1;
        assert!(decided < prune_before(pruned_at, GRACE) && decided >= prune_before(pruned_at - 1, GRACE));
        assert!(decided + lapse(GRACE) < pruned_at - max_put_span(GRACE));
    }
}
