//! CompleteMultipartUpload, ListParts and ListMultipartUploads over `store::multipart` (Create, UploadPart and
//! Abort are short enough to stay in the router).

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) async fn complete(
    app: &AdminState,
    bucket: &BucketName,
    key: &ObjectKey,
    upload_id: &str,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    let condition = write_condition(headers)?;
    // A checksum header on Complete is the object's (a full-object checksum, checked against the parts'; a
    // composite `…-N` is not one), not the XML body's.
    let presented = header_checksum(headers).ok().flatten().as_ref().and_then(ObjectChecksum::of);
    let mut body_headers = headers.clone();
    ChecksumAlgorithm::ALL.iter().for_each(|a| drop(body_headers.remove(a.header_name())));
    let body = small_body(app, allowed, &body_headers, body, MAX_COMPLETE_BODY).await?;
    let parts = parse_complete_multipart_upload(&body)?;
    let parts: Vec<(u32, String)> = parts.into_iter().map(|p| (p.part_number, p.etag)).collect();
    // Assembly writes a whole object: it takes an upload slot like any body (`limits.max_concurrent_uploads`).
    let _place = crate::http::upload::upload_place(app).await?;
    let completion = Completion {
        upload_id,
        parts: &parts,
        max_object_bytes: app.settings.limits.max_object_bytes,
        condition: &condition,
        checksum: presented.as_ref(),
    };
    let (s3_etag, checksum) = match app.store.complete_upload(bucket, key, completion).await {
        Ok(report) => (report.s3_etag, report.checksum),
        // A retry of a Complete that committed (its answer lost): S3 answers it again (the checksum is the
        // object's, on HEAD and GET with checksum mode; the retry's answer carries its ETag).
        Err(MultipartError::NoSuchUpload) => {
            let etag = app.store.completed_upload(bucket, key, upload_id, &parts).await?;
            (etag.ok_or(MultipartError::NoSuchUpload)?, None)
        }
        Err(e) => return Err(e.into()),
    };
    // S3's Location is the object's URL: under `public_url` when it is set, else its path.
    let path = format!("/{}/{}", bucket.as_str(), crate::s3::url_encode(key.as_str()));
    let location = match app.settings.public_url() {
        Ok(Some(base)) => format!("{base}{path}"),
        _ => path,
    };
    let checksum = checksum.as_ref();
    let xml = xml::complete_multipart_upload(&location, bucket.as_str(), key.as_str(), &s3_etag, checksum);
    Ok(with_checksum(xml_response(xml), checksum))
}

fn owner() -> Owner {
    Owner { id: "blobgate".into(), display_name: "blobgate".into() }
}

pub(super) async fn list_parts(
    app: &AdminState,
    bucket: &BucketName,
    key: &ObjectKey,
    upload_id: &str,
    query: &str,
) -> Result<Response, S3Error> {
    let params = ListPartsParams::from_query(query)?;
    let (_, upload) = app.store.upload_of(bucket, key, upload_id).await?;
    let (parts, is_truncated) =
        app.store.list_parts(bucket, key, upload_id, params.part_number_marker, params.max_parts).await?;
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
                checksum: p.checksum,
            })
            .collect(),
        checksum: upload.checksum,
    };
    Ok(xml_response(xml::list_parts(&page, &owner())))
}

/// ListMultipartUploads: `prefix`, `delimiter` (common prefixes), `key-marker` / `upload-id-marker`,
/// `max-uploads`, `encoding-type=url`, planned by `s3::listing::Planner` over the store's keyset reads.
/// Within the key's grants: a request for a shorter prefix lists only the uploads under a grant's (rolled up
/// as the shorter prefix and the delimiter say), another prefix is refused.
pub(super) async fn list_uploads(
    app: &AdminState,
    (bucket, bucket_id): (&BucketName, i64),
    allowed: &AllowedS3Request,
    query: &str,
) -> Result<Response, S3Error> {
    let params = ListUploadsParams::from_query(query)?;
    let Some(readable) = allowed.key.rights.readable_prefix(bucket_id, &params.prefix).map(str::to_owned) else {
        return Err(crate::auth::AuthError::Forbidden.into());
    };
    let mut source = UploadsSource { store: &app.store, bucket, readable };
    let query = ListQuery {
        prefix: params.prefix.clone(),
        delimiter: params.delimiter.clone(),
        after: UploadMarker::of_request(params.key_marker.as_deref(), params.upload_id_marker.as_deref()),
        max_keys: params.max_uploads,
    };
    let planned = listing::list_page(&mut source, query).await?;
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
