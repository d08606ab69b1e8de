//! S3 writes and the multipart listings, on either listener (the data listener unless `listen_read_only`),
//! dispatched on the operation `s3::operation::classify` decided:
//! PutObject, DeleteObject, DeleteObjects (`POST /{bucket}?delete`), multipart uploads (`POST ?uploads`,
//! `PUT ?partNumber=&uploadId=`, `POST ?uploadId=`, `DELETE ?uploadId=`, `GET /{bucket}?uploads`,
//! `GET ?uploadId=`) over the store's multipart layer, PutObjectTagging and DeleteObjectTagging (`PUT`/`DELETE
//! ?tagging`), and server-side copies (a PUT with `x-amz-copy-source`:
//! CopyObject, or UploadPartCopy with `uploadId`) over `store::server_copy`. A copy's source is authorised for
//! reading by the same signed request before it is looked up.
//!
//! Every write is authorised (`Authorizer::s3` with `Access::Write`, from the headers alone) before its body is
//! read. Object and part bodies stream to disk through `upload::stage_body`, with the native uploads' admission,
//! `body_idle`, minimum rate and batching; on the way they are decoded ([`S3Body`]: aws-chunked with or without
//! chunk signatures, `x-amz-decoded-content-length`) and checked (a hex `x-amz-content-sha256`, `Content-MD5`,
//! `x-amz-checksum-*` as header or trailer). A body that does not verify is refused before anything commits, and
//! its staged file is removed. The small XML bodies of Complete and DeleteObjects are read into memory, bounded.

mod body;
mod bucket;
mod copy;
mod delete;
mod headers;
mod multipart;
mod tagging;

use body::{S3Body, declared_digests, put_object, upload_part};
use bucket::{bucket_cors, create_bucket, delete_bucket};
use copy::{copy_object, upload_part_copy};
use delete::delete_objects;
use headers::{object_attrs, request_tags};
use multipart::{complete, list_parts, list_uploads};
use tagging::object_tagging;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};

use crate::http::throttling::{Asker, admit, paced_body};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};

use super::AdminState;
use super::conditional::{Precondition, Validators, evaluate};
use super::error::ApiError;
use super::s3::{AMZ_REQUEST_ID, S3Context, S3Error, not_implemented, with_principal, xml_response};
use super::upload::{BodyFilter, PacedBody, stage_body};
use crate::access_log::Principal;
use crate::auth::sigv4::checksum::{Checksum, ChecksumAlgorithm, ChecksumType, Checksummer, ObjectChecksum};
use crate::auth::sigv4::chunked::{ChunkedDecoder, header_checksum};
use crate::auth::sigv4::{PayloadHash, RequestParts, SigV4Error, check_payload_sha256};
use crate::auth::{Access, AllowedS3Request, S3Target};
use crate::header_values::upload_digest::DeclaredDigests;
use crate::names::{BucketName, MAX_USER_METADATA_BYTES, ObjectKey, Tags, parse_attrs};
use crate::s3::listing::{self, Entry, Fetch, ListQuery, Start, UploadMarker};
use crate::s3::operation::{COPY_SOURCE, Operation, Resource, S3Call};
use crate::s3::request::{
    DeleteTarget, ListPartsParams, ListUploadsParams, MAX_COMPLETE_BODY, MAX_DELETE_BODY, MAX_TAGGING_BODY,
    RequestError, parse_complete_multipart_upload, parse_copy_source, parse_copy_source_range, parse_delete,
    parse_if_match, parse_metadata_directive, parse_tagging, parse_tagging_directive, parse_tagging_header,
};
use crate::s3::xml::{self, CopyResult, DeleteOutcome, ListedPart, ListedUpload, Owner, PartsPage, UploadsPage};
use crate::store::multipart::{Completion, MultipartError, UploadLimits};
use crate::store::server_copy::{CopiedAttrs, CopyOutcome, Directive, ObjectName};
use crate::store::{ObjectRecord, StagedBlob, WriteCondition};

