//! The bodies of PutObject and UploadPart: decoded (aws-chunked, with or without chunk signatures) and checked
//! (`x-amz-content-sha256`, `Content-MD5`, `x-amz-checksum-*`) on their way to disk, refused before anything commits.

use super::*;

/// How an S3 body is decoded and checked on its way to disk (see the module doc).
pub(super) struct S3Body {
    /// For the aws-chunked forms.
    decoder: Option<ChunkedDecoder>,
    /// An `x-amz-checksum-*` header on a plain body, with the running checksum.
    header_checksum: Option<(Checksum, Checksummer)>,
    /// The checksum presented (header or trailer) once it verified, stored with the object or part.
    verified: Option<Checksum>,
    /// A part's checksum of its upload's algorithm when the request presents none of it, computed here.
    computed: Option<Checksummer>,
}

impl S3Body {
    pub(super) fn for_request(allowed: &AllowedS3Request, headers: &HeaderMap) -> Result<Self, S3Error> {
        let decoder = ChunkedDecoder::for_request(&allowed.verified, headers)?;
        let header_checksum = match decoder {
            Some(_) => None,
            None => header_checksum(headers)?.map(|c| {
                let summer = Checksummer::new(c.algorithm);
                (c, summer)
            }),
        };
        Ok(Self { decoder, header_checksum, verified: None, computed: None })
    }

    /// Computes `algorithm`'s checksum of the body too, unless the request presents one of it.
    fn computing(mut self, algorithm: ChecksumAlgorithm, headers: &HeaderMap) -> Self {
        let presented = headers.contains_key(algorithm.header_name())
            || headers
                .get(crate::auth::sigv4::chunked::TRAILER_HEADER)
                .is_some_and(|t| t.as_bytes().eq_ignore_ascii_case(algorithm.header_name().as_bytes()));
        if !presented {
            self.computed = Some(Checksummer::new(algorithm));
        }
        self
    }

    /// The body's checksum once it verified: the presented one, else the computed one.
    fn checksum(&mut self) -> Option<ObjectChecksum> {
        let checksum = self.verified.take().or_else(|| self.computed.take().map(Checksummer::finish))?;
        ObjectChecksum::of(&checksum)
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
            if let Some(summer) = &mut self.computed {
                summer.update(&chunk);
            }
            out.push(chunk);
            return Ok(());
        };
        let before = out.len();
        let mut offset = 0;
        while offset < chunk.len() {
            let step = decoder.feed(&chunk[offset..])?;
            if !step.data.is_empty() {
                // A sub-slice of the chunk: the same bytes, not a copy.
                let start = step.data.as_ptr() as usize - chunk.as_ptr() as usize;
                out.push(chunk.slice(start..start + step.data.len()));
            }
            offset += step.consumed;
        }
        if let Some(summer) = &mut self.computed {
            out[before..].iter().for_each(|piece| summer.update(piece));
        }
        Ok(())
    }

    fn end(&mut self) -> Result<(), S3Error> {
        if let Some(decoder) = &mut self.decoder {
            self.verified = decoder.finish()?.checksum;
        }
        if let Some((presented, summer)) = self.header_checksum.take() {
            if summer.finish() != presented {
                return Err(S3Error::from(SigV4Error::BadDigest(presented.algorithm.name())));
            }
            self.verified = Some(presented);
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
        check_payload_sha256(&signed, &received)?;
    }
    declared_digests(headers)?.check(staged.md5.as_deref(), &staged.sha256).map_err(S3Error::from)
}

/// `Content-MD5` (and an RFC 9530 `sha-256`, which S3 clients do not send), parsed before the body is read.
pub(super) fn declared_digests(headers: &HeaderMap) -> Result<DeclaredDigests, S3Error> {
    DeclaredDigests::from_headers(headers).map_err(S3Error::from)
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
    let _place = crate::http::upload::upload_place(app).await?;
    // The aws-chunked framing adds a little per chunk; the decoded length is checked by the decoder.
    let raw_limit = limit.saturating_add(limit / 64).saturating_add(64 << 10);
    let staged = stage_body(app, body, raw_limit, &mut filter).await?;
    if filter.decoder.is_none() && staged.size > limit {
        return Err(ApiError::PayloadTooLarge(format!("objects are limited to {limit} bytes")).into());
    }
    check_staged(allowed, headers, &staged)?;
    let mut staged = staged;
    staged.checksum = filter.checksum();
    Ok(staged)
}

pub(super) async fn put_object(
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
    let (size, checksum) = (staged.size, staged.checksum);
    app.store.put_if(bucket, key, staged, attrs, Vec::new(), &condition).await.map_err(ApiError::from)?;
    let response = with_checksum(with_etag(StatusCode::OK.into_response(), &format!("\"{md5}\"")), checksum.as_ref());
    Ok(stored(response, size))
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn upload_part(
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
    let mut filter = S3Body::for_request(allowed, headers)?;
    // An unknown upload, or a part that cannot fit by its declared length, is refused before its body is read.
    let declared = filter.declared_length(headers);
    let upload =
        app.store.check_part_room(bucket, key, upload_id, part_number, declared, &limits).await.map_err(part_error)?;
    if let Some((algorithm, _)) = upload.checksum {
        filter = filter.computing(algorithm, headers);
    }
    let staged = stage(app, allowed, headers, body, filter, limits.max_part_bytes).await.inspect_err(|e| {
        // A body longer than it declared (or declaring nothing) is refused while it streams.
        if matches!(e, S3Error::Api(ApiError::PayloadTooLarge(_))) {
            crate::metrics::multipart_part_refused("max_upload_bytes");
        }
    })?;
    let part = app.store.put_part(bucket, key, upload_id, part_number, staged, &limits).await.map_err(part_error)?;
    let response = with_checksum(with_etag(StatusCode::OK.into_response(), &part.etag()), part.checksum.as_ref());
    Ok(stored(response, part.size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::sigv4::chunked::Framing;

    fn unsigned_body() -> S3Body {
        let decoder = ChunkedDecoder::new(Framing::UnsignedTrailer, 11, Some(ChecksumAlgorithm::Crc32)).unwrap();
        S3Body { decoder: Some(decoder), header_checksum: None, verified: None, computed: None }
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
            verified: None,
            computed: None,
        };
        let (out, verdict) = run(plain(&presented), b"hello world", 4);
        assert_eq!(out, b"hello world");
        assert!(verdict.is_ok());
        assert_eq!(code(run(plain(&presented), b"hello worle", 4).1), "BadDigest");
    }
}
