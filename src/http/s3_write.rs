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

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};

use super::AdminState;
use super::conditional::{Precondition, Validators, evaluate};
use super::error::ApiError;
use super::s3::{AMZ_REQUEST_ID, S3Context, S3Error, not_implemented, with_principal, xml_response};
use super::upload::{BodyFilter, PacedBody, stage_body};
use crate::auth::sigv4::checksum::{Checksum, Checksummer};
use crate::auth::sigv4::chunked::{ChunkedDecoder, header_checksum};
use crate::auth::sigv4::{PayloadHash, RequestParts, SigV4Error, check_payload_sha256};
use crate::auth::{Access, AllowedS3Request, S3Target};
use crate::header_values::upload_digest::{DeclaredDigests, DigestError};
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
    let mut response = match route(&app, call, &parts, body).await {
        Ok(response) => response,
        Err(e) => e.render(&ctx),
    };
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

async fn route(app: &AdminState, call: S3Call, parts: &http::request::Parts, body: Body) -> Result<Response, S3Error> {
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
        Resource::Bucket(name) => {
            let bucket = app.data.catalog.bucket(name.as_str()).await?;
            let allowed = app.data.auth.s3(&request, S3Target::Bucket(bucket.as_ref()), Access::Write).await?;
            bucket.ok_or(crate::auth::AuthError::NoSuchBucket)?;
            refuse_unsupported(operation, &parts.headers)?;
            let response = match operation {
                Op::DeleteObjects => delete_objects(app, &name, &allowed, &parts.headers, body).await?,
                Op::ListMultipartUploads => list_uploads(app, &name, &allowed, request.query.unwrap_or("")).await?,
                // The bucket exists and this key may write to it: S3's answer to its owner, which clients that
                // create the bucket before a copy take as success.
                Op::CreateBucket => {
                    return Err(S3Error::new(
                        StatusCode::CONFLICT,
                        "BucketAlreadyOwnedByYou",
                        "Your previous request to create the named bucket succeeded and you already own it.",
                    ));
                }
                // Deleting a bucket takes an administrator's grant, which no S3 key holds yet.
                _ => return Err(crate::auth::AuthError::Forbidden.into()),
            };
            Ok(with_principal(&app.data, response, &allowed))
        }
        Resource::Object(name, key) => {
            let bucket = app.data.catalog.bucket(name.as_str()).await?;
            let allowed = app.data.auth.s3(&request, S3Target::Object(bucket.as_ref(), &key), Access::Write).await?;
            bucket.ok_or(crate::auth::AuthError::NoSuchBucket)?;
            refuse_unsupported(operation, &parts.headers)?;
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
                    app.store.abort_upload(&name, &key, upload_id()).await.map_err(multipart_error)?;
                    StatusCode::NO_CONTENT.into_response()
                }
                Op::CreateMultipartUpload => {
                    let attrs = object_attrs(&parts.headers)?;
                    // The key that starts an upload is the one its parts count for (limits' per-key cap).
                    let created_by = Some(allowed.key.id.as_str());
                    let upload =
                        app.store.create_upload(&name, &key, attrs, created_by).await.map_err(multipart_error)?;
                    xml_response(xml::initiate_multipart_upload(name.as_str(), key.as_str(), &upload.id))
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

fn object_attrs(headers: &HeaderMap) -> Result<crate::names::ObjectAttrs, S3Error> {
    let text = |name: header::HeaderName| -> Result<Option<String>, S3Error> {
        headers
            .get(&name)
            .map(|v| v.to_str().map(str::to_owned).map_err(|_| bad_request(format!("{name} is not ASCII"))))
            .transpose()
    };
    let mut attrs =
        parse_attrs(text(header::CONTENT_TYPE)?, text(header::CACHE_CONTROL)?, text(header::CONTENT_DISPOSITION)?)
            .map_err(ApiError::from)?;
    attrs.user_metadata = user_metadata(headers)?;
    attrs.tags = request_tags(headers)?;
    Ok(attrs)
}

/// The request's `x-amz-tagging` (none: no tags), checked as S3 checks a tag set (`InvalidTag`).
fn request_tags(headers: &HeaderMap) -> Result<Tags, S3Error> {
    match headers.get(TAGGING) {
        None => Ok(Tags::new()),
        Some(value) => {
            let text = value.to_str().map_err(|_| bad_request(format!("{TAGGING} is not URL-encoded ASCII")))?;
            parse_tagging_header(text).map_err(request_error)
        }
    }
}

/// The request's `x-amz-meta-*` fields, by name without the prefix (field names are lower case already); several
/// lines of one name are joined with commas, as HTTP combines them. S3's bound holds: names and values together
/// at most 2 KB, else `MetadataTooLarge`.
fn user_metadata(headers: &HeaderMap) -> Result<std::collections::BTreeMap<String, String>, S3Error> {
    let mut metadata = std::collections::BTreeMap::<String, String>::new();
    for (name, value) in headers {
        let Some(short) = name.as_str().strip_prefix(USER_METADATA_PREFIX) else { continue };
        if short.is_empty() {
            return Err(bad_request(format!("{name} names no metadata")));
        }
        let value = value.to_str().map_err(|_| bad_request(format!("{name} is not printable ASCII")))?;
        metadata
            .entry(short.to_owned())
            .and_modify(|joined| {
                joined.push(',');
                joined.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    let size: usize = metadata.iter().map(|(name, value)| name.len() + value.len()).sum();
    if size > MAX_USER_METADATA_BYTES {
        return Err(S3Error::new(
            StatusCode::BAD_REQUEST,
            "MetadataTooLarge",
            format!(
                "Your metadata headers exceed the maximum allowed metadata size: {size} bytes of names and values, \
                 at most {MAX_USER_METADATA_BYTES}"
            ),
        ));
    }
    Ok(metadata)
}

fn bad_request(message: String) -> S3Error {
    S3Error::new(StatusCode::BAD_REQUEST, "InvalidArgument", message)
}

fn request_error(e: RequestError) -> S3Error {
    S3Error::new(StatusCode::BAD_REQUEST, e.code(), e.to_string())
}

fn sigv4_error(e: SigV4Error) -> S3Error {
    S3Error::new(e.status(), e.code(), e.to_string())
}

fn multipart_error(e: MultipartError) -> S3Error {
    let status = match e {
        MultipartError::NoSuchUpload | MultipartError::NoSuchBucket(_) | MultipartError::NoSuchKey => {
            StatusCode::NOT_FOUND
        }
        MultipartError::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
        MultipartError::QuotaExceeded { .. } => StatusCode::FORBIDDEN,
        MultipartError::Other(e) => return ApiError::Internal(e).into(),
        _ => StatusCode::BAD_REQUEST,
    };
    S3Error::new(status, e.s3_code(), e.to_string())
}

/// `multipart_error` for a part (UploadPart, UploadPartCopy): a refusal by a limit is counted, by limit.
fn part_error(e: MultipartError) -> S3Error {
    if let Some(limit) = e.refusing_limit() {
        crate::metrics::multipart_part_refused(limit);
    }
    multipart_error(e)
}

/// How an S3 body is decoded and checked on its way to disk (see the module doc).
struct S3Body {
    /// For the aws-chunked forms.
    decoder: Option<ChunkedDecoder>,
    /// An `x-amz-checksum-*` header on a plain body, with the running checksum.
    header_checksum: Option<(Checksum, Checksummer)>,
}

impl S3Body {
    fn for_request(allowed: &AllowedS3Request, headers: &HeaderMap) -> Result<Self, S3Error> {
        let decoder = ChunkedDecoder::for_request(&allowed.verified, headers).map_err(sigv4_error)?;
        let header_checksum = match decoder {
            Some(_) => None,
            None => header_checksum(headers).map_err(sigv4_error)?.map(|c| {
                let summer = Checksummer::new(c.algorithm);
                (c, summer)
            }),
        };
        Ok(Self { decoder, header_checksum })
    }

    /// The object bytes the request says it carries: `x-amz-decoded-content-length` for aws-chunked bodies (their
    /// Content-Length counts the framing), else Content-Length. Checked against the body as it is read.
    fn declared_length(&self, headers: &HeaderMap) -> Option<u64> {
        match &self.decoder {
            Some(_) => crate::auth::sigv4::chunked::decoded_content_length(headers).ok(),
            None => {
                headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
            }
        }
    }
}

impl BodyFilter for S3Body {
    type Error = S3Error;
    /// Smaller than the native batch: S3 clients upload many parts at once (aws-cli: 10 per file), and the
    /// server's memory must stay flat however many run (docs/s3.md).
    const BATCH: usize = 128 * 1024;

    fn data(&mut self, chunk: Bytes, out: &mut Vec<Bytes>) -> Result<(), S3Error> {
        let Some(decoder) = &mut self.decoder else {
            if let Some((_, summer)) = &mut self.header_checksum {
                summer.update(&chunk);
            }
            out.push(chunk);
            return Ok(());
        };
        let mut offset = 0;
        while offset < chunk.len() {
            let step = decoder.feed(&chunk[offset..]).map_err(sigv4_error)?;
            if !step.data.is_empty() {
                // A sub-slice of the chunk: the same bytes, not a copy.
                let start = step.data.as_ptr() as usize - chunk.as_ptr() as usize;
                out.push(chunk.slice(start..start + step.data.len()));
            }
            offset += step.consumed;
        }
        Ok(())
    }

    fn end(&mut self) -> Result<(), S3Error> {
        if let Some(decoder) = &mut self.decoder {
            decoder.finish().map_err(sigv4_error)?;
        }
        if let Some((presented, summer)) = self.header_checksum.take() {
            if summer.finish() != presented {
                return Err(sigv4_error(SigV4Error::BadDigest(presented.algorithm.name())));
            }
        }
        Ok(())
    }
}

/// The checks only the whole staged body can answer: a hex `x-amz-content-sha256` (plain bodies) and
/// `Content-MD5`. Dropping a refused `StagedBlob` removes its file.
fn check_staged(allowed: &AllowedS3Request, headers: &HeaderMap, staged: &StagedBlob) -> Result<(), S3Error> {
    if let PayloadHash::Sha256(signed) = allowed.verified.payload {
        let mut received = [0u8; 32];
        hex::decode_to_slice(&staged.sha256, &mut received).map_err(|e| ApiError::Internal(e.into()))?;
        check_payload_sha256(&signed, &received).map_err(sigv4_error)?;
    }
    declared_digests(headers)?.check(staged.md5.as_deref(), &staged.sha256).map_err(digest_error)
}

/// `Content-MD5` (and an RFC 9530 `sha-256`, which S3 clients do not send), parsed before the body is read.
fn declared_digests(headers: &HeaderMap) -> Result<DeclaredDigests, S3Error> {
    DeclaredDigests::from_headers(headers).map_err(digest_error)
}

/// S3's words for a digest (`InvalidDigest`, `BadDigest`), from the one mapping (`s3::api_error_parts`).
fn digest_error(e: DigestError) -> S3Error {
    ApiError::Digest(e).into()
}

/// Stages an object or part body of at most `limit` bytes through `filter`: admission
/// (`limits.max_concurrent_uploads`), then the body to disk, decoded and checked.
async fn stage(
    app: &AdminState,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
    mut filter: S3Body,
    limit: u64,
) -> Result<StagedBlob, S3Error> {
    if filter.declared_length(headers).is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge(format!("objects are limited to {limit} bytes")).into());
    }
    // A malformed digest is refused before the body is read.
    declared_digests(headers)?;
    let _place = super::upload::upload_place(app).await?;
    // The aws-chunked framing adds a little per chunk; the decoded length is checked by the decoder.
    let raw_limit = limit.saturating_add(limit / 64).saturating_add(64 << 10);
    let staged = stage_body(app, body, raw_limit, &mut filter).await?;
    if filter.decoder.is_none() && staged.size > limit {
        return Err(ApiError::PayloadTooLarge(format!("objects are limited to {limit} bytes")).into());
    }
    check_staged(allowed, headers, &staged)?;
    Ok(staged)
}

async fn put_object(
    app: &AdminState,
    bucket: &BucketName,
    key: &ObjectKey,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    let attrs = object_attrs(headers)?;
    let condition = write_condition(headers)?;
    let filter = S3Body::for_request(allowed, headers)?;
    let staged = stage(app, allowed, headers, body, filter, app.settings.limits.max_body_bytes()).await?;
    // The ETag S3 gives a single-part upload is the content's MD5, and clients check it (s3cmd retries and fails
    // otherwise, rclone compares it); the put stores it as the object's S3 ETag, which S3 reads answer.
    let md5 =
        staged.md5.clone().ok_or_else(|| ApiError::Internal(anyhow::anyhow!("an S3 body is staged with its MD5")))?;
    let size = staged.size;
    app.store.put_if(bucket, key, staged, attrs, Vec::new(), &condition).await.map_err(ApiError::from)?;
    Ok(stored(with_etag(StatusCode::OK.into_response(), &format!("\"{md5}\"")), size))
}

#[allow(clippy::too_many_arguments)]
async fn upload_part(
    app: &AdminState,
    bucket: &BucketName,
    key: &ObjectKey,
    upload_id: &str,
    part_number: u32,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    check_part_number(part_number)?;
    let limits = UploadLimits::of(&app.settings.limits);
    let filter = S3Body::for_request(allowed, headers)?;
    // An unknown upload, or a part that cannot fit by its declared length, is refused before its body is read.
    let declared = filter.declared_length(headers);
    app.store.check_part_room(bucket, key, upload_id, part_number, declared, &limits).await.map_err(part_error)?;
    let staged = stage(app, allowed, headers, body, filter, limits.max_part_bytes).await.inspect_err(|e| {
        // A body longer than it declared (or declaring nothing) is refused while it streams.
        if matches!(e, S3Error::Api(ApiError::PayloadTooLarge(_))) {
            crate::metrics::multipart_part_refused("max_upload_bytes");
        }
    })?;
    let part = app.store.put_part(bucket, key, upload_id, part_number, staged, &limits).await.map_err(part_error)?;
    Ok(stored(with_etag(StatusCode::OK.into_response(), &part.etag()), part.size))
}

/// The source a copy names, authorised for reading by the same signed request (before it is looked up, so an
/// answer never tells a key that may not read it whether the source exists), and the empty body checked.
async fn copy_source(
    app: &AdminState,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<(BucketName, ObjectKey), S3Error> {
    let value = headers.get(COPY_SOURCE).map(|v| v.to_str()).transpose();
    let value = value.map_err(|_| bad_request(format!("{COPY_SOURCE} is not ASCII")))?.unwrap_or_default();
    let (bucket, key) = parse_copy_source(value).map_err(request_error)?;
    let found = app.data.catalog.bucket(bucket.as_str()).await?;
    app.data.auth.s3_also(allowed, S3Target::Object(found.as_ref(), &key), Access::Read)?;
    // A copy carries no body: one that does is refused, and a signed payload hash is checked as for any body.
    small_body(app, allowed, headers, body, 0).await?;
    Ok((bucket, key))
}

/// Whether the copy's source passes its `x-amz-copy-source-if-*` preconditions, evaluated as RFC 9110's
/// `If-*` on the source (S3's rules are the RFC's order: If-Match wins over If-Unmodified-Since, If-None-Match
/// over If-Modified-Since), against the ETag and Last-Modified S3 reads of it answer.
fn copy_source_passes(headers: &HeaderMap, source: &ObjectRecord) -> bool {
    let mut fields = HeaderMap::new();
    for (name, field) in &COPY_SOURCE_PRECONDITIONS {
        for value in headers.get_all(*name) {
            fields.append(field.clone(), value.clone());
        }
    }
    if fields.is_empty() {
        return true;
    }
    let etag = source.s3_etag_or_native();
    let last_modified = std::time::UNIX_EPOCH + std::time::Duration::from_secs(source.updated_at.max(0) as u64);
    let validators = Validators { etag: &etag, last_modified };
    matches!(evaluate(&Method::GET, &fields, &validators, std::time::SystemTime::now()), Precondition::Proceed { .. })
}

async fn copy_object(
    app: &AdminState,
    target: ObjectName<'_>,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    let (bucket, key) = copy_source(app, allowed, headers, body).await?;
    let directive = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("?"));
    let replace_metadata = parse_metadata_directive(directive(METADATA_DIRECTIVE)).map_err(request_error)?;
    let replace_tags = parse_tagging_directive(directive(TAGGING_DIRECTIVE)).map_err(request_error)?;
    let attrs = CopiedAttrs {
        metadata: if replace_metadata { Directive::Replace(object_attrs(headers)?) } else { Directive::FromSource },
        tags: if replace_tags { Directive::Replace(request_tags(headers)?) } else { Directive::FromSource },
    };
    // S3 refuses a copy onto itself that changes nothing; new tags alone do not make it legal.
    if !replace_metadata && bucket == *target.bucket && key == *target.key {
        return Err(S3Error::new(
            StatusCode::BAD_REQUEST,
            "InvalidRequest",
            "This copy request is illegal because it is trying to copy an object to itself without changing the \
             object's metadata, storage class, website redirect location or encryption attributes.",
        ));
    }
    let source = ObjectName { bucket: &bucket, key: &key };
    let copied = app.store.copy_object(source, target, attrs, |record| copy_source_passes(headers, record)).await;
    match copied.map_err(ApiError::from)? {
        CopyOutcome::Copied(report) => {
            Ok(xml_response(xml::copy_result(CopyResult::Object, &report.s3_etag, report.last_modified)))
        }
        CopyOutcome::NoSuchKey => Err(ApiError::NotFound.into()),
        CopyOutcome::PreconditionFailed => Err(ApiError::PreconditionFailed.into()),
    }
}

/// PutObjectTagging (`PUT ?tagging`, the body's tag set replaces the object's) and DeleteObjectTagging (`DELETE
/// ?tagging`). The object's content, ETag and Last-Modified stay; an absent object is `NoSuchKey`.
async fn object_tagging(
    app: &AdminState,
    target: ObjectName<'_>,
    method: &Method,
    upload_id: Option<&str>,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    if upload_id.is_some() || headers.contains_key(COPY_SOURCE) {
        return Err(S3Error::new(StatusCode::BAD_REQUEST, "InvalidRequest", "?tagging names no upload and no copy"));
    }
    let (tags, status) = match *method {
        Method::PUT => {
            let body = small_body(app, allowed, headers, body, MAX_TAGGING_BODY).await?;
            (parse_tagging(&body).map_err(request_error)?, StatusCode::OK)
        }
        Method::DELETE => (Tags::new(), StatusCode::NO_CONTENT),
        _ => return Err(ApiError::MethodNotAllowed.into()),
    };
    if !app.store.set_tags(target.bucket, target.key, &tags).await.map_err(ApiError::from)? {
        return Err(ApiError::NotFound.into());
    }
    Ok(status.into_response())
}

async fn upload_part_copy(
    app: &AdminState,
    target: ObjectName<'_>,
    upload_id: &str,
    part_number: u32,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    check_part_number(part_number)?;
    let (bucket, key) = copy_source(app, allowed, headers, body).await?;
    let source = app.store.object(&bucket, &key).await.map_err(ApiError::from)?.ok_or(ApiError::NotFound)?;
    if !copy_source_passes(headers, &source) {
        return Err(ApiError::PreconditionFailed.into());
    }
    let range = match headers.get(COPY_SOURCE_RANGE) {
        Some(value) => {
            let value = value.to_str().map_err(|_| bad_request(format!("{COPY_SOURCE_RANGE} is not ASCII")))?;
            parse_copy_source_range(value, source.size).map_err(request_error)?
        }
        None => (0, source.size),
    };
    // The copy writes a part file: it takes an upload place like an uploaded part, and is bounded like one.
    let _place = super::upload::upload_place(app).await?;
    let limits = UploadLimits::of(&app.settings.limits);
    let copied = app.store.copy_part(&source, range, target, upload_id, part_number, &limits).await;
    let part = copied.map_err(part_error)?.ok_or(ApiError::NotFound)?;
    Ok(xml_response(xml::copy_result(CopyResult::Part, &part.etag(), part.created_at)))
}

/// A part number S3 accepts (1 to 10,000), checked before a part's body or source is read.
fn check_part_number(part_number: u32) -> Result<(), S3Error> {
    if !(1..=crate::store::multipart::MAX_PART_NUMBER).contains(&part_number) {
        return Err(multipart_error(MultipartError::InvalidPartNumber(part_number)));
    }
    Ok(())
}

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
    let too_large = || request_error(RequestError::TooLarge { limit });
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
        check_payload_sha256(&signed, &received).map_err(sigv4_error)?;
    }
    let declared = declared_digests(headers)?;
    if !declared.is_empty() {
        let md5 = hex::encode(<md5::Md5 as md5::Digest>::digest(&decoded));
        let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&decoded));
        declared.check(Some(&md5), &sha256).map_err(digest_error)?;
    }
    Ok(decoded)
}