/// Serves one S3 write (or multipart listing) on the admin listener.
pub async fn serve(app: AdminState, call: S3Call, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let ctx = S3Context::new(parts.uri.path());
    let operation = call.operation;
    let mut principal = None;
    let mut response = match route(&app, call, &parts, body, &mut principal).await {
        Ok(response) => response,
        Err(e) => e.render(&ctx),
    };
    // A request refused after its signature verified (a `BadDigest` body) still names its key in the access log.
    if let Some(principal) = principal
        && response.extensions().get::<Principal>().is_none()
    {
        response.extensions_mut().insert(principal);
    }
    if matches!(operation, Operation::PutObject | Operation::UploadPart) {
        let stored = response.extensions_mut().remove::<StoredBytes>().map_or(0, |StoredBytes(n)| n);
        crate::metrics::upload_finished(crate::metrics::UploadApi::S3, response.status(), stored);
    }
    response.headers_mut().insert(AMZ_REQUEST_ID.clone(), ctx.request_id.clone());
    response
}

/// Object bytes a PutObject or UploadPart stored, handed to [`serve`] for `blobgate_uploads_total`.
#[derive(Debug, Clone, Copy)]
struct StoredBytes(u64);

fn stored(mut response: Response, bytes: u64) -> Response {
    response.extensions_mut().insert(StoredBytes(bytes));
    response
}

fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

