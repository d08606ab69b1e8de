//! Limits on principals at the data listener: once a request is authorised, and before anything is looked up,
//! its principal and bucket are admitted by the replica's [`Throttle`] under the catalog's table of limits. A
//! refusal is counted and answered at once (429, or S3's 503 `SlowDown`); a permit that holds a place among the
//! requests in progress rides with the response until its last byte is sent.

use std::net::IpAddr;
use std::sync::Arc;

use super::DataState;
use super::error::ApiError;
use crate::auth::Credentials;
use crate::catalog::at_once;
use crate::throttle::state::Who;

/// Who a request is for limits, owned past its credentials' check (which consumes them).
#[derive(Debug, Clone)]
pub enum Asker<'a> {
    Token(&'a str),
    S3Key(String),
    Signer(String),
    Anonymous(IpAddr),
}

impl<'a> Asker<'a> {
    /// From a native request's credentials: a bearer token by its id, a signed URL by its signer.
    pub fn of(credentials: &Credentials<'a>, peer: IpAddr) -> Asker<'a> {
        match credentials {
            Credentials::Anonymous => Asker::Anonymous(peer),
            Credentials::Bearer(token) => Asker::Token(crate::auth::token::token_id(token).unwrap_or(token)),
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

/// A held place among the requests in progress, as a `FileBody` carries it to the end of the send.
pub type HeldPermit = Option<Arc<dyn std::any::Any + Send + Sync>>;

/// Admits `asker`'s request on `bucket`, or refuses it with the limit that did. No limit at all costs a cache hit.
pub async fn admit(app: &DataState, asker: &Asker<'_>, bucket: &str) -> Result<HeldPermit, ApiError> {
    let table = match at_once(app.catalog.limits()) {
        Ok(table) => table,
        Err(trip) => trip.await,
    };
    if table.is_empty() {
        return Ok(None);
    }
    match app.throttle.admit(&table, asker.who(), bucket) {
        Ok(permit) => Ok(permit.holds().then(|| Arc::new(permit) as Arc<dyn std::any::Any + Send + Sync>)),
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