#[allow(clippy::too_many_arguments)]
async fn complete(
    app: &AdminState,
    bucket: &BucketName,
    key: &ObjectKey,
    upload_id: &str,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    let condition = write_condition(headers)?;
    let body = small_body(app, allowed, headers, body, MAX_COMPLETE_BODY).await?;
    let parts = parse_complete_multipart_upload(&body).map_err(request_error)?;
    let parts: Vec<(u32, String)> = parts.into_iter().map(|p| (p.part_number, p.etag)).collect();
    // Assembly writes a whole object: it takes an upload slot like any body (`limits.max_concurrent_uploads`).
    let _place = super::upload::upload_place(app).await?;
    let completion = Completion {
        upload_id,
        parts: &parts,
        max_object_bytes: app.settings.limits.max_object_bytes,
        condition: &condition,
    };
    let report = app.store.complete_upload(bucket, key, completion).await.map_err(multipart_error)?;
    // S3's Location is the object's URL: under `public_url` when it is set, else its path.
    let path = format!("/{}/{}", bucket.as_str(), crate::s3::url_encode(key.as_str()));
    let location = match app.settings.public_url() {
        Ok(Some(base)) => format!("{base}{path}"),
        _ => path,
    };
    Ok(xml_response(xml::complete_multipart_upload(&location, bucket.as_str(), key.as_str(), &report.s3_etag)))
}

