//! `blobgate uploads list|abort`: S3 multipart uploads neither completed nor aborted, which hold their parts in
//! `parts/` until `timeouts.multipart_upload_expiry` and are invisible to `ls`.

use std::io::Write;

use anyhow::bail;

use super::rfc3339;
use crate::names::{BucketName, ObjectKey};
use crate::store::{MultipartError, Store, UploadSummary};

/// Uploads read per database query; the listing is printed page by page.
const PAGE: u32 = 1000;

/// Prints one JSON line per upload, by bucket, then key, then age.
pub(super) async fn list(store: &Store, bucket: Option<&str>) -> anyhow::Result<()> {
    let buckets = match bucket {
        Some(name) => {
            let name = BucketName::parse(name)?;
            vec![crate::store::require_bucket(store.meta.bucket(&name).await?, &name)?]
        }
        None => store.meta.list_buckets().await?,
    };
    for bucket in buckets {
        let mut after: Option<(String, String)> = None;
        loop {
            let marker = after.as_ref().map(|(key, id)| (key.as_str(), id.as_str()));
            let page = store.meta.upload_summaries(bucket.id, marker, PAGE).await?;
            let text: String = page.iter().map(|u| upload_line(&bucket.name, u) + "\n").collect();
            match std::io::stdout().write_all(text.as_bytes()) {
                // `blobgate uploads list | head`: the reader has all it wants.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                other => other?,
            }
            if page.len() < PAGE as usize {
                break;
            }
            after = page.last().map(|u| (u.upload.key.clone(), u.upload.id.clone()));
        }
    }
    Ok(())
}

/// One `uploads list` line.
fn upload_line(bucket: &str, u: &UploadSummary) -> String {
    serde_json::json!({
        "bucket": bucket, "key": u.upload.key, "upload_id": u.upload.id, "parts": u.parts, "bytes": u.bytes,
        "started": rfc3339(u.upload.created_at), "created_by": u.upload.created_by,
    })
    .to_string()
}

/// Aborts one upload, as S3's AbortMultipartUpload does: its rows, then its part files.
pub(super) async fn abort(store: &Store, bucket: &str, key: &str, upload_id: &str) -> anyhow::Result<()> {
    let bucket = BucketName::parse(bucket)?;
    let key = ObjectKey::parse(key)?;
    match store.abort_upload(&bucket, &key, upload_id).await {
        Ok(()) => {
            eprintln!("aborted upload {upload_id} of {bucket}/{key}");
            Ok(())
        }
        Err(MultipartError::NoSuchUpload) => bail!("no such upload: {upload_id} of {bucket}/{key}"),
        Err(e) => Err(e.into()),
    }
}
