//! `blobgate db copy`: every row of this database into another, empty one (moving up from SQLite to PostgreSQL),
//! in one transaction on the target, from one read snapshot of the source. Blobs stay where they are.

use futures_util::TryStreamExt;
use sqlx::Row;

use super::{Backend, Metadata, MetadataError, TxBackend};

/// A column's type, for moving its values between databases without a struct per table.
#[derive(Clone, Copy)]
enum Column {
    Int,
    Text,
    Bytes,
    Bool,
}

/// The copied tables, parents first (foreign keys), each with its columns and the order the rows go in. Signing
/// keys go in insertion order (`rowid`), which orders keys created in the same second. Sealed secrets (signing
/// keys, S3 keys) are copied sealed: `signing-secrets.key` stays in the data dir and opens them there. S3 uploads
/// in progress are copied with their parts, whose files stay in `parts/`, so a client can still complete them on
/// the target. The change log is not copied: the target's triggers log every inserted row, so a replica already
/// on the target evicts what it cached. Nor are the stats flush marks: each is one process's batch in doubt on the
/// source, under a random writer id that no process writing to the target has. Nor is the stats ledger (nor its fold's
/// cursor): its rows not folded yet are added to the totals they are copied with. Nor are the store blob retirements (when
/// a sweep may delete what): the target's sweep finds unreferenced blobs on its own. `tests/api/schema.rs` checks that
/// every other column of every table is here.
/// (table, its columns with their types, the order its rows are copied in)
type Table = (&'static str, &'static [(&'static str, Column)], &'static str);

const TABLES: &[Table] = {
    use Column::*;
    &[
        (
            "buckets",
            &[
                ("id", Int),
                ("name", Text),
                ("public", Bool),
                ("created_at", Int),
                ("default_cache_control", Text),
                ("cors", Text),
                ("index_document", Text),
                ("error_document", Text),
            ],
            "id",
        ),
        (
            "objects",
            &[
                ("bucket_id", Int),
                ("key", Text),
                ("sha256", Text),
                ("size", Int),
                ("content_type", Text),
                ("cache_control", Text),
                ("content_disposition", Text),
                ("user_metadata", Text),
                ("tags", Text),
                ("created_at", Int),
                ("updated_at", Int),
            ],
            "bucket_id, key",
        ),
        (
            "object_s3_etags",
            &[
                ("bucket_id", Int),
                ("key", Text),
                ("sha256", Text),
                ("etag", Text),
                ("part_sizes", Text),
                ("checksum", Text),
            ],
            "bucket_id, key",
        ),
        (
            "object_variants",
            &[("bucket_id", Int), ("key", Text), ("encoding", Text), ("sha256", Text), ("size", Int)],
            "bucket_id, key, encoding",
        ),
        (
            "tokens",
            &[
                ("id", Text),
                ("secret_hash", Bytes),
                ("bucket_id", Int),
                ("prefix", Text),
                ("scope", Text),
                ("created_at", Int),
                ("expires_at", Int),
                ("revoked_at", Int),
            ],
            "id",
        ),
        (
            "s3_keys",
            &[
                ("id", Text),
                ("secret", Bytes),
                ("bucket_id", Int),
                ("prefix", Text),
                ("scope", Text),
                ("created_at", Int),
                ("expires_at", Int),
                ("revoked_at", Int),
            ],
            "id",
        ),
        (
            "token_grants",
            &[("token_id", Text), ("position", Int), ("bucket_id", Int), ("prefix", Text), ("scope", Text)],
            "token_id, position",
        ),
        (
            "s3_key_grants",
            &[("key_id", Text), ("position", Int), ("bucket_id", Int), ("prefix", Text), ("scope", Text)],
            "key_id, position",
        ),
        ("signing_keys", &[("id", Text), ("secret", Bytes), ("created_at", Int), ("retired_at", Int)], "rowid"),
        ("revoked_signatures", &[("signature", Text), ("expires_at", Int), ("revoked_at", Int)], "signature"),
        (
            "object_stats",
            &[
                ("bucket_id", Int),
                ("key", Text),
                ("requests", Int),
                ("completed", Int),
                ("aborted", Int),
                ("truncated", Int),
                ("bytes_sent", Int),
                ("range_requests", Int),
                ("not_modified", Int),
                ("head_requests", Int),
                ("last_download_at", Int),
            ],
            "bucket_id, key",
        ),
        (
            "object_stats_daily",
            &[
                ("bucket_id", Int),
                ("key", Text),
                ("day", Text),
                ("requests", Int),
                ("completed", Int),
                ("aborted", Int),
                ("bytes_sent", Int),
                ("range_requests", Int),
                ("not_modified", Int),
            ],
            "bucket_id, key, day",
        ),
        (
            "multipart_uploads",
            &[
                ("id", Text),
                ("bucket_id", Int),
                ("key", Text),
                ("content_type", Text),
                ("cache_control", Text),
                ("content_disposition", Text),
                ("user_metadata", Text),
                ("tags", Text),
                ("created_at", Int),
                ("created_by", Text),
                ("checksum", Text),
            ],
            "id",
        ),
        (
            "multipart_parts",
            &[
                ("upload_id", Text),
                ("part_number", Int),
                ("size", Int),
                ("staged_name", Text),
                ("md5", Text),
                ("sha256", Text),
                ("created_at", Int),
                ("checksum", Text),
            ],
            "upload_id, part_number",
        ),
        (
            "principal_limits",
            &[
                ("subject_kind", Text),
                ("subject_name", Text),
                ("request_count", Int),
                ("request_period_secs", Int),
                ("request_burst", Int),
                ("read_bytes_per_sec", Int),
                ("read_burst_bytes", Int),
                ("write_bytes_per_sec", Int),
                ("write_burst_bytes", Int),
                ("concurrent", Int),
                ("ipv4_prefix", Int),
                ("ipv6_prefix", Int),
                ("weight", Int),
                ("updated_at", Int),
            ],
            "subject_kind, subject_name",
        ),
    ]
};

/// Where a table's rows are read: the table, but for the download totals, which are read with the ledger's rows
/// not folded yet (the ledger itself is not copied: the target starts with everything folded).
fn source_of(table: &str) -> String {
    match table {
        "object_stats" => format!("({}) AS object_stats", super::stats::totals_with_ledger("true")),
        "object_stats_daily" => format!("({}) AS object_stats_daily", super::stats::daily_with_ledger()),
        _ => table.to_owned(),
    }
}

/// The grants' tables, copied after their credentials.
const GRANT_TABLES: [&str; 2] = ["token_grants", "s3_key_grants"];

/// Why a copy did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the target database is not empty ({table} has rows): nothing was copied")]
    TargetNotEmpty { table: &'static str },
    #[error("{table}: copied {copied} rows but the target holds {target}: nothing was copied")]
    CountMismatch { table: &'static str, copied: u64, target: u64 },
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

impl From<sqlx::Error> for CopyError {
    fn from(e: sqlx::Error) -> Self {
        CopyError::Metadata(e.into())
    }
}

impl Metadata {
    /// Copies every row into `target`, which must hold none, and checks each table's count before committing.
    /// Returns the rows copied per table.
    pub async fn copy_to(&self, target: &Metadata) -> Result<Vec<(&'static str, u64)>, CopyError> {
        let mut tx = target.begin_write().await?;
        for (table, _, _) in TABLES {
            let sql = format!("SELECT EXISTS (SELECT 1 FROM {table})");
            let found: bool = with_tx!(&mut tx.tx, conn => sqlx::query_scalar(&sql).fetch_one(&mut **conn).await?);
            if found {
                return Err(CopyError::TargetNotEmpty { table });
            }
        }
        let mut copied = Vec::with_capacity(TABLES.len());
        // One read transaction on the source: every table from the same snapshot.
        macro_rules! copy_from {
            ($source:expr) => {{
                let mut source = $source;
                for (table, columns, order) in TABLES {
                    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
                    let select = format!("SELECT {} FROM {} ORDER BY {order}", names.join(", "), source_of(table));
                    let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
                    let insert =
                        format!("INSERT INTO {table} ({}) VALUES ({})", names.join(", "), placeholders.join(", "));
                    if GRANT_TABLES.contains(table) {
                        // The target's triggers gave each copied credential its one-grant columns as a grant (as
                        // for a row an older release inserts): the source's grants replace them.
                        let clear = format!("DELETE FROM {table}");
                        with_tx!(&mut tx.tx, conn => sqlx::query(&clear).execute(&mut **conn).await?.rows_affected());
                    }
                    let mut rows = sqlx::query(&select).fetch(&mut *source);
                    let mut count = 0u64;
                    while let Some(row) = rows.try_next().await? {
                        with_tx!(&mut tx.tx, conn => {
                            let mut query = sqlx::query(&insert);
                            for (i, (_, column)) in columns.iter().enumerate() {
                                query = match column {
                                    Column::Int => query.bind(row.try_get::<Option<i64>, _>(i)?),
                                    Column::Text => query.bind(row.try_get::<Option<String>, _>(i)?),
                                    Column::Bytes => query.bind(row.try_get::<Option<Vec<u8>>, _>(i)?),
                                    Column::Bool => query.bind(row.try_get::<Option<bool>, _>(i)?),
                                };
                            }
                            query.execute(&mut **conn).await?;
                        });
                        count += 1;
                    }
                    drop(rows);
                    copied.push((*table, count));
                }
                source.commit().await?;
            }};
        }
        match &self.backend {
            Backend::Sqlite(pool) => copy_from!(pool.begin().await?),
            Backend::Postgres(pool) => {
                copy_from!(pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?)
            }
        }
        // Bucket ids were copied: new buckets on the target continue after them.
        if let TxBackend::Postgres(conn) = &mut tx.tx {
            sqlx::query("SELECT setval(pg_get_serial_sequence('buckets', 'id'), max(id)) FROM buckets")
                .execute(&mut **conn)
                .await?;
        }
        for &(table, source) in &copied {
            let sql = format!("SELECT count(*) FROM {table}");
            let target: i64 = with_tx!(&mut tx.tx, conn => sqlx::query_scalar(&sql).fetch_one(&mut **conn).await?);
            if target as u64 != source {
                return Err(CopyError::CountMismatch { table, copied: source, target: target as u64 });
            }
        }
        tx.commit().await?;
        Ok(copied)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::DatabaseUrl;
    use crate::names::{BucketName, IndexDocument, ObjectAttrs, ObjectKey};
    use crate::store::metadata::{BucketChanges, Grant, Rights, S3KeyRecord, Scope, TestBackend, test_database_url};
    use crate::store::{Completion, StagedBlob, Store, UploadLimits};

    fn part(store: &Store, content: &[u8]) -> StagedBlob {
        let mut w = store.blobs.writer().unwrap();
        w.write(content).unwrap();
        w.finish().unwrap()
    }

    /// The S3 tables move too: a key with its sealed secret (it opens on the target with the same data dir), an
    /// object's multipart ETag, and an upload in progress (with the key that started it) and its part, which the
    /// target can then complete.
    #[tokio::test]
    async fn s3_keys_etags_and_uploads_in_progress_are_copied_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let source =
            Store::open(dir.path(), &DatabaseUrl::in_data_dir(dir.path()), Duration::from_secs(5)).await.unwrap();
        let b = BucketName::parse("bkt").unwrap();
        source.meta.create_bucket(&b, false, 0).await.unwrap();
        let (index, error) = (IndexDocument::parse("index.html").unwrap(), ObjectKey::parse("404.html").unwrap());
        let website = BucketChanges {
            index_document: Some(Some(&index)),
            error_document: Some(Some(&error)),
            ..Default::default()
        };
        let bucket = source.meta.update_bucket(&b, website).await.unwrap().unwrap();
        let key = S3KeyRecord {
            id: "AKBGCOPYCOPYCOPYCOPY".into(),
            secret: "c".repeat(40),
            rights: Rights { created_at: 1, ..Rights::whole_bucket(bucket.id, "bkt", Scope::Write) },
        };
        // Several grants, the first of every bucket: the target holds them as they were, not as its triggers make
        // them of the one-grant columns.
        let mut key = key;
        key.rights.grants.insert(0, Grant { bucket: None, prefix: String::new(), scope: Scope::Admin });
        source.meta.create_s3_key(&key).await.unwrap();
        let (done, pending) = (ObjectKey::parse("done.bin").unwrap(), ObjectKey::parse("pending.bin").unwrap());
        let upload = source.create_upload(&b, &done, ObjectAttrs::default(), None, None).await.unwrap();
        let p1 = source.put_part(&b, &done, &upload.id, 1, part(&source, b"whole"), &UploadLimits::NONE).await.unwrap();
        let completed =
            source.complete_upload(&b, &done, Completion::unbounded(&upload.id, &[(1, p1.etag())])).await.unwrap();
        let open = source.create_upload(&b, &pending, ObjectAttrs::default(), Some(&key.id), None).await.unwrap();
        let open_part =
            source.put_part(&b, &pending, &open.id, 1, part(&source, b"half"), &UploadLimits::NONE).await.unwrap();

        let target_url = test_database_url(TestBackend::Postgres, dir.path()).await;
        let target = Store::open(dir.path(), &target_url, Duration::from_secs(5)).await.unwrap();
        let copied = source.meta.copy_to(&target.meta).await.unwrap();
        for (table, rows) in [
            ("s3_keys", 1),
            ("s3_key_grants", 2),
            ("object_s3_etags", 1),
            ("multipart_uploads", 1),
            ("multipart_parts", 1),
            ("objects", 1),
        ] {
            assert_eq!(copied.iter().find(|(t, _)| *t == table).map(|(_, n)| *n), Some(rows), "{table}: {copied:?}");
        }
        assert_eq!(copied.len(), TABLES.len(), "every table is counted");

        assert_eq!(target.meta.bucket(&b).await.unwrap(), Some(bucket.clone()), "with its index and error documents");
        assert_eq!(target.meta.s3_key(&key.id).await.unwrap(), Some(key), "the sealed secret opens on the target");
        assert_eq!(target.meta.s3_etag(bucket.id, "done.bin").await.unwrap(), Some(completed.s3_etag));
        assert_eq!(target.meta.upload(&open.id).await.unwrap(), Some(open.clone()));
        assert_eq!(target.meta.list_parts(&open.id, 0, 10).await.unwrap(), vec![open_part.clone()]);
        let finished = target
            .complete_upload(&b, &pending, Completion::unbounded(&open.id, &[(1, open_part.etag())]))
            .await
            .unwrap();
        assert_eq!(finished.put.size, 4, "the part file in parts/ completes on the target");
    }

    /// Download counters still in the source's ledger, some of them halfway through a fold, arrive in the totals
    /// (per object and per day), and the target starts with nothing to fold.
    #[tokio::test]
    async fn download_stats_not_folded_yet_are_copied_in_the_totals() {
        use std::sync::Arc;

        use crate::stats::{Batch, Counters};
        use crate::store::metadata::{StatsFlush, StatsOrder};
        let dir = tempfile::tempdir().unwrap();
        let source =
            Store::open(dir.path(), &DatabaseUrl::in_data_dir(dir.path()), Duration::from_secs(5)).await.unwrap();
        let bucket = source.meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let flush = |seq: i64, day: i64| {
            let mut batch = Batch::default();
            let counters = Counters { requests: 1, completed: 1, bytes_sent: 5, ..Counters::default() };
            for key in ["a", "b"] {
                batch.per_day.insert(((bucket.id, Arc::from(key)), day), (counters, Some(seq)));
            }
            (StatsFlush { writer: "w".into(), seq }, batch)
        };
        let (first, batch) = flush(1, 20_000);
        let batch = Arc::new(batch);
        source.meta.record_download_stats(&first, &batch).await.unwrap();
        source.meta.fold_stats().await.unwrap();
        let (second, batch) = flush(2, 20_001);
        let batch = Arc::new(batch);
        source.meta.record_download_stats(&second, &batch).await.unwrap();
        let before = source.meta.object_stats(None, "", StatsOrder::Bytes, None).await.unwrap();
        assert_eq!(before.iter().map(|r| r.counters.requests).collect::<Vec<_>>(), [2, 2]);

        let target_url = test_database_url(TestBackend::Postgres, dir.path()).await;
        let target = Store::open(dir.path(), &target_url, Duration::from_secs(5)).await.unwrap();
        let copied = source.meta.copy_to(&target.meta).await.unwrap();
        let count = |table: &str| copied.iter().find(|(t, _)| *t == table).map(|(_, n)| *n);
        assert_eq!((count("object_stats"), count("object_stats_daily")), (Some(2), Some(4)));
        assert_eq!(target.meta.object_stats(None, "", StatsOrder::Bytes, None).await.unwrap(), before);
        let folded = target.meta.fold_stats().await.unwrap();
        assert_eq!((folded.rows, folded.deleted), (0, 0), "nothing to fold on the target");
    }

    crate::store::metadata::on_both_backends!(every_column_of_every_copied_table_is_listed);
    /// The column lists are kept by hand: every column the schema has is in its table's list, but those left out
    /// on purpose (a Complete's claim, which no copy should carry over; PostgreSQL's stand-in for SQLite's rowid).
    async fn every_column_of_every_copied_table_is_listed(backend: TestBackend) {
        const LEFT_OUT: &[(&str, &str)] = &[("multipart_uploads", "completing_since"), ("signing_keys", "rowid")];
        let (_dir, meta) = crate::store::metadata::pool::tests::database(backend).await;
        for (table, columns, _) in TABLES {
            let mut schema: Vec<String> = match &meta.backend {
                Backend::Sqlite(pool) => sqlx::query_scalar("SELECT name FROM pragma_table_info($1)")
                    .bind(table)
                    .fetch_all(pool)
                    .await
                    .unwrap(),
                Backend::Postgres(pool) => sqlx::query_scalar(
                    "SELECT column_name::text FROM information_schema.columns
                     WHERE table_schema = current_schema() AND table_name = $1",
                )
                .bind(table)
                .fetch_all(pool)
                .await
                .unwrap(),
            };
            schema.retain(|column| !LEFT_OUT.contains(&(table, column.as_str())));
            schema.sort();
            let mut listed: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
            listed.sort_unstable();
            assert_eq!(schema, listed, "{table}");
        }
    }
}
