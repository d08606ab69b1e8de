//! Limits on principals (`principal_limits`, migration 0024): set field by field, cleared and listed whole; every
//! server reloads the table when the change feed names one.

use super::{Metadata, MetadataError};
use crate::throttle::{LimitError, LimitSet, RequestRate, Subject};

struct LimitRow {
    subject_kind: String,
    subject_name: String,
    request_count: Option<i64>,
    request_period_secs: Option<i64>,
    request_burst: Option<i64>,
    read_bytes_per_sec: Option<i64>,
    read_burst_bytes: Option<i64>,
    write_bytes_per_sec: Option<i64>,
    write_burst_bytes: Option<i64>,
    concurrent: Option<i64>,
    ipv4_prefix: Option<i64>,
    ipv6_prefix: Option<i64>,
    weight: Option<i64>,
}
from_row!(LimitRow {
    subject_kind,
    subject_name,
    request_count,
    request_period_secs,
    request_burst,
    read_bytes_per_sec,
    read_burst_bytes,
    write_bytes_per_sec,
    write_burst_bytes,
    concurrent,
    ipv4_prefix,
    ipv6_prefix,
    weight,
});

const COLUMNS: &str = "subject_kind, subject_name, request_count, request_period_secs, request_burst, \
     read_bytes_per_sec, read_burst_bytes, write_bytes_per_sec, write_burst_bytes, concurrent, ipv4_prefix, ipv6_prefix, \
     weight";

impl LimitRow {
    /// `None` for a row of a kind this binary does not know (a newer release's), or with a value out of range.
    fn limit(&self) -> Option<(Subject, LimitSet)> {
        fn number<T: TryFrom<i64>>(v: Option<i64>) -> Option<Option<T>> {
            v.map(|v| T::try_from(v).ok()).map_or(Some(None), |v| v.map(Some))
        }
        fn bytes(v: Option<i64>) -> Option<Option<u64>> {
            number(v)
        }
        let subject = Subject::from_parts(&self.subject_kind, &self.subject_name)?;
        let requests = match (number::<u32>(self.request_count)?, number::<u32>(self.request_period_secs)?) {
            (Some(count), Some(period_secs)) => Some(RequestRate { count, period_secs }),
            _ => None,
        };
        let limits = LimitSet {
            requests,
            request_burst: number(self.request_burst)?,
            read_bytes: bytes(self.read_bytes_per_sec)?,
            read_burst: bytes(self.read_burst_bytes)?,
            write_bytes: bytes(self.write_bytes_per_sec)?,
            write_burst: bytes(self.write_burst_bytes)?,
            concurrent: number(self.concurrent)?,
            ipv4_prefix: number(self.ipv4_prefix)?,
            ipv6_prefix: number(self.ipv6_prefix)?,
            weight: number(self.weight)?,
        };
        Some((subject, limits))
    }
}

fn stored(v: Option<impl Into<u64>>) -> Option<i64> {
    v.map(|v| i64::try_from(v.into()).unwrap_or(i64::MAX))
}