async fn delete_objects(
    app: &AdminState,
    bucket: &BucketName,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    // S3 requires an integrity header on DeleteObjects (botocore, the Go SDK and s3cmd all send one).
    let has_digest = headers.contains_key("content-md5")
        || headers.contains_key("x-amz-trailer")
        || headers.keys().any(|name| name.as_str().starts_with("x-amz-checksum-"));
    if !has_digest {
        return Err(S3Error::new(
            StatusCode::BAD_REQUEST,
            "InvalidRequest",
            "Missing required header for this request: Content-MD5 (or an x-amz-checksum-* header)",
        ));
    }
    let body = small_body(app, allowed, headers, body, MAX_DELETE_BODY).await?;
    let request = parse_delete(&body).map_err(request_error)?;
    let mut outcomes = Vec::with_capacity(request.objects.len());
    for DeleteTarget { key: raw, etag } in request.objects {
        let failed =
            |code: &str, message: String| DeleteOutcome::Failed { key: raw.clone(), code: code.into(), message };
        // An `<ETag>` makes the entry a conditional delete, as `If-Match` makes a DeleteObject one.
        let condition = etag.as_deref().map(parse_if_match).transpose();
        let outcome = match (ObjectKey::parse(&raw), condition) {
            (Err(e), _) => failed("InvalidArgument", e.to_string()),
            // The key's prefix bounds each key, as it bounds a single DeleteObject.
            (Ok(key), _) if !key.as_str().starts_with(&allowed.key.grant.prefix) => {
                failed("AccessDenied", "Access Denied".into())
            }
            (Ok(_), Err(e)) => failed(e.code(), e.to_string()),
            (Ok(key), Ok(tag)) => match app
                .store
                .delete_if(bucket, &key, &tag.map_or(WriteCondition::Always, WriteCondition::IfMatch))
                .await
            {
                Ok(_) => DeleteOutcome::Deleted { key: raw.clone() },
                // The entry says what a DeleteObject of the key would answer.
                Err(e) => {
                    let e = ApiError::from(e);
                    let (status, code, message) = super::s3::api_error_parts(&e);
                    if status.is_server_error() {
                        tracing::error!(error = ?e, "DeleteObjects: cannot delete a key");
                    }
                    failed(code, message.into_owned())
                }
            },
        };
        outcomes.push(outcome);
    }
    Ok(xml_response(xml::delete_result(outcomes, request.quiet)))
}

