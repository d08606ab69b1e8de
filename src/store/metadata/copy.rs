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
/// keys go in insertion order (`rowid`), which orders keys created in the same second. The change log is not
/// copied: the target's triggers log every inserted row, so a replica already on the target evicts what it cached.
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
                ("created_at", Int),
                ("updated_at", Int),
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
    ]
};

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
                    let select = format!("SELECT {} FROM {table} ORDER BY {order}", names.join(", "));
                    let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
                    let insert =
                        format!("INSERT INTO {table} ({}) VALUES ({})", names.join(", "), placeholders.join(", "));
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
