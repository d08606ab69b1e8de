//! Tokens, signing keys (sealed at rest) and revoked signatures.

use super::{Metadata, MetadataError, TxBackend};
use crate::store::sealing::{self, NONCE_LEN, is_sealed};

/// What a token may do, each level including the ones below it. Stored as `read`, `write` or `admin`, and parsed
/// once, when the row is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// GET and HEAD.
    Read,
    /// Read, plus uploads and deletes.
    Write,
    /// Write, plus management of the bucket.
    Admin,
}

impl Scope {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Scope::Read),
            "write" => Some(Scope::Write),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }
}

/// What a stored credential (a token or an S3 key) grants, and for how long: the columns both tables share. The
/// rules that decide with it (`Grant::check`) are `auth`'s; a decision is `auth::AllowedRead` or `auth::AllowedS3Request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub bucket_id: i64,
    pub bucket_name: String,
    pub prefix: String,
    pub scope: Scope,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

impl Grant {
    /// A test's grant: `scope` on the whole bucket, made at 0, live and never expiring.
    #[cfg(test)]
    pub fn whole_bucket(bucket_id: i64, bucket_name: &str, scope: Scope) -> Grant {
        Grant {
            bucket_id,
            bucket_name: bucket_name.into(),
            prefix: String::new(),
            scope,
            created_at: 0,
            expires_at: None,
            revoked_at: None,
        }
    }
}

/// A bearer token's stored form: never the token itself, only its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: String,
    pub secret_hash: Vec<u8>,
    pub grant: Grant,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningKey {
    pub id: String,
    pub secret: Vec<u8>,
    pub created_at: i64,
    pub retired_at: Option<i64>,
}

/// A grant row as stored, beside its kind's own columns (`#[sqlx(flatten)]`): the scope still text.
#[derive(sqlx::FromRow)]
pub(super) struct GrantRow {
    bucket_id: i64,
    bucket_name: String,
    prefix: String,
    scope: String,
    created_at: i64,
    expires_at: Option<i64>,
    revoked_at: Option<i64>,
}

impl GrantRow {
    /// The grant, its scope parsed; `what` names the credential in the error (`token 0123…`).
    pub(super) fn parse(self, what: std::fmt::Arguments<'_>) -> Result<Grant, MetadataError> {
        let scope = Scope::parse(&self.scope)
            .ok_or_else(|| MetadataError::Invalid(format!("{what} has an unknown scope {:?}", self.scope)))?;
        let GrantRow { bucket_id, bucket_name, prefix, scope: _, created_at, expires_at, revoked_at } = self;
        Ok(Grant { bucket_id, bucket_name, prefix, scope, created_at, expires_at, revoked_at })
    }
}

/// `SELECT`s the rows of a grant table (`tokens`, `s3_keys`) with their bucket's name: `kind_columns` (of the
/// table, aliased `g`) beside the shared ones, then `rest` (`WHERE`, `ORDER BY`).
pub(super) fn select_grants(table: &str, kind_columns: &str, rest: &str) -> String {
    format!(
        "SELECT {kind_columns}, g.bucket_id, b.name AS bucket_name, g.prefix, g.scope, g.created_at, g.expires_at,
         g.revoked_at FROM {table} g JOIN buckets b ON b.id = g.bucket_id {rest}"
    )
}

/// A token's own columns, beside its grant's.
const TOKEN_COLUMNS: &str = "g.id, g.secret_hash";

#[derive(sqlx::FromRow)]
struct TokenRow {
    id: String,
    secret_hash: Vec<u8>,
    #[sqlx(flatten)]
    grant: GrantRow,
}

impl TryFrom<TokenRow> for TokenRecord {
    type Error = MetadataError;

    fn try_from(r: TokenRow) -> Result<Self, MetadataError> {
        let grant = r.grant.parse(format_args!("token {}", r.id))?;
        Ok(TokenRecord { id: r.id, secret_hash: r.secret_hash, grant })
    }
}