fn owner() -> Owner {
    Owner { id: "blobgate".into(), display_name: "blobgate".into() }
}

async fn list_parts(
    app: &AdminState,
    bucket: &BucketName,
    key: &ObjectKey,
    upload_id: &str,
    query: &str,
) -> Result<Response, S3Error> {
    let params = ListPartsParams::from_query(query).map_err(request_error)?;
    let (parts, is_truncated) = app
        .store
        .list_parts(bucket, key, upload_id, params.part_number_marker, params.max_parts)
        .await
        .map_err(multipart_error)?;
    let page = PartsPage {
        bucket: bucket.as_str().to_owned(),
        key: key.as_str().to_owned(),
        upload_id: upload_id.to_owned(),
        part_number_marker: params.part_number_marker,
        max_parts: params.max_parts,
        is_truncated,
        parts: parts
            .iter()
            .map(|p| ListedPart {
                part_number: p.part_number,
                last_modified: p.created_at,
                etag: p.etag(),
                size: p.size,
            })
            .collect(),
    };
    Ok(xml_response(xml::list_parts(&page, &owner())))
}

/// ListMultipartUploads: `prefix`, `delimiter` (common prefixes), `key-marker` / `upload-id-marker`,
/// `max-uploads`, `encoding-type=url`, planned by `s3::listing::Planner` over the store's keyset reads.
/// Within the key's prefix: a request for a shorter prefix lists only the uploads under the key's (rolled up
/// as the shorter prefix and the delimiter say), another prefix is refused.
async fn list_uploads(
    app: &AdminState,
    bucket: &BucketName,
    allowed: &AllowedS3Request,
    query: &str,
) -> Result<Response, S3Error> {
    let params = ListUploadsParams::from_query(query).map_err(request_error)?;
    let key_prefix = allowed.key.grant.prefix.as_str();
    let readable = if params.prefix.starts_with(key_prefix) {
        params.prefix.clone()
    } else if key_prefix.starts_with(&params.prefix) {
        key_prefix.to_owned()
    } else {
        return Err(crate::auth::AuthError::Forbidden.into());
    };
    let mut source = UploadsSource { store: &app.store, bucket, readable };
    let query = ListQuery {
        prefix: params.prefix.clone(),
        delimiter: params.delimiter.clone(),
        after: UploadMarker::of_request(params.key_marker.as_deref(), params.upload_id_marker.as_deref()),
        max_keys: params.max_uploads,
    };
    let planned = listing::list_page(&mut source, query).await.map_err(multipart_error)?;
    let (next_key_marker, next_upload_id_marker) =
        (planned.next_marker().map(str::to_owned), planned.next_upload_id_marker());
    let (mut uploads, mut common_prefixes) = (Vec::new(), Vec::new());
    for entry in planned.entries {
        match entry {
            Entry::Object(upload) => uploads.push(upload),
            Entry::CommonPrefix(prefix) => common_prefixes.push(prefix),
        }
    }
    let page = UploadsPage {
        bucket: bucket.as_str().to_owned(),
        prefix: params.prefix.clone(),
        delimiter: params.delimiter.clone(),
        key_marker: params.key_marker.clone(),
        upload_id_marker: params.upload_id_marker.clone(),
        max_uploads: params.max_uploads,
        is_truncated: planned.is_truncated,
        next_key_marker,
        next_upload_id_marker,
        uploads,
        common_prefixes,
        url_encoded: params.url_encoded,
    };
    Ok(xml_response(xml::list_multipart_uploads(&page, &owner())))
}

