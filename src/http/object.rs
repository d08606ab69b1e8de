//! `GET`/`HEAD /{bucket}/{key}` on the data listener. The request pipeline, in order:
//!
//! 1. Parse the path (one percent-decode) into a bucket name and a key, or the bucket's root (`/{bucket}/`):
//!    400 on bad input. Look the bucket up (cached), and plan from its static-site settings which key the path
//!    reads (`website`: the key itself, or for a directory path its index document).
//! 2. Authorise the key the plan reads against the bucket *before* looking anything up, so an unauthorised
//!    caller learns nothing about which keys exist (`auth`).
//! 3. Look the object up (`catalog`: cached with its prepared headers and variants). Negotiate the content coding
//!    (`accept_encoding`): the selected variant brings its ETag, Repr-Digest and blob. A miss: the plan's
//!    fallbacks, each for a caller who may read the key it names (a 302 from `dir` to `./dir/` when that
//!    directory's index document exists, else the bucket's error document with 404), else 404.
//! 4. Evaluate preconditions (RFC 9110 §13.2.2): 412 or 304, with no file IO.
//! 5. Get the blob and the size that bounds its regions (`catalog::ResponseBlob`): from the data dir, open, with the
//!    `fstat` size of the fd that will be sent; from an object store's cache, the object row's size.
//! 6. Evaluate Range (RFC 9110 §14) for GET: 200, 206 (single or multipart) or 416. Open the blob for the regions
//!    (from an object store's cache: the first region's first slice fetched, the rest as the driver sends).
//! 7. Answer a `driver::FileAnswer` (status, fields, `FileBody`; the S3 path makes it a `Response` with the
//!    `FileBody` as an extension); the driver sends its regions with sendfile (an error document too: one whole
//!    region, with 404).

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderValue};
use http::{Method, StatusCode};

use super::accept_encoding;
use super::conditional::{self, Precondition, Validators};
use super::error::ApiError;
use super::multipart;
use super::range::{self, RangeDecision};
use super::throttling::{Admitted, Asker, admit_at_once};
use super::website::{self, Plan};
use super::{DataState, NativeRead};
use crate::access_log::Principal;
use crate::auth::{AuthError, Credentials};
use crate::catalog::representation::{NOSNIFF, ObjectEntry, REPR_DIGEST, disposition_value, private_cache_control};
use crate::catalog::{self, BlobError, BlobFile};
use crate::driver::{Answer, FileAnswer, RequestHead};
use crate::file_body::{DownloadKind, FileBody, Segment, Segments, SharedFields};
use crate::header_values::checksum;
use crate::header_values::fields::{self, Fields};
use crate::names::{BucketName, Website, parse_data_path};
use crate::store::{Bucket, CacheError};

