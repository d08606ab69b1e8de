//! A handler deadline that costs nothing when the handler finishes at once.
//!
//! tower-http's `TimeoutLayer` polls its `Sleep` before the inner future, so every request inserts a timer into
//! tokio's wheel and removes it again. Before the data workers had their timer anchor (`driver::anchor_timer_wheel`)
//! that timer was also the wheel's earliest and unparked the driver: an eventfd `write(2)` per request. With the
//! anchor, what is left is the wheel work, still measurable on small downloads (docs/measurements.md). A cached
//! GET completes on its first poll, so the handler is polled first and the timer is armed only when it really has
//! to wait (a cold lookup, a busy database). Through the layer the deadline still counts from the call, not from the
//! first `Pending` (a request's future may wait before it is polled); [`bound`] counts from the first `Pending`. The
//! timeout answer is the JSON `ApiError` (503 `handler_timeout`) rather than an empty 503, or for an S3 request
//! S3's XML (503 `SlowDown`, which SDKs retry) with `x-amz-request-id`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use super::error::ApiError;

/// Answers `503 handler_timeout` when the inner service has not produced a response within `limit`.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    limit: Duration,
}

impl DeadlineLayer {
    pub fn new(limit: Duration) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Deadline { inner, limit: self.limit }
    }
}

#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    limit: Duration,
}

/// What the deadline needs to know of a request: where a timeout is answered in S3's words (the path of an S3
/// request, as classified; `None` for a native one, answered in JSON), and whether the deadline applies at all.
pub trait S3Resource {
    fn s3_resource(&self) -> Option<http::Uri>;

    /// A write has no handler deadline: its body takes as long as the client sends it, bounded by
    /// `timeouts.body_idle` and `limits.min_upload_rate` instead.
    fn bounded(&self) -> bool {
        true
    }
}

impl S3Resource for super::Classified {
    fn s3_resource(&self) -> Option<http::Uri> {
        // A refcounted clone: no copy of the path on the S3 path either.
        matches!(self.api, crate::s3::operation::Api::S3(_)).then(|| self.request.uri().clone())
    }

    fn bounded(&self) -> bool {
        !self.api.is_write(self.request.method())
    }
}

impl S3Resource for () {
    fn s3_resource(&self) -> Option<http::Uri> {
        None
    }
}

impl<S, Request> Service<Request> for Deadline<S>
where
    S: Service<Request, Response = Response>,
    Request: S3Resource,
{
    type Response = Response;
    type Error = S::Error;
    type Future = DeadlineFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let s3_resource = request.s3_resource();
        let expiry = if request.bounded() { Expiry::At(Instant::now() + self.limit) } else { Expiry::Never };
        DeadlineFuture { inner: self.inner.call(request), expiry, timer: None, s3_resource }
    }
}

/// `inner` under the deadline `limit`, answered in JSON when it passes: what [`Deadline`] does, for a request that
/// is not an `http::Request` (the data listener's native reads, `super::DataService`). The driver polls it as soon
/// as it is made, so the deadline counts from the first poll that has to wait: a read answered from the caches
/// never waits, and reads no clock for its deadline.
pub fn bound<F>(inner: F, limit: Duration) -> DeadlineFuture<F> {
    DeadlineFuture { inner, expiry: Expiry::AfterFirstWait(limit), timer: None, s3_resource: None }
}

/// When a [`DeadlineFuture`]'s handler runs out of time.
#[derive(Debug, Clone, Copy)]
enum Expiry {
    /// No deadline (a write).
    Never,
    At(Instant),
    /// `limit` after the first poll that returns `Pending`.
    AfterFirstWait(Duration),
}

pin_project_lite::pin_project! {
    pub struct DeadlineFuture<F> {
        #[pin]
        inner: F,
        expiry: Expiry,
        // Boxed and created only once the handler has returned Pending: the common case never allocates it.
        timer: Option<Pin<Box<Sleep>>>,
        // An S3 request's URI: its timeout is S3 XML with x-amz-request-id.
        s3_resource: Option<http::Uri>,
    }
}