impl Metadata {
    /// Every limit, by principal kind and name. A row this binary cannot read (a newer release's kind) is skipped.
    pub async fn limits(&self) -> Result<Vec<(Subject, LimitSet)>, MetadataError> {
        let sql = format!("SELECT {COLUMNS} FROM principal_limits ORDER BY subject_kind, subject_name");
        let rows: Vec<LimitRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql).fetch_all(pool).await?);
        Ok(rows.iter().filter_map(LimitRow::limit).collect())
    }

    /// Sets the fields `change` names on `subject`'s limit (creating it), in one write transaction; the inner error
    /// refuses a result that cannot be meant ([`LimitSet::check`]), and then nothing is written.
    pub async fn set_limit(
        &self,
        subject: &Subject,
        change: &LimitSet,
        now: i64,
    ) -> Result<Result<LimitSet, LimitError>, MetadataError> {
        let mut tx = self.begin_write().await?;
        let sql = format!("SELECT {COLUMNS} FROM principal_limits WHERE subject_kind = $1 AND subject_name = $2");
        let old: Option<LimitRow> = with_tx!(&mut tx.tx, c => sqlx::query_as(&sql)
            .bind(subject.scope())
            .bind(subject.name())
            .fetch_optional(&mut **c)
            .await?);
        let old = old.and_then(|row| row.limit()).map(|(_, limits)| limits).unwrap_or_default();
        let new = old.updated(change);
        if let Err(refused) = new.check(subject) {
            return Ok(Err(refused));
        }
        let (count, period) = match new.requests {
            Some(rate) => (Some(rate.count), Some(rate.period_secs)),
            None => (None, None),
        };
        let upsert = format!(
            "INSERT INTO principal_limits ({COLUMNS}, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
             ON CONFLICT (subject_kind, subject_name) DO UPDATE SET
                 request_count = excluded.request_count, request_period_secs = excluded.request_period_secs,
                 request_burst = excluded.request_burst, read_bytes_per_sec = excluded.read_bytes_per_sec,
                 read_burst_bytes = excluded.read_burst_bytes, write_bytes_per_sec = excluded.write_bytes_per_sec,
                 write_burst_bytes = excluded.write_burst_bytes, concurrent = excluded.concurrent,
                 ipv4_prefix = excluded.ipv4_prefix, ipv6_prefix = excluded.ipv6_prefix,
                 weight = excluded.weight, updated_at = excluded.updated_at"
        );
        with_tx!(&mut tx.tx, c => sqlx::query(&upsert)
            .bind(subject.scope())
            .bind(subject.name())
            .bind(stored(count))
            .bind(stored(period))
            .bind(stored(new.request_burst))
            .bind(stored(new.read_bytes))
            .bind(stored(new.read_burst))
            .bind(stored(new.write_bytes))
            .bind(stored(new.write_burst))
            .bind(stored(new.concurrent))
            .bind(stored(new.ipv4_prefix))
            .bind(stored(new.ipv6_prefix))
            .bind(stored(new.weight))
            .bind(now)
            .execute(&mut **c)
            .await?
            .rows_affected());
        tx.commit().await?;
        Ok(Ok(new))
    }

    /// Removes `subject`'s limit; `false` when it had none.
    pub async fn clear_limit(&self, subject: &Subject) -> Result<bool, MetadataError> {
        let mut tx = self.begin_write().await?;
        let removed = with_tx!(&mut tx.tx, c => sqlx::query(
            "DELETE FROM principal_limits WHERE subject_kind = $1 AND subject_name = $2")
            .bind(subject.scope())
            .bind(subject.name())
            .execute(&mut **c)
            .await?
            .rows_affected());
        tx.commit().await?;
        Ok(removed > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::metadata::pool::tests::database;
    use crate::throttle::RequestRate;

    on_both_backends!(limits_are_set_field_by_field_listed_and_cleared);
    async fn limits_are_set_field_by_field_listed_and_cleared(backend: crate::store::metadata::TestBackend) {
        let (_dir, meta) = database(backend).await;
        let token = Subject::Token("t1".into());
        let rate = Some(RequestRate { count: 5, period_secs: 1 });
        let set = meta.set_limit(&token, &LimitSet { requests: rate, ..Default::default() }, 1).await.unwrap();
        assert_eq!(set.unwrap().requests, rate);
        let set = meta.set_limit(&token, &LimitSet { concurrent: Some(2), ..Default::default() }, 2).await.unwrap();
        assert_eq!(set.unwrap(), LimitSet { requests: rate, concurrent: Some(2), ..Default::default() });
        let refused = LimitSet { ipv4_prefix: Some(24), ..Default::default() };
        assert!(meta.set_limit(&token, &refused, 3).await.unwrap().is_err(), "a prefix on a token is refused");
        let anon = LimitSet { read_bytes: Some(10 << 20), ipv6_prefix: Some(48), ..Default::default() };
        meta.set_limit(&Subject::Anonymous, &anon, 4).await.unwrap().unwrap();
        let all = meta.limits().await.unwrap();
        assert_eq!(
            all,
            vec![
                (Subject::Anonymous, anon),
                (token.clone(), LimitSet { requests: rate, concurrent: Some(2), ..Default::default() }),
            ]
        );
        assert!(meta.clear_limit(&token).await.unwrap());
        assert!(!meta.clear_limit(&token).await.unwrap());
        assert_eq!(meta.limits().await.unwrap().len(), 1);
    }
}