/// The GET/HEAD pipeline with its refusals before authorisation (the outer `Err`: bad path, bad or missing
/// credentials, no access, a stale replica) kept apart from whatever follows authorisation (the inner result),
/// so that `cors` can leave the former bare: they must look alike whether the bucket exists or not.
pub async fn authorise_and_serve(app: &DataState, read: NativeRead<'_>) -> Result<Result<Answer, ApiError>, ApiError> {
    let NativeRead { head: RequestHead { method, fields, peer, .. }, path, query } = read;
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::MethodNotAllowed);
    }
    let (bucket_name, requested) = parse_data_path(path)?;
    let bucket = app.catalog.bucket(bucket_name.as_str()).await?;
    let plan = website::plan(requested, path, bucket.as_deref().map_or(&Website::NONE, |b| &b.website));
    let credentials = crate::auth::credentials(fields, query)?;
    let principal = app.log_principal.then(|| principal_of(&credentials));
    let asker = Asker::of(&credentials, *peer);
    let allowed = app.auth.read(&bucket_name, bucket.as_ref(), plan.authorised_key(), credentials).await?;
    let bucket = &allowed.bucket;
    // At once unless the limits changed since the last request: no state of its own in this future.
    let admitted = match admit_at_once(app, &asker, bucket_name.as_str()) {
        Ok(answer) => answer,
        Err(trip) => trip.await,
    };
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(refused) => return Ok(Err(refused)),
    };
    // The object the plan reads, served from here: each async layer a request passes through moves the state of
    // those below it once more, so the fallbacks, the rare path, are a boxed layer of their own.
    let found = match &plan.object {
        Some(key) => match app.catalog.object(bucket.id, key.as_str()).await {
            Ok(found) => found.map(|entry| (key, entry)),
            Err(e) => return Ok(Err(e.into())),
        },
        None => None,
    };
    if let Some((key, entry)) = found {
        let request = ObjectRequest {
            method,
            headers: fields,
            bucket,
            key,
            content_disposition: allowed.content_disposition.as_deref(),
            overrides: None,
            s3: false,
            part: false,
            principal,
            admitted,
            render: &IntoResponse::into_response,
        };
        return Ok(serve_entry(app, request, &entry).await);
    }
    let asked = Asked { headers: fields, query, name: &bucket_name };
    Ok(Box::pin(serve_fallbacks(app, &asked, &plan, bucket, principal)).await)
}

/// The answer to a native read refused before authorisation: the native JSON (`401` with the bearer challenge for
/// want of credentials), except that an AWS SDK's request refused for its credentials gets S3's `403
/// AccessDenied`, as it would virtual-hosted: the SDK (boto3 `UNSIGNED` path-style, say) reads S3's XML errors,
/// not a bearer challenge. Either way the refusal is the same for a private and an absent bucket.
pub fn refusal(refusal: ApiError, fields: &dyn Fields, path: &str) -> Response {
    if in_s3_words(&refusal, fields) {
        // Already counted as a refusal of credentials, by `From<AuthError>`.
        return super::s3::refuse_at(path, super::s3::S3Error::access_denied());
    }
    refusal.into_response()
}

/// Whether a native refusal is answered as S3 answers it: a refusal of credentials, to an AWS SDK.
fn in_s3_words(refusal: &ApiError, fields: &dyn Fields) -> bool {
    matches!(refusal, ApiError::Unauthorized(_)) && crate::s3::operation::from_aws_sdk(fields)
}

/// A native request as the steps after authorisation need it.
struct Asked<'a> {
    headers: &'a dyn Fields,
    query: Option<&'a str>,
    name: &'a BucketName,
}

/// A native GET/HEAD whose planned key is missing (or that plans none), authorised for that key: the plan's
/// fallbacks, else 404.
async fn serve_fallbacks(
    app: &DataState,
    asked: &Asked<'_>,
    plan: &Plan<'_>,
    bucket: &Arc<Bucket>,
    principal: Option<Principal>,
) -> Result<Answer, ApiError> {
    // A miss, told only to a caller who may read what the path reads. Each fallback names another key, which is
    // read only by a caller who may read that key too (a token's prefix, a signed URL's one key).
    if let Some(redirect) = plan.redirect() {
        if may_read(app, asked, bucket, redirect.index.as_str()).await?
            && app.catalog.object(bucket.id, redirect.index.as_str()).await?.is_some()
        {
            return Ok(with_principal(redirect_response(bucket, &redirect.location)?.into(), principal));
        }
    }
    if let Some(document) = plan.error_document {
        if may_read(app, asked, bucket, document.as_str()).await? {
            if let Some(entry) = app.catalog.object(bucket.id, document.as_str()).await? {
                return Ok(with_principal(error_document_response(app, bucket, &entry).await?, principal));
            }
        }
    }
    Ok(with_principal(ApiError::NotFound.into_response().into(), principal))
}