impl<F, T, E> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<T, E>>,
    T: From<Response>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.inner.poll(cx) {
            return Poll::Ready(result);
        }
        let expires = match *this.expiry {
            Expiry::Never => return Poll::Pending,
            Expiry::At(at) => at,
            Expiry::AfterFirstWait(limit) => {
                let at = Instant::now() + limit;
                *this.expiry = Expiry::At(at);
                at
            }
        };
        let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(expires)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Ok(T::from(match this.s3_resource.take() {
                None => ApiError::HandlerTimeout.into_response(),
                Some(uri) => {
                    let ctx = super::s3::S3Context::new(uri.path());
                    let mut response = super::s3::S3Error::Api(ApiError::HandlerTimeout).render(&ctx);
                    response.headers_mut().insert(super::s3::AMZ_REQUEST_ID.clone(), ctx.request_id.clone());
                    response
                }
            }))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::StatusCode;
    use tower::ServiceExt;

    use super::*;

    fn service_after(delay: Duration) -> impl Service<(), Response = Response, Error = Infallible, Future: Send> {
        tower::service_fn(move |()| async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, Infallible>(StatusCode::NO_CONTENT.into_response())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_response_passes_through() {
        let service = DeadlineLayer::new(Duration::from_secs(1)).layer(service_after(Duration::ZERO));
        let Ok(response) = service.oneshot(()).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_response_within_the_limit_passes_through() {
        let service = DeadlineLayer::new(Duration::from_secs(5)).layer(service_after(Duration::from_secs(4)));
        let Ok(response) = service.oneshot(()).await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_over_the_limit_gets_503_at_the_limit() {
        let started = Instant::now();
        let service = DeadlineLayer::new(Duration::from_secs(5)).layer(service_after(Duration::from_secs(60)));
        let Ok(response) = service.oneshot(()).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
        assert!(std::str::from_utf8(&body).unwrap().contains("handler_timeout"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_s3_request_over_the_limit_gets_s3_xml_with_a_request_id() {
        let slow = tower::service_fn(|_: crate::http::Classified| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>(StatusCode::NO_CONTENT.into_response())
        });
        let request = http::Request::get("/bkt/k")
            .header(http::header::AUTHORIZATION, "AWS4-HMAC-SHA256 Credential=AKBGAAAAAAAAAAAAAAAA/…")
            .body(axum::body::Body::empty())
            .unwrap();
        let request = crate::http::Classified::new(request, None);
        let Ok(response) = DeadlineLayer::new(Duration::from_secs(5)).layer(slow).oneshot(request).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().contains_key("x-amz-request-id"));
        assert_eq!(response.headers()[http::header::CONTENT_TYPE], "application/xml");
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
        let body = std::str::from_utf8(&body).unwrap();
        assert!(body.contains("<Code>SlowDown</Code>") && body.contains("<Resource>/bkt/k</Resource>"), "{body}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_bound_read_over_the_limit_gets_503_at_the_limit_after_it_first_waits() {
        let started = Instant::now();
        let slow = async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>(StatusCode::NO_CONTENT.into_response())
        };
        let Ok(response) = bound(slow, Duration::from_secs(5)).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let Ok(quick) = bound(async { Ok::<_, Infallible>(StatusCode::OK.into_response()) }, Duration::ZERO).await;
        assert_eq!(quick.status(), StatusCode::OK, "a read that never waits is never late");
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_counts_from_the_call_not_the_first_poll() {
        let mut service = DeadlineLayer::new(Duration::from_secs(5)).layer(service_after(Duration::from_secs(3)));
        let started = Instant::now();
        let future = service.call(());
        // Called but not polled for 4 s: only 1 s of the limit is left, and the handler's own 3 s sleep (which
        // starts at its first poll) overruns it.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let Ok(response) = future.await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