/// A signing key as stored: its secret sealed (or, from before sealing, in the clear).
#[derive(sqlx::FromRow)]
struct SigningKeyRow {
    id: String,
    secret: Vec<u8>,
    created_at: i64,
    retired_at: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct StoredSecret {
    id: String,
    secret: Vec<u8>,
}

impl Metadata {
    pub async fn create_token(&self, token: &TokenRecord) -> Result<(), MetadataError> {
        self.insert_grant("tokens", "secret_hash", &token.id, &token.secret_hash, &token.grant).await
    }

    /// Inserts a row of a grant table: `id` and `secret` (into `secret_column`) beside the grant's columns.
    pub(super) async fn insert_grant(
        &self,
        table: &str,
        secret_column: &str,
        id: &str,
        secret: &[u8],
        grant: &Grant,
    ) -> Result<(), MetadataError> {
        let sql = format!(
            "INSERT INTO {table} (id, {secret_column}, bucket_id, prefix, scope, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)"
        );
        let mut tx = self.begin_write().await?;
        with_tx!(&mut tx.tx, conn => sqlx::query(&sql)
            .bind(id)
            .bind(secret)
            .bind(grant.bucket_id)
            .bind(&grant.prefix)
            .bind(grant.scope.as_str())
            .bind(grant.created_at)
            .bind(grant.expires_at)
            .execute(&mut **conn)
            .await?.rows_affected());
        tx.commit().await
    }