/// Whether the request's credentials may read `key` too, decided as for a GET of it. Only a failed lookup is an
/// error; any refusal is a plain no, never an answer of its own.
async fn may_read(app: &DataState, asked: &Asked<'_>, bucket: &Arc<Bucket>, key: &str) -> Result<bool, ApiError> {
    // The credentials were read once already (and moved into that authorisation): this path is the rare one.
    let Ok(credentials) = crate::auth::credentials(asked.headers, asked.query) else { return Ok(false) };
    match app.auth.read(asked.name, Some(bucket), key, credentials).await {
        Ok(_) => Ok(true),
        Err(AuthError::Lookup(e)) => Err(e.into()),
        Err(_) => Ok(false),
    }
}

static NO_CACHE: HeaderValue = HeaderValue::from_static("no-cache");
static PRIVATE_NO_CACHE: HeaderValue = HeaderValue::from_static("private, no-cache");

/// Cache-Control of a static-site 404 or redirect: it says that a key is missing, or elsewhere, until the next
/// upload, so a cache must ask again before reusing it (Varnish does not store it at all); a private bucket's
/// stays its requester's.
fn miss_cache_control(bucket: &Bucket) -> HeaderValue {
    if bucket.public { NO_CACHE.clone() } else { PRIVATE_NO_CACHE.clone() }
}

/// `302 Found` from a directory named without its `/` to the directory.
fn redirect_response(bucket: &Bucket, location: &str) -> Result<Response, ApiError> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::FOUND;
    let h = response.headers_mut();
    h.insert(header::LOCATION, header_value(location)?);
    h.insert(header::CACHE_CONTROL, miss_cache_control(bucket));
    super::cors::vary_on_origin(bucket, h);
    Ok(response)
}

/// The bucket's error document as the 404 of a missing key: its bytes (the stored ones, whatever the request's
/// Accept-Encoding) and its type, sent by sendfile like any object's. No ETag, Last-Modified or ranges: it does not
/// represent the key asked for, so it is never a 304 or a 206, and its own Cache-Control (often a year) is not the
/// answer's.
async fn error_document_response(app: &DataState, bucket: &Bucket, entry: &ObjectEntry) -> Result<Answer, ApiError> {
    let sha256 = entry.sha256();
    let blob = app.catalog.response_blob(sha256, entry.size).await.map_err(|e| blob_error(entry, sha256, e))?;
    let segments: Segments = smallvec::smallvec![Segment::Region { offset: 0, len: blob.size }];
    let BlobFile { file, size, fill } = blob.open_for(&segments).await.map_err(|e| blob_error(entry, sha256, e))?;
    let body = FileBody {
        file,
        file_size: size,
        segments,
        kind: DownloadKind::ErrorDocument,
        object: entry.object_ref.clone(),
        encoding: "identity",
        shared_fields: None,
        fill,
        held: None,
        pace: None,
        share: None,
    };
    let mut h = http::HeaderMap::new();
    let content_type = HeaderValue::from_str(entry.content_type());
    h.insert(header::CONTENT_TYPE, content_type.unwrap_or(HeaderValue::from_static("application/octet-stream")));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, NOSNIFF.clone());
    h.insert(header::CACHE_CONTROL, miss_cache_control(bucket));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.total_len()));
    super::cors::vary_on_origin(bucket, &mut h);
    Ok(Answer::File(FileAnswer { status: StatusCode::NOT_FOUND, headers: h, body, principal: None }))
}

