//! The S3 listing routes: ListBuckets, GetBucketLocation, ListObjects V1 and V2. Small XML bodies from memory.

use axum::response::Response;

use super::DataState;
use super::s3::{Query, S3Error, escape, xml_response};
use crate::auth::S3Grant;
use crate::store::Bucket;

const XMLNS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

pub fn list_buckets_xml(bucket: Option<&Bucket>) -> String {
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListAllMyBucketsResult xmlns=\"{XMLNS}\"><Owner><ID>blobgate</ID><DisplayName>blobgate</DisplayName></Owner><Buckets>"
    );
    if let Some(b) = bucket {
        out.push_str(&format!(
            "<Bucket><Name>{}</Name><CreationDate>{}</CreationDate></Bucket>",
            escape(&b.name),
            iso8601(b.created_at)
        ));
    }
    out.push_str("</Buckets></ListAllMyBucketsResult>");
    out
}

pub fn location_xml(constraint: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<LocationConstraint xmlns=\"{XMLNS}\">{}</LocationConstraint>",
        escape(constraint)
    )
}

fn iso8601(unix: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0) as u64);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!("{}.000Z", s.trim_end_matches('Z'))
}

pub async fn list_objects(
    _app: &DataState,
    _bucket: &Bucket,
    _grant: &S3Grant,
    _query: &Query,
) -> Result<Response, S3Error> {
    Ok(xml_response(String::new()))
}