    pub async fn token(&self, id: &str) -> Result<Option<TokenRecord>, MetadataError> {
        let sql = select_grants("tokens", TOKEN_COLUMNS, "WHERE g.id = $1");
        let row: Option<TokenRow> =
            with_pool!(&self.backend, pool => sqlx::query_as(&sql).bind(id).fetch_optional(pool).await?);
        row.map(TokenRecord::try_from).transpose()
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>, MetadataError> {
        let sql = select_grants("tokens", TOKEN_COLUMNS, "ORDER BY g.created_at, g.id");
        let rows: Vec<TokenRow> = with_pool!(&self.backend, pool => sqlx::query_as(&sql).fetch_all(pool).await?);
        rows.into_iter().map(TokenRecord::try_from).collect()
    }

    /// Marks a token revoked; `false` when there is no such live token.
    pub async fn revoke_token(&self, id: &str, now: i64) -> Result<bool, MetadataError> {
        self.stamp_once("UPDATE tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL", id, now).await
    }

    /// Runs an update that sets a timestamp on one row unless it is already set; true when a row changed. One
    /// conditional UPDATE: of two concurrent ones (two replicas), PostgreSQL re-checks the condition after the
    /// first commits, so exactly one reports the change.
    pub(super) async fn stamp_once(&self, sql: &'static str, id: &str, now: i64) -> Result<bool, MetadataError> {
        let mut tx = self.begin_write().await?;
        let changed = with_tx!(&mut tx.tx, sqlite =>
            sqlx::query(sql).bind(id).bind(now).execute(&mut **sqlite).await?.rows_affected());
        tx.commit().await?;
        Ok(changed == 1)
    }

    pub async fn create_signing_key(&self, key: &SigningKey) -> Result<(), MetadataError> {
        let sealed = sealing::seal(self.secrets_key()?, &key.id, &key.secret, fresh_nonce()?);
        let mut tx = self.begin_write().await?;
        with_tx!(&mut tx.tx, sqlite => sqlx::query("INSERT INTO signing_keys (id, secret, created_at) VALUES ($1, $2, $3)")
            .bind(&key.id)
            .bind(&sealed)
            .bind(key.created_at)
            .execute(&mut **sqlite)
            .await?.rows_affected());
        tx.commit().await
    }

    /// The newest key that is not retired: the one new links are signed with.
    pub async fn newest_signing_key(&self) -> Result<Option<SigningKey>, MetadataError> {
        let row: Option<SigningKeyRow> = with_pool!(&self.backend, pool => sqlx::query_as(
            "SELECT id, secret, created_at, retired_at FROM signing_keys WHERE retired_at IS NULL
             ORDER BY created_at DESC, rowid DESC LIMIT 1",
        )
        .fetch_optional(pool)
        .await?);
        row.map(|r| self.open_signing_key(r)).transpose()
    }

    pub async fn signing_key(&self, id: &str) -> Result<Option<SigningKey>, MetadataError> {
        let row: Option<SigningKeyRow> = with_pool!(&self.backend, pool =>
            sqlx::query_as("SELECT id, secret, created_at, retired_at FROM signing_keys WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await?);
        row.map(|r| self.open_signing_key(r)).transpose()
    }

    pub async fn list_signing_keys(&self) -> Result<Vec<SigningKey>, MetadataError> {
        let rows: Vec<SigningKeyRow> = with_pool!(&self.backend, pool =>
            sqlx::query_as("SELECT id, secret, created_at, retired_at FROM signing_keys ORDER BY created_at, rowid")
                .fetch_all(pool)
                .await?);
        rows.into_iter().map(|r| self.open_signing_key(r)).collect()
    }

    /// Seals every signing key still stored in the clear (rows from before sealing), and checks that every sealed
    /// one opens with this secrets key, so a wrong key file fails at start rather than on a request. Returns how
    /// many rows it sealed.
    pub async fn seal_signing_keys(&self) -> Result<usize, MetadataError> {
        let key = self.secrets_key()?;
        let stored: Vec<StoredSecret> =
            with_pool!(&self.backend, pool => sqlx::query_as(SELECT_SECRETS).fetch_all(pool).await?);
        if stored.iter().all(|s| is_sealed(&s.secret)) {
            for s in &stored {
                sealing::open(key, &s.id, &s.secret)?;
            }
            return Ok(0);
        }
        let mut tx = self.begin_write().await?;
        // SQLite: the plaintext must not stay behind in the page's free space. PostgreSQL: the rows are locked, so
        // two replicas starting together do not both seal (and announce) the same row.
        let select = match &mut tx.tx {
            TxBackend::Sqlite(sqlite) => {
                sqlx::query("PRAGMA secure_delete = ON").execute(&mut **sqlite).await?;
                SELECT_SECRETS.to_owned()
            }
            TxBackend::Postgres(_) => format!("{SELECT_SECRETS} FOR UPDATE"),
        };
        let mut sealed = 0;
        let stored: Vec<StoredSecret> =
            with_tx!(&mut tx.tx, conn => sqlx::query_as(&select).fetch_all(&mut **conn).await?);
        for s in stored {
            let secret = sealing::open(key, &s.id, &s.secret)?;
            if !is_sealed(&s.secret) {
                let resealed = sealing::seal(key, &s.id, &secret, fresh_nonce()?);
                with_tx!(&mut tx.tx, conn => sqlx::query("UPDATE signing_keys SET secret = $2 WHERE id = $1")
                    .bind(&s.id)
                    .bind(resealed)
                    .execute(&mut **conn)
                    .await?.rows_affected());
                sealed += 1;
            }
        }
        if let TxBackend::Sqlite(sqlite) = &mut tx.tx {
            sqlx::query("PRAGMA secure_delete = OFF").execute(&mut **sqlite).await?;
        }
        tx.commit().await?;
        Ok(sealed)
    }

    /// Whether any signing key is stored sealed: then a missing secrets key file is an error, not a fresh start.
    pub async fn has_sealed_signing_keys(&self) -> Result<bool, MetadataError> {
        let stored: Vec<StoredSecret> =
            with_pool!(&self.backend, pool => sqlx::query_as(SELECT_SECRETS).fetch_all(pool).await?);
        Ok(stored.iter().any(|s| is_sealed(&s.secret)))
    }

    fn open_signing_key(&self, r: SigningKeyRow) -> Result<SigningKey, MetadataError> {
        let secret = sealing::open(self.secrets_key()?, &r.id, &r.secret)?;
        Ok(SigningKey { id: r.id, secret, created_at: r.created_at, retired_at: r.retired_at })
    }

    pub async fn retire_signing_key(&self, id: &str, now: i64) -> Result<bool, MetadataError> {
        self.stamp_once("UPDATE signing_keys SET retired_at = $2 WHERE id = $1 AND retired_at IS NULL", id, now).await
    }

    /// Revokes one signed URL by its signature; expired entries are pruned on the way.
    pub async fn revoke_signature(&self, signature: &str, expires_at: i64, now: i64) -> Result<(), MetadataError> {
        let mut tx = self.begin_write().await?;
        with_tx!(&mut tx.tx, sqlite => {
            sqlx::query("DELETE FROM revoked_signatures WHERE expires_at < $1").bind(now).execute(&mut **sqlite).await?;
            sqlx::query(
                "INSERT INTO revoked_signatures (signature, expires_at, revoked_at) VALUES ($1, $2, $3)
                 ON CONFLICT (signature) DO NOTHING",
            )
            .bind(signature)
            .bind(expires_at)
            .bind(now)
            .execute(&mut **sqlite)
            .await?
            .rows_affected()
        });
        tx.commit().await
    }

    pub async fn signature_revoked(&self, signature: &str) -> Result<bool, MetadataError> {
        let found: bool = with_pool!(&self.backend, pool => sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM revoked_signatures WHERE signature = $1)",
        )
        .bind(signature)
        .fetch_one(pool)
        .await?);
        Ok(found)
    }
}

/// Every signing key's stored secret, sealed or not.
const SELECT_SECRETS: &str = "SELECT id, secret FROM signing_keys";

/// A fresh nonce for sealing a secret.
pub(super) fn fresh_nonce() -> Result<[u8; NONCE_LEN], MetadataError> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| sqlx::Error::Io(std::io::Error::other(e)))?;
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::names::BucketName;
    use crate::store::metadata::Backend;
    use crate::store::metadata::TestBackend;
    use crate::store::metadata::pool::tests::database;