/// An authorised GET/HEAD of one object: what the native and the S3 routes share from step 3 on.
pub(super) struct ObjectRequest<'a> {
    pub method: &'a Method,
    pub headers: &'a dyn Fields,
    pub bucket: &'a std::sync::Arc<crate::store::Bucket>,
    pub key: &'a crate::names::ObjectKey,
    /// A `response-content-disposition` that a valid signature covered.
    pub content_disposition: Option<&'a str>,
    /// S3's `response-*` overrides of a presigned request (already validated header values).
    pub overrides: Option<&'a ResponseOverrides>,
    /// An S3 GetObject/HeadObject: the object's S3 ETag (what PutObject and Complete answered, and what listings
    /// show) in the response and in preconditions, and the stored bytes only (S3 negotiates no content coding,
    /// so the ETag, the listed size and the bytes sent always describe one representation).
    pub s3: bool,
    /// An S3 `partNumber` request, whose part is asked for as a `Range`: a HEAD answers as the part's GET would
    /// (S3's `206` with the part's length), where RFC 9110 has HEAD ignore Range.
    pub part: bool,
    pub principal: Option<Principal>,
    /// What limits gave the request: places among the requests in progress, held until the body is sent, and the
    /// pace of its bytes.
    pub admitted: Admitted,
    /// How a refusal after authorisation (404, 412, 416) is written: JSON natively, XML for S3.
    pub render: &'a (dyn Fn(ApiError) -> Response + Sync),
}

static CHECKSUM_MODE: fields::FieldName =
    fields::FieldName::other(header::HeaderName::from_static("x-amz-checksum-mode"));

/// Whether an S3 GetObject or HeadObject answers the object's checksums: asked for (`x-amz-checksum-mode:
/// ENABLED`), and for the whole object (not a part, nor a GET of a range, whose bytes they do not describe).
fn answers_checksums(method: &Method, headers: &dyn Fields, part: bool) -> bool {
    let enabled = headers.get(&CHECKSUM_MODE).is_some_and(|v| v.eq_ignore_ascii_case(b"ENABLED"));
    enabled && !part && !(*method == Method::GET && headers.contains(&fields::RANGE))
}

/// Response headers a presigned S3 request replaces (`response-content-type` and friends).
#[derive(Debug, Default, Clone)]
pub struct ResponseOverrides {
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
}

/// Steps 3 to 7 of the pipeline, for a request that is authorised.
pub(super) async fn serve_object(app: &DataState, request: ObjectRequest<'_>) -> Result<Response, ApiError> {
    Ok(serve_found(app, request).await?.into_response())
}

/// Steps 3 to 7, or the renderer's 404.
async fn serve_found(app: &DataState, request: ObjectRequest<'_>) -> Result<Answer, ApiError> {
    // From here on the requester is known, so refusals are logged with who asked.
    match app.catalog.object(request.bucket.id, request.key.as_str()).await? {
        Some(entry) => serve_entry(app, request, &entry).await,
        None => Ok(with_principal((request.render)(ApiError::NotFound).into(), request.principal)),
    }
}

