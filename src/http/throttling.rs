//! Limits on principals at the data listener: once a request is authorised, and before anything is looked up,
//! its principal and bucket are admitted by the replica's [`Throttle`] under the catalog's table of limits. A
//! refusal is counted and answered at once (429, or S3's 503 `SlowDown`); a permit that holds a place among the
//! requests in progress rides with the response until its last byte is sent.

use std::net::IpAddr;

use axum::body::Body;
use futures_util::StreamExt;
use std::sync::Arc;

use super::DataState;
use super::error::ApiError;
use crate::auth::Credentials;
use crate::catalog::at_once;
use crate::file_body::{Pace, Share};
use crate::throttle::state::{LimitTable, Permit, Who};

/// Who a request is for limits, owned past its credentials' check (which consumes them).
#[derive(Debug, Clone)]
pub enum Asker<'a> {
    Token(&'a str),
    S3Key(&'a str),
    Signer(String),
    Anonymous(IpAddr),
}

impl<'a> Asker<'a> {
    /// From a native request's credentials: a bearer token by its id, a signed URL by its signer.
    pub fn of(credentials: &Credentials<'a>, peer: IpAddr) -> Asker<'a> {
        match credentials {
            Credentials::Anonymous => Asker::Anonymous(peer),
            // Its layout alone: a token whose characters are not ours is refused by the check that follows.
            Credentials::Bearer(token) => Asker::Token(crate::auth::token::claimed_id(token).unwrap_or(token)),
            Credentials::Presigned(params) => Asker::Signer(params.key_id.clone()),
        }
    }

    fn who(&self) -> Who<'_> {
        match self {
            Asker::Token(id) => Who::Token(id),
            Asker::S3Key(id) => Who::S3Key(id),
            Asker::Signer(id) => Who::Signer(id),
            Asker::Anonymous(ip) => Who::Anonymous(*ip),
        }
    }
}

/// What an admitted request carries to its end: the permit that holds its places among the requests in progress
/// and paces its object bytes (a `FileBody` keeps it until the last byte is sent; one allocation for both), the
/// pace of its body, and who it is for the worker's fair shares.
#[derive(Debug, Default, Clone)]
pub struct Admitted {
    pub permit: Option<Arc<Permit>>,
    pub write_pace: Option<Arc<dyn Pace>>,
    /// Who the request is for, as a worker shares its sends fairly between principals.
    pub share: Option<Share>,
}

/// A body of object bytes up to this is granted whole before its head is sent, when its pace has the bytes at
/// once: the driver then sends it unpaced, with no grant per chunk (a small body is one chunk anyway).
pub const PREPAID_MAX: u64 = 64 << 10;

/// What a file body keeps until its last byte is sent, and the pace its object bytes go at.
pub type BodyHold = (Option<Arc<dyn std::any::Any + Send + Sync>>, Option<Arc<dyn Pace>>);

impl Admitted {
    /// What a response body of `object_bytes` object bytes carries: the permit, as its pace when a read bandwidth
    /// limit covers it, unless the body is small and the pace grants it whole now (counted as paced then).
    pub fn for_body(&self, object_bytes: u64) -> BodyHold {
        let Some(permit) = &self.permit else { return (None, None) };
        let held = || Some(Arc::clone(permit) as Arc<dyn std::any::Any + Send + Sync>);
        if !permit.paces_reads() || object_bytes == 0 {
            return (held(), None);
        }
        if object_bytes <= PREPAID_MAX {
            match permit.grant(object_bytes) {
                Ok(granted) if granted == object_bytes => {
                    crate::metrics::paced_bytes("read", permit.scope(), granted);
                    return (held(), None);
                }
                Ok(granted) => permit.refund(granted),
                Err(_) => {}
            }
        }
        (None, Some(Arc::clone(permit) as Arc<dyn Pace>))
    }
}

/// Where no limit is set: principals share by their identity alone, at weight 1.
static NO_LIMITS: std::sync::LazyLock<LimitTable> = std::sync::LazyLock::new(LimitTable::default);

/// Admits `asker`'s request on `bucket` (`""` for a request on no bucket, as ListBuckets: no bucket is named so),
/// or refuses it with the limit that did. No limit at all costs a few atomic
/// loads.
pub async fn admit(app: &DataState, asker: &Asker<'_>, bucket: &str) -> Result<Admitted, ApiError> {
    match admit_at_once(app, asker, bucket) {
        Ok(answer) => answer,
        Err(trip) => trip.await,
    }
}

/// [`admit`]'s answer now when the limits are cached (always, but after a change), else its trip: the native
/// read's future then holds no state for it.
#[allow(clippy::type_complexity)]
pub fn admit_at_once<'a>(
    app: &'a DataState,
    asker: &'a Asker<'_>,
    bucket: &'a str,
) -> Result<Result<Admitted, ApiError>, std::pin::Pin<Box<dyn Future<Output = Result<Admitted, ApiError>> + Send + 'a>>>
{
    match at_once(app.catalog.limits()) {
        Ok(table) => Ok(admit_under(app, table, asker, bucket)),
        Err(trip) => Err(Box::pin(async move { admit_under(app, trip.await, asker, bucket) })),
    }
}