    #[test]
    fn scopes_are_ordered_and_round_trip() {
        assert!(Scope::Admin > Scope::Write && Scope::Write > Scope::Read);
        for s in [Scope::Read, Scope::Write, Scope::Admin] {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
        }
        assert_eq!(Scope::parse("READ"), None);
    }

    on_both_backends!(a_token_reads_back_with_its_scope_and_an_unknown_scope_is_an_error);
    async fn a_token_reads_back_with_its_scope_and_an_unknown_scope_is_an_error(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let token = TokenRecord {
            id: "0123456789ab".into(),
            secret_hash: vec![1; 32],
            grant: Grant {
                prefix: "p/".into(),
                created_at: 3,
                expires_at: Some(10),
                ..Grant::whole_bucket(bucket.id, "bkt", Scope::Write)
            },
        };
        meta.create_token(&token).await.unwrap();
        assert_eq!(meta.token(&token.id).await.unwrap(), Some(token.clone()));
        assert_eq!(meta.list_tokens().await.unwrap(), vec![token.clone()]);
        // Only a hand-made row can hold another scope: the table's CHECK refuses it, so lift the check.
        match &meta.backend {
            Backend::Sqlite(pool) => {
                let mut conn = pool.acquire().await.unwrap();
                sqlx::query("PRAGMA ignore_check_constraints = ON").execute(&mut *conn).await.unwrap();
                sqlx::query("UPDATE tokens SET scope = 'owner'").execute(&mut *conn).await.unwrap();
                sqlx::query("PRAGMA ignore_check_constraints = OFF").execute(&mut *conn).await.unwrap();
            }
            Backend::Postgres(pool) => {
                sqlx::query("ALTER TABLE tokens DROP CONSTRAINT tokens_scope_check").execute(pool).await.unwrap();
                sqlx::query("UPDATE tokens SET scope = 'owner'").execute(pool).await.unwrap();
            }
        }
        let err = meta.token(&token.id).await.unwrap_err();
        assert!(err.to_string().contains("unknown scope \"owner\""), "{err}");
    }