/// Steps 3 (the representation) to 7, for an object that was found.
async fn serve_entry(app: &DataState, request: ObjectRequest<'_>, entry: &ObjectEntry) -> Result<Answer, ApiError> {
    let ObjectRequest {
        method,
        headers,
        bucket,
        key: _,
        content_disposition,
        overrides,
        s3,
        part,
        principal,
        admitted,
        render,
    } = request;
    let method = method.clone();
    let grant_bucket = bucket;

    // The catalog's prepared fields for this bucket's responses, shared with every other response until this
    // request changes one (then copied once): a plain download copies no header.
    let prepared = entry.fields(grant_bucket.public, s3);
    let mut representation = Representation::Shared(prepared);
    if grant_bucket.cors.is_some() {
        super::cors::vary_on_origin(grant_bucket, representation.to_mut());
    }
    // The selected representation: the object itself, or a precompressed variant with its own ETag and digest.
    let negotiates = !s3 && entry.available().any();
    let variant = if negotiates { entry.variant(accept_encoding::negotiate(headers, entry.available())) } else { None };
    if negotiates {
        crate::header_values::add_vary(representation.to_mut(), "Accept-Encoding");
    }
    if let Some(v) = variant {
        let fields = representation.to_mut();
        fields.insert(header::ETAG, v.etag_value.clone());
        fields.insert(header::CONTENT_ENCODING, v.content_encoding.clone());
        match &v.repr_digest {
            Some(digest) => fields.insert(&REPR_DIGEST, digest.clone()),
            None => fields.remove(&REPR_DIGEST),
        };
    }
    // Errors from here on answer for the selected representation too: a cache must key them by Accept-Encoding.
    let vary = |e: ApiError| -> Answer {
        let mut response = render(e);
        // In the order the object's own answers list them, so a cache sees one `Vary` value per object.
        super::cors::vary_on_origin(grant_bucket, response.headers_mut());
        if negotiates {
            crate::header_values::add_vary(response.headers_mut(), "Accept-Encoding");
        }
        with_principal(response.into(), principal.clone())
    };
    // A signed URL may choose the download name; the signature covered it, so it is the signer's choice. It is a
    // non-empty RFC 6266 value (`presign::parse_query`), so it replaces the stored header and never removes it.
    if let Some(v) = content_disposition.and_then(|v| disposition_value(v, entry.key())) {
        representation.to_mut().insert(header::CONTENT_DISPOSITION, v);
    }
    // S3's presigned `response-*` overrides: also the signer's choice, applied as S3 does (non-empty values only).
    // A private bucket's Cache-Control keeps `private` whoever signed: a shared cache would otherwise serve the
    // response to others, after the key is revoked too.
    let mut content_type_override = None;
    for (name, value) in overrides.map_or(&[][..], |o| &o.headers[..]) {
        if name == header::CONTENT_TYPE {
            content_type_override = Some(value.clone());
        } else if name == header::CACHE_CONTROL && !grant_bucket.public {
            representation.to_mut().insert(header::CACHE_CONTROL, private_cache_control(value.to_str().ok()));
        } else {
            representation.to_mut().insert(name.clone(), value.clone());
        }
    }
    // RFC 9110 §13.1.2: If-None-Match compares with the selected representation's ETag, so another variant's tag
    // does not match (a 200 with this one, whose tag the client then caches).
    // The entry's own ETag is made from its digest, so only for a request that has a precondition.
    let precondition = match conditional::has_any(headers) {
        true => {
            let own = variant.is_none().then(|| if s3 { entry.s3_etag() } else { entry.etag() });
            let etag = variant.map_or_else(|| own.as_deref().unwrap_or_default(), |v| v.etag.as_str());
            let validators = Validators { etag, last_modified: entry.last_modified() };
            conditional::evaluate(&method, headers, &validators, SystemTime::now())
        }
        false => Precondition::Proceed { honor_range: true },
    };
    let honor_range = match precondition {
        Precondition::Failed => return Ok(vary(ApiError::PreconditionFailed)),
        Precondition::NotModified => {
            // RFC 9110 §15.4.5: a 304 carries no content, so no content headers. The object reference goes along
            // as an extension so the driver can count the 304 for this object.
            let mut fields = representation.into_owned();
            fields.remove(header::CONTENT_TYPE);
            fields.remove(header::CONTENT_DISPOSITION);
            fields.remove(&REPR_DIGEST);
            let mut response = (StatusCode::NOT_MODIFIED, fields).into_response();
            response.extensions_mut().insert(entry.object_ref.clone());
            return Ok(with_principal(response.into(), principal));
        }
        Precondition::Proceed { honor_range } => honor_range,
    };
    // After the 304: an SDK would check an empty body against them.
    if s3 && answers_checksums(&method, headers, part) {
        let checksums = checksum::answered(entry.checksum(), entry.sha256());
        super::s3::insert_checksum_headers(representation.to_mut(), &checksums);
    }

    let sha256 = variant.map_or(entry.sha256(), |v| v.sha256.as_str());
    // The blob's size bounds every region: its fstat size from the data dir, its row's from an object store's cache
    // (which then fetches only the slices the regions need).
    let row_size = variant.map_or(entry.size, |v| v.size);
    let blob = app.catalog.response_blob(sha256, row_size).await.map_err(|e| blob_error(entry, sha256, e))?;
    let size = blob.size;
    // RFC 9110 §14.2: Range is defined for GET only; HEAD answers what a plain GET would (an S3 part's HEAD: what
    // the part's GET would).
    let ranged = method == Method::GET || part;
    let mut ranges = headers.values(&fields::RANGE);
    let range_header = match (honor_range && ranged, ranges.next(), ranges.next()) {
        (true, Some(range), None) => Some(range),
        // Several Range fields cannot be combined meaningfully: ignore them all.
        _ => None,
    };
    // The prepared fields carry the object's Content-Type; a signed override or a multipart body replaces it.
    let mut content_type = content_type_override;
    let mut content_range = None;
    let mut decision = range::evaluate(range_header, size, &app.range_policy);
    // Several ranges of a variant would be a multipart body whose top-level Content-Encoding claims the multipart
    // itself is encoded; RFC 9110 §14.2 lets a server ignore Range, so such a request gets the whole variant.
    if variant.is_some() && matches!(&decision, RangeDecision::Partial(ranges) if ranges.len() > 1) {
        decision = RangeDecision::Full;
    }
    let (status, kind, segments) = match decision {
        RangeDecision::Full => {
            (StatusCode::OK, DownloadKind::Full, smallvec::smallvec![Segment::Region { offset: 0, len: size }])
        }
        RangeDecision::Unsatisfiable => return Ok(vary(ApiError::RangeNotSatisfiable { size })),
        RangeDecision::Partial(ranges) if ranges.len() == 1 => {
            let r = ranges[0];
            content_range = Some(header_value(&format!("bytes {}-{}/{size}", r.start, r.last()))?);
            (
                StatusCode::PARTIAL_CONTENT,
                DownloadKind::Range,
                smallvec::smallvec![Segment::Region { offset: r.start, len: r.len() }],
            )
        }
        RangeDecision::Partial(ranges) => {
            let boundary = multipart::new_boundary();
            let segments = multipart::layout(&ranges, size, entry.content_type(), &boundary);
            content_type = Some(header_value(&format!("multipart/byteranges; boundary={boundary}"))?);
            (StatusCode::PARTIAL_CONTENT, DownloadKind::Multipart, segments)
        }
    };
    // A HEAD sends no body, so fetches nothing.
    let sent = if method == Method::HEAD { &[][..] } else { &segments[..] };
    // A data-dir blob is open already: no future polled for it. The blob's name again, not `sha256`: a local used
    // after the await would take room in the future.
    let opened = match catalog::at_once(blob.open_for(sent)) {
        Ok(opened) => opened,
        Err(fetch) => fetch.await,
    };
    let BlobFile { file, size, fill } = opened.map_err(|e| blob_error(entry, sha256, e))?;
    let object_bytes = sent.iter().map(|s| if let Segment::Region { len, .. } = s { *len } else { 0 }).sum();
    let (held, pace) = admitted.for_body(object_bytes);
    let body = FileBody {
        file,
        file_size: size,
        segments,
        kind,
        object: entry.object_ref.clone(),
        encoding: variant.map_or("identity", |v| v.coding.token()),
        shared_fields: matches!(representation, Representation::Shared(_)).then(|| prepared.clone()),
        fill,
        held,
        pace,
        share: admitted.share,
    };

    // With shared fields a whole object's response has no fields of its own: the driver writes Content-Length.
    let mut headers = match representation {
        Representation::Own(fields) => fields,
        Representation::Shared(_) => http::HeaderMap::new(),
    };
    if let Some(v) = content_type {
        headers.insert(header::CONTENT_TYPE, v);
    }
    if let Some(v) = content_range {
        headers.insert(header::CONTENT_RANGE, v);
    }
    Ok(Answer::File(FileAnswer { status, headers, body, principal }))
}