/// The store's uploads of one bucket, under the prefix the key may read (`readable`, which starts with the
/// listing's prefix), in (key, upload id) order.
struct UploadsSource<'a> {
    store: &'a crate::store::Store,
    bucket: &'a BucketName,
    readable: String,
}

impl listing::Source for UploadsSource<'_> {
    type Item = ListedUpload;
    type Error = MultipartError;

    async fn fetch(&mut self, _prefix: &str, fetch: &Fetch<UploadMarker>) -> Result<Vec<ListedUpload>, MultipartError> {
        let after = match &fetch.start {
            Start::After(UploadMarker { key, upload_id }) => (key.as_str(), upload_id.as_deref()),
            // Upload ids are never empty, so "after the empty id" is every upload of the key.
            Start::AtLeast(key) => (key.as_str(), Some("")),
        };
        let (uploads, _) = self.store.list_uploads(self.bucket, &self.readable, Some(after), fetch.limit).await?;
        Ok(uploads.into_iter().map(|u| ListedUpload { key: u.key, upload_id: u.id, initiated: u.created_at }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::sigv4::checksum::ChecksumAlgorithm;
    use crate::auth::sigv4::chunked::Framing;

    fn unsigned_body() -> S3Body {
        let decoder = ChunkedDecoder::new(Framing::UnsignedTrailer, 11, Some(ChecksumAlgorithm::Crc32)).unwrap();
        S3Body { decoder: Some(decoder), header_checksum: None }
    }

    /// Feeds `body` in two pieces split at `at`; the object bytes yielded, and the verdict.
    fn run(mut filter: S3Body, body: &[u8], at: usize) -> (Vec<u8>, Result<(), S3Error>) {
        let (mut out, mut pieces) = (Vec::new(), Vec::new());
        for part in [&body[..at], &body[at..]] {
            if let Err(e) = filter.data(Bytes::copy_from_slice(part), &mut pieces) {
                return (out, Err(e));
            }
            pieces.drain(..).for_each(|p| out.extend_from_slice(&p));
        }
        (out, filter.end())
    }

    fn code(result: Result<(), S3Error>) -> &'static str {
        match result {
            Err(S3Error::S3 { code, .. }) => code,
            other => panic!("not an S3 refusal: {other:?}"),
        }
    }

    #[test]
    fn aws_chunked_bodies_yield_their_object_bytes_at_any_split_and_a_wrong_trailer_is_bad_digest() {
        let good = b"b\r\nhello world\r\n0\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n";
        let bad = b"b\r\nhello world\r\n0\r\nx-amz-checksum-crc32:DUoRhA==\r\n\r\n";
        for at in 0..=good.len() {
            let (out, verdict) = run(unsigned_body(), good, at);
            assert_eq!(out, b"hello world", "split at {at}");
            assert!(verdict.is_ok(), "split at {at}");
            assert_eq!(code(run(unsigned_body(), bad, at).1), "BadDigest", "split at {at}");
        }
        assert_eq!(code(run(unsigned_body(), &good[..12], 6).1), "IncompleteBody");
    }

    #[test]
    fn a_plain_body_is_checked_against_its_checksum_header() {
        let presented = Checksum::parse(ChecksumAlgorithm::Crc32, "DUoRhQ==").unwrap();
        let plain = |c: &Checksum| S3Body {
            decoder: None,
            header_checksum: Some((c.clone(), Checksummer::new(ChecksumAlgorithm::Crc32))),
        };
        let (out, verdict) = run(plain(&presented), b"hello world", 4);
        assert_eq!(out, b"hello world");
        assert!(verdict.is_ok());
        assert_eq!(code(run(plain(&presented), b"hello worle", 4).1), "BadDigest");
    }
}