/// `principal` is set once the request is authorised, for the access log of whatever answer follows.
async fn route(
    app: &AdminState,
    call: S3Call,
    parts: &http::request::Parts,
    body: Body,
    principal: &mut Option<Principal>,
) -> Result<Response, S3Error> {
    use Operation as Op;
    let request = RequestParts {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: &parts.headers,
    };
    let query = query_pairs(parts.uri.query());
    let param = |name: &str| query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let operation = call.operation;
    match call.resource {
        Resource::Service => Err(ApiError::MethodNotAllowed.into()),
        Resource::Bucket(name) if operation == Op::CreateBucket => create_bucket(app, &request, &name).await,
        Resource::Bucket(name) if operation == Op::DeleteBucket => delete_bucket(app, &request, &name).await,
        Resource::Bucket(name) if matches!(operation, Op::PutBucketCors | Op::DeleteBucketCors) => {
            bucket_cors(app, &request, &name, operation, body).await
        }
        Resource::Bucket(name) => {
            let bucket = app.data.catalog.bucket(name.as_str()).await?;
            let allowed = app.data.auth.s3(&request, S3Target::Bucket(bucket.as_ref()), Access::Write).await?;
            *principal = app.data.log_principal.then(|| Principal::S3(allowed.key.id.as_str().into()));
            let _held = admit(&app.data, &Asker::S3Key(&allowed.key.id), name.as_str()).await?;
            let bucket_id = bucket.ok_or(crate::auth::AuthError::NoSuchBucket)?.id;
            refuse_unsupported(operation, &parts.headers)?;
            let response = match operation {
                Op::DeleteObjects => delete_objects(app, (&name, bucket_id), &allowed, &parts.headers, body).await?,
                Op::ListMultipartUploads => {
                    list_uploads(app, (&name, bucket_id), &allowed, request.query.unwrap_or("")).await?
                }
                _ => return Err(not_implemented(format_args!("{operation:?} on a bucket"))),
            };
            Ok(with_principal(&app.data, response, &allowed))
        }
        Resource::Object(name, key) => {
            let bucket = app.data.catalog.bucket(name.as_str()).await?;
            let allowed = app.data.auth.s3(&request, S3Target::Object(bucket.as_ref(), &key), Access::Write).await?;
            *principal = app.data.log_principal.then(|| Principal::S3(allowed.key.id.as_str().into()));
            // Held until the write ends: a concurrency limit counts uploads in progress too.
            let admitted = admit(&app.data, &Asker::S3Key(&allowed.key.id), name.as_str()).await?;
            let body = paced_body(body, admitted.write_pace.clone());
            bucket.ok_or(crate::auth::AuthError::NoSuchBucket)?;
            refuse_unsupported(operation, &parts.headers)?;
            if matches!(operation, Op::PutObject | Op::UploadPart) {
                ApiError::require_length(&parts.headers)?;
            }
            let upload_id = || param("uploadId").unwrap_or("");
            let part_number = || {
                param("partNumber").and_then(|n| n.parse::<u32>().ok()).ok_or_else(|| {
                    S3Error::new(StatusCode::BAD_REQUEST, "InvalidArgument", "partNumber must be 1 to 10000")
                })
            };
            let target = ObjectName { bucket: &name, key: &key };
            let response = match operation {
                Op::PutObjectTagging | Op::DeleteObjectTagging => {
                    object_tagging(app, target, &parts.method, param("uploadId"), &allowed, &parts.headers, body)
                        .await?
                }
                Op::CopyObject => copy_object(app, target, &allowed, &parts.headers, body).await?,
                Op::PutObject => put_object(app, &name, &key, &allowed, &parts.headers, body).await?,
                Op::UploadPartCopy => {
                    upload_part_copy(app, target, upload_id(), part_number()?, &allowed, &parts.headers, body).await?
                }
                Op::UploadPart => {
                    upload_part(app, &name, &key, upload_id(), part_number()?, &allowed, &parts.headers, body).await?
                }
                Op::DeleteObject => {
                    let condition = write_condition(&parts.headers)?;
                    app.store.delete_if(&name, &key, &condition).await.map_err(ApiError::from)?;
                    StatusCode::NO_CONTENT.into_response()
                }
                Op::AbortMultipartUpload => {
                    app.store.abort_upload(&name, &key, upload_id()).await?;
                    StatusCode::NO_CONTENT.into_response()
                }
                Op::CreateMultipartUpload => {
                    let attrs = object_attrs(&parts.headers)?;
                    // The key that starts an upload is the one its parts count for (limits' per-key cap).
                    let created_by = Some(allowed.key.id.as_str());
                    let checksum = upload_checksum(&parts.headers)?;
                    let upload = app.store.create_upload(&name, &key, attrs, created_by, checksum).await?;
                    let mut response =
                        xml_response(xml::initiate_multipart_upload(name.as_str(), key.as_str(), &upload.id));
                    if let Some((algorithm, kind)) = checksum {
                        let headers = response.headers_mut();
                        headers.insert(CHECKSUM_ALGORITHM, HeaderValue::from_static(algorithm.name()));
                        headers.insert(CHECKSUM_TYPE, HeaderValue::from_static(kind.name()));
                    }
                    response
                }
                Op::CompleteMultipartUpload => {
                    complete(app, &name, &key, upload_id(), &allowed, &parts.headers, body).await?
                }
                Op::ListParts => list_parts(app, &name, &key, upload_id(), request.query.unwrap_or("")).await?,
                _ => return Err(ApiError::MethodNotAllowed.into()),
            };
            Ok(with_principal(&app.data, response, &allowed))
        }
    }
}

/// Request headers asking for what we do not do: server-side encryption (SSE-S3, SSE-KMS, SSE-C, of the object
/// or of a copy's source), object lock, and delete conditions on size or time. Accepting them would store plaintext
/// while the client believes it is encrypted or locked, or delete what the client meant to keep.
const UNSUPPORTED_HEADER_PREFIXES: &[&str] = &[
    "x-amz-server-side-encryption",
    "x-amz-copy-source-server-side-encryption",
    "x-amz-object-lock-",
    // Conditional deletes by size or time (S3 directory buckets): ignoring them would delete unconditionally.
    "x-amz-if-match-",
];
/// S3 user metadata fields: `x-amz-meta-<name>`.
const USER_METADATA_PREFIX: &str = "x-amz-meta-";
/// The headers that go with CopyObject's and UploadPartCopy's source (`s3::operation::COPY_SOURCE`).
const COPY_SOURCE_RANGE: &str = "x-amz-copy-source-range";
const METADATA_DIRECTIVE: &str = "x-amz-metadata-directive";
/// An object's tags as a URL query (PutObject, CreateMultipartUpload, a copy that replaces them).
const TAGGING: &str = "x-amz-tagging";
const TAGGING_DIRECTIVE: &str = "x-amz-tagging-directive";
/// The copy source's preconditions, and the RFC 9110 fields they mean for the source.
const COPY_SOURCE_PRECONDITIONS: [(&str, header::HeaderName); 4] = [
    ("x-amz-copy-source-if-match", header::IF_MATCH),
    ("x-amz-copy-source-if-none-match", header::IF_NONE_MATCH),
    ("x-amz-copy-source-if-modified-since", header::IF_MODIFIED_SINCE),
    ("x-amz-copy-source-if-unmodified-since", header::IF_UNMODIFIED_SINCE),
];