/// A response's representation fields: the entry's prepared ones as they are, until the request changes one, then
/// a map of its own (made once, from them).
enum Representation<'a> {
    Shared(&'a SharedFields),
    Own(http::HeaderMap),
}

impl Representation<'_> {
    fn to_mut(&mut self) -> &mut http::HeaderMap {
        if let Representation::Shared(shared) = self {
            *self = Representation::Own(shared.to_header_map());
        }
        match self {
            Representation::Own(fields) => fields,
            Representation::Shared(_) => unreachable!("made its own above"),
        }
    }

    fn into_owned(self) -> http::HeaderMap {
        match self {
            Representation::Shared(shared) => shared.to_header_map(),
            Representation::Own(fields) => fields,
        }
    }
}

/// Why the blob `sha256` of `entry` (the object or one of its variants) cannot be sent: a missing or unreadable file
/// is a server error (counted); the object store's own errors answer as they map (503 while it cannot give it).
fn blob_error(entry: &ObjectEntry, sha256: &str, e: BlobError) -> ApiError {
    if let BlobError::Cache(CacheError::Remote(e)) = e {
        return e.into();
    }
    crate::metrics::blob_open_error();
    let object = format!(
        "blob missing or unreadable: bucket_id={} key={} sha256={sha256}",
        entry.object_ref.bucket_id,
        entry.key()
    );
    ApiError::BlobUnavailable(anyhow::Error::new(e).context(object))
}