fn admit_under(
    app: &DataState,
    table: Option<Arc<LimitTable>>,
    asker: &Asker<'_>,
    bucket: &str,
) -> Result<Admitted, ApiError> {
    let Some(table) = table else {
        return Ok(Admitted { share: Some(NO_LIMITS.share(&asker.who())), ..Admitted::default() });
    };
    match app.throttle.admit_shared(&table, asker.who(), bucket) {
        Ok((permit, share)) if permit.is_empty() => Ok(Admitted { share: Some(share), ..Admitted::default() }),
        Ok((permit, share)) => {
            let share = Some(share);
            let write_pace = permit.write_pace();
            Ok(Admitted { share, write_pace, permit: Some(Arc::new(permit)) })
        }
        Err(throttled) => {
            crate::metrics::throttled(
                throttled.kind.label(),
                throttled.scope,
                throttled.named.as_deref().unwrap_or(""),
            );
            Err(ApiError::Throttled(Box::new(throttled)))
        }
    }
}

/// An upload's body read no faster than its write limit: each chunk is handed on once `pace` granted its bytes,
/// and the next is not asked for before, so the client feels the limit as TCP flow control. The wait is a timer,
/// which needs no more body: a handler that holds a budgeted chunk while it waits cannot deadlock the budget.
pub fn paced_body(body: Body, pace: Option<Arc<dyn Pace>>) -> Body {
    let Some(pace) = pace else { return body };
    Body::from_stream(body.into_data_stream().then(move |chunk| {
        let pace = Arc::clone(&pace);
        async move {
            if let Ok(bytes) = &chunk {
                crate::metrics::paced_bytes("write", pace.scope(), bytes.len() as u64);
                let mut owed = bytes.len() as u64;
                while owed > 0 {
                    match pace.grant(owed) {
                        Ok(granted) => owed -= granted.clamp(1, owed),
                        Err(wait) => tokio::time::sleep(wait).await,
                    }
                }
            }
            chunk
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throttle::state::Throttle;
    use crate::throttle::{LimitSet, Subject};

    fn admitted(throttle: &Throttle, table: &LimitTable) -> Admitted {
        let (permit, share) = throttle.admit_shared(table, Who::Token("t"), "b").unwrap();
        Admitted { permit: Some(Arc::new(permit)), write_pace: None, share: Some(share) }
    }

    #[test]
    fn a_small_body_is_granted_whole_up_front_and_a_large_one_or_one_the_pace_lacks_is_paced() {
        let throttle = Throttle::new(16);
        let limits = LimitSet { read_bytes: Some(4096), read_burst: Some(64 << 10), ..Default::default() };
        let table = LimitTable::new([(Subject::Token("t".into()), limits)]);
        let small = admitted(&throttle, &table).for_body(40 << 10);
        assert!(small.0.is_some() && small.1.is_none(), "granted whole: held, not paced");
        let large = admitted(&throttle, &table).for_body(1 << 20);
        assert!(large.0.is_none() && large.1.is_some(), "paced (the permit is the pace and holds the places)");
        // 24 KiB are left of the burst: a 40 KiB body is paced, and what it was granted went back.
        let lacking = admitted(&throttle, &table).for_body(40 << 10);
        assert!(lacking.1.is_some(), "paced");
        assert_eq!(lacking.1.unwrap().grant(1 << 20), Ok(24 << 10), "the rest of the burst, given back");
        let head = admitted(&throttle, &table).for_body(0);
        assert!(head.0.is_some() && head.1.is_none(), "no body: nothing to pace");
    }

    #[test]
    fn without_a_read_limit_the_permit_is_only_held() {
        let throttle = Throttle::new(16);
        let limits = LimitSet { concurrent: Some(1), ..Default::default() };
        let table = LimitTable::new([(Subject::Token("t".into()), limits)]);
        let (held, pace) = admitted(&throttle, &table).for_body(1 << 20);
        assert!(held.is_some() && pace.is_none());
        assert!(throttle.admit(&table, Who::Token("t"), "b").is_err(), "the place is held");
        drop(held);
        throttle.admit(&table, Who::Token("t"), "b").unwrap();
    }
}