/// Refuses, after authorisation and before any body is read or anything stored or deleted, a write that asks for
/// what we do not implement (see the constants above; unknown subresources were refused by `classify`),
/// conditional writes (`If-Match` / `If-None-Match`) other than S3's, and a `Content-Encoding` besides
/// `aws-chunked` (objects store no content coding): S3's `NotImplemented` (501).
fn refuse_unsupported(operation: Operation, headers: &HeaderMap) -> Result<(), S3Error> {
    use Operation as Op;
    if matches!(operation, Op::ListMultipartUploads | Op::ListParts) {
        return Ok(());
    }
    for name in headers.keys() {
        let name = name.as_str();
        if UNSUPPORTED_HEADER_PREFIXES.iter().any(|p| name.starts_with(p)) {
            return Err(not_implemented(name));
        }
        // A copy is CopyObject or UploadPartCopy; S3 has no copy by POST or DELETE.
        if name == COPY_SOURCE && !matches!(operation, Op::CopyObject | Op::UploadPartCopy) {
            return Err(not_implemented(format!("{name} on {operation:?}")));
        }
    }
    // Conditional writes are PutObject's and CompleteMultipartUpload's (`write_condition`), and conditional
    // deletes DeleteObject's (`If-Match` only), as in S3.
    for name in [header::IF_MATCH, header::IF_NONE_MATCH] {
        let allowed = matches!(operation, Op::PutObject | Op::CompleteMultipartUpload)
            || (operation == Op::DeleteObject && name == header::IF_MATCH);
        if headers.contains_key(&name) && !allowed {
            return Err(not_implemented(format!("{name} on this request (conditional writes)")));
        }
    }
    if let Some(coding) = crate::auth::sigv4::chunked::stored_content_encoding(headers) {
        return Err(not_implemented(format!("Content-Encoding: {coding}")));
    }
    Ok(())
}

/// A PutObject's or CompleteMultipartUpload's precondition on the object it would replace: `If-None-Match: *`
/// (only `*`, as in S3) or `If-Match: "<etag>"` (one ETag, or `*`), not both.
fn write_condition(headers: &HeaderMap) -> Result<WriteCondition, S3Error> {
    use super::conditional::WriteConditionError as E;
    super::conditional::write_condition(headers).map_err(|e| match e {
        E::SeveralValues(_) | E::IfNoneMatchTag => not_implemented(e),
        E::NotAscii(_) | E::Both | E::NotAnEntityTag(_) => bad_request(e.to_string()),
    })
}

fn bad_request(message: String) -> S3Error {
    S3Error::new(StatusCode::BAD_REQUEST, "InvalidArgument", message)
}

/// A multipart refusal of a part (UploadPart, UploadPartCopy): a refusal by a limit is counted, by limit.
fn part_error(e: MultipartError) -> S3Error {
    if let Some(limit) = e.refusing_limit() {
        crate::metrics::multipart_part_refused(limit);
    }
    S3Error::from(e)
}

/// A part number S3 accepts (1 to 10,000), checked before a part's body or source is read.
fn check_part_number(part_number: u32) -> Result<(), S3Error> {
    if !(1..=crate::store::multipart::MAX_PART_NUMBER).contains(&part_number) {
        return Err(S3Error::from(MultipartError::InvalidPartNumber(part_number)));
    }
    Ok(())
}