    on_both_backends!(signing_keys_order_by_creation_then_insertion_and_retire_once);
    async fn signing_keys_order_by_creation_then_insertion_and_retire_once(backend: TestBackend) {
        let (_dir, meta) = database(backend).await;
        let meta = meta.with_secrets_key(crate::store::sealing::SecretsKey::from_bytes([7; 32]));
        let key = |id: &str| SigningKey {
            id: id.into(),
            secret: vec![id.as_bytes()[0]; 32],
            created_at: 5,
            retired_at: None,
        };
        // Same second: the later insert is the newer key.
        for id in ["kb", "ka"] {
            meta.create_signing_key(&key(id)).await.unwrap();
        }
        assert_eq!(meta.newest_signing_key().await.unwrap(), Some(key("ka")));
        let ids: Vec<String> = meta.list_signing_keys().await.unwrap().into_iter().map(|k| k.id).collect();
        assert_eq!(ids, ["kb", "ka"]);
        assert!(meta.retire_signing_key("ka", 9).await.unwrap());
        assert!(!meta.retire_signing_key("ka", 10).await.unwrap(), "retired once");
        assert_eq!(meta.signing_key("ka").await.unwrap().unwrap().retired_at, Some(9));
        assert_eq!(meta.newest_signing_key().await.unwrap(), Some(key("kb")));
        assert!(meta.has_sealed_signing_keys().await.unwrap());
        assert_eq!(meta.seal_signing_keys().await.unwrap(), 0);

        assert!(!meta.signature_revoked("sig").await.unwrap());
        meta.revoke_signature("sig", 100, 50).await.unwrap();
        meta.revoke_signature("sig", 100, 50).await.unwrap();
        assert!(meta.signature_revoked("sig").await.unwrap());
        // Expired entries go on the next revocation.
        meta.revoke_signature("other", 300, 200).await.unwrap();
        assert!(!meta.signature_revoked("sig").await.unwrap());
    }

    /// Every byte of the database and its WAL, where a secret would show if it were stored in the clear.
    fn database_bytes(dir: &Path) -> Vec<u8> {
        ["blobgate.db", "blobgate.db-wal"].iter().flat_map(|f| std::fs::read(dir.join(f)).unwrap_or_default()).collect()
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[tokio::test]
    async fn signing_secrets_are_sealed_in_the_database_and_old_plaintext_rows_get_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::config::DatabaseUrl::in_data_dir(dir.path());
        let store = crate::store::Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        let fresh = SigningKey { id: "knew".into(), secret: vec![0x5a; 32], created_at: 1, retired_at: None };
        store.meta.create_signing_key(&fresh).await.unwrap();
        // A row written before sealing existed: the 32 raw bytes.
        let legacy = SigningKey { id: "kold".into(), secret: vec![0xa5; 32], created_at: 0, retired_at: None };
        let Backend::Sqlite(pool) = &store.meta.backend else { unreachable!("an SQLite store") };
        sqlx::query("INSERT INTO signing_keys (id, secret, created_at) VALUES ($1, $2, $3)")
            .bind(&legacy.id)
            .bind(&legacy.secret)
            .bind(legacy.created_at)
            .execute(pool)
            .await
            .unwrap();
        assert_eq!(store.meta.list_signing_keys().await.unwrap(), vec![legacy.clone(), fresh.clone()]);
        assert!(!contains(&database_bytes(dir.path()), &fresh.secret), "a new secret is sealed");
        store.meta.close().await;
        assert!(contains(&database_bytes(dir.path()), &legacy.secret), "the legacy row is still in the clear");

        // The next open seals the legacy row; both still read back as they were.
        let store = crate::store::Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        assert_eq!(store.meta.seal_signing_keys().await.unwrap(), 0, "already sealed at open");
        assert_eq!(store.meta.signing_key("kold").await.unwrap(), Some(legacy.clone()));
        assert_eq!(store.meta.newest_signing_key().await.unwrap(), Some(fresh.clone()));
        store.meta.close().await;
        assert!(!contains(&database_bytes(dir.path()), &legacy.secret), "the legacy secret is gone from the file");
    }
}
