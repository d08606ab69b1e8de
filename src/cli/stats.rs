//! `blobgate stats`: per-object download counters, as a table or JSON.

use crate::names::BucketName;
use crate::store::{StatsOrder, Store};

pub(super) async fn stats(
    store: &Store,
    bucket: Option<String>,
    prefix: &str,
    top: Option<u32>,
    order: StatsOrder,
    json: bool,
) -> anyhow::Result<()> {
    let bucket_id = match bucket {
        Some(name) => {
            let name = BucketName::parse(&name)?;
            Some(crate::store::require_bucket(store.meta.bucket(&name).await?, &name)?.id)
        }
        None => None,
    };
    let rows = store.meta.object_stats(bucket_id, prefix, order, top).await?;
    if json {
        let array: Vec<_> = rows.iter().map(crate::metrics::downloads::stats_json).collect();
        println!("{}", serde_json::to_string(&array)?);
        return Ok(());
    }
    println!(
        "{:<40} {:>9} {:>9} {:>8} {:>15} {:>7} {:>7}  LAST_DOWNLOAD",
        "BUCKET/KEY", "REQUESTS", "COMPLETED", "ABORTED", "BYTES_SENT", "RANGES", "304S"
    );
    for s in &rows {
        let c = &s.counters;
        let last = crate::metrics::downloads::stats_json(s)["last_download_at"].as_str().unwrap_or("-").to_owned();
        println!(
            "{:<40} {:>9} {:>9} {:>8} {:>15} {:>7} {:>7}  {last}",
            format!("{}/{}", s.bucket, s.key),
            c.requests,
            c.completed,
            c.aborted,
            c.bytes_sent,
            c.range_requests,
            c.not_modified
        );
    }
    Ok(())
}