/// Attaches the access log's principal (when the log is on) to an answer.
fn with_principal(mut answer: Answer, principal: Option<Principal>) -> Answer {
    answer.set_principal(principal);
    answer
}

/// The access log's principal for `credentials` once they have been accepted.
fn principal_of(credentials: &Credentials) -> Principal {
    match credentials {
        Credentials::Anonymous => Principal::Public,
        Credentials::Bearer(token) => Principal::Token(crate::auth::token::token_id(token).unwrap_or("?").into()),
        Credentials::Presigned(params) => Principal::Presigned(params.key_id.as_str().into()),
    }
}

fn header_value(v: &str) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(v).map_err(|_| ApiError::Internal(anyhow::anyhow!("unrepresentable header value {v:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[(&'static str, &'static str)]) -> http::HeaderMap {
        fields.iter().map(|(n, v)| (header::HeaderName::from_static(n), HeaderValue::from_static(v))).collect()
    }

    #[test]
    fn an_aws_sdk_refused_for_its_credentials_is_answered_in_s3_words() {
        let sdk = headers(&[("amz-sdk-invocation-id", "0b8a3f7e"), ("amz-sdk-request", "attempt=1; max=1")]);
        let curl = headers(&[("user-agent", "curl/8.5.0")]);
        let unauthorized = || ApiError::Unauthorized("credentials required");
        assert!(in_s3_words(&unauthorized(), &sdk));
        assert!(!in_s3_words(&unauthorized(), &curl), "curl and browsers keep the native 401");
        // Only a refusal of credentials: the rest keeps its native answer (as a bad path does for curl).
        for other in
            [ApiError::Forbidden, ApiError::MethodNotAllowed, ApiError::NotFound, ApiError::DatabaseUnavailable]
        {
            assert!(!in_s3_words(&other, &sdk), "{other:?}");
        }

        let s3 = refusal(unauthorized(), &sdk, "/priv/a%20b");
        assert_eq!(s3.status(), StatusCode::FORBIDDEN);
        assert_eq!(s3.headers()[header::CONTENT_TYPE], "application/xml");
        assert!(s3.headers().contains_key(&super::super::s3::AMZ_REQUEST_ID));
        assert!(!s3.headers().contains_key(header::WWW_AUTHENTICATE));
        let body =
            futures_util::FutureExt::now_or_never(axum::body::to_bytes(s3.into_body(), 1 << 16)).unwrap().unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            body.contains("<Code>AccessDenied</Code><Message>Access Denied</Message><Resource>/priv/a%20b</Resource>"),
            "{body}"
        );

        let native = refusal(unauthorized(), &curl, "/priv/a%20b");
        assert_eq!(native.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(native.headers()[header::WWW_AUTHENTICATE], "Bearer realm=\"blobgate\"");
    }
}