/// S3's echo of a stored checksum: `x-amz-checksum-<algorithm>` and `x-amz-checksum-type`.
fn with_checksum(mut response: Response, checksum: Option<&ObjectChecksum>) -> Response {
    if let Some(c) = checksum {
        super::s3::insert_checksum_headers(response.headers_mut(), std::slice::from_ref(c));
    }
    response
}

/// CreateMultipartUpload's `x-amz-checksum-algorithm` and `x-amz-checksum-type`, checked as S3 checks them (a type
/// needs an algorithm, and the pair must be one S3 makes: `InvalidRequest`).
fn upload_checksum(headers: &HeaderMap) -> Result<Option<(ChecksumAlgorithm, ChecksumType)>, S3Error> {
    let invalid = |message: String| S3Error::new(StatusCode::BAD_REQUEST, "InvalidRequest", message);
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or_default().trim().to_owned());
    let algorithm = match text(CHECKSUM_ALGORITHM) {
        None => None,
        Some(name) => Some(
            ChecksumAlgorithm::from_name(&name)
                .ok_or_else(|| invalid(format!("Value for {CHECKSUM_ALGORITHM} header is invalid: {name:?}")))?,
        ),
    };
    let kind = match text(CHECKSUM_TYPE) {
        None => None,
        Some(name) => Some(
            ChecksumType::from_name(&name)
                .ok_or_else(|| invalid(format!("Value for {CHECKSUM_TYPE} header is invalid: {name:?}")))?,
        ),
    };
    match (algorithm, kind) {
        (None, None) => Ok(None),
        (None, Some(_)) => {
            Err(invalid(format!("The {CHECKSUM_TYPE} header can only be used with the {CHECKSUM_ALGORITHM} header.")))
        }
        (Some(algorithm), kind) => {
            let kind = kind.unwrap_or(ChecksumType::default_for(algorithm));
            if !kind.allowed_with(algorithm) {
                return Err(invalid(format!(
                    "The {} checksum type cannot be used with the {} checksum algorithm.",
                    kind.name().to_lowercase(),
                    algorithm.name().to_lowercase()
                )));
            }
            Ok(Some((algorithm, kind)))
        }
    }
}

/// CreateMultipartUpload's checksum request headers, echoed in its answer.
const CHECKSUM_ALGORITHM: &str = "x-amz-checksum-algorithm";
const CHECKSUM_TYPE: &str = "x-amz-checksum-type";

fn with_etag(mut response: Response, etag: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

/// A small XML request body (Complete, Delete), read into memory up to `limit` bytes, decoded and checked like
/// an object body, and paced like one (`timeouts.body_idle`, `limits.min_upload_rate`: `RequestTimeout`).
async fn small_body(
    app: &AdminState,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Vec<u8>, S3Error> {
    let too_large = || S3Error::from(RequestError::TooLarge { limit });
    let mut filter = S3Body::for_request(allowed, headers)?;
    let mut body = PacedBody::new(app, body);
    let (mut received, mut decoded, mut pieces) = (0usize, Vec::new(), Vec::new());
    while let Some(chunk) = body.next_by(body.deadline()).await? {
        received += chunk.len();
        if received > limit.saturating_add(64 << 10) {
            return Err(too_large());
        }
        filter.data(chunk, &mut pieces)?;
        for piece in pieces.drain(..) {
            decoded.extend_from_slice(&piece);
        }
        if decoded.len() > limit {
            return Err(too_large());
        }
    }
    filter.end()?;
    if let PayloadHash::Sha256(signed) = allowed.verified.payload {
        let received: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(&decoded).into();
        check_payload_sha256(&signed, &received)?;
    }
    let declared = declared_digests(headers)?;
    if !declared.is_empty() {
        let md5 = hex::encode(<md5::Md5 as md5::Digest>::digest(&decoded));
        let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&decoded));
        declared.check(Some(&md5), &sha256)?;
    }
    Ok(decoded)
}
