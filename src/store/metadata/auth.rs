//! Tokens, signing keys (sealed on insert, opened on read) and revoked signatures; and what tokens and S3 keys
//! both store, [`Rights`]: a lifetime and [`Grant`]s (each a bucket or every bucket, a prefix and a [`Scope`]),
//! rows of `token_grants` / `s3_key_grants` in order, with the one-grant columns older releases read kept too.

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

/// The bucket a grant names, with its name as it was read (for listings and `token list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantedBucket {
    pub id: i64,
    pub name: String,
}

/// One grant of a credential: `scope` on the keys under `prefix` of one bucket, or of every bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// `None`: every bucket (`--grant '*:admin'`).
    pub bucket: Option<GrantedBucket>,
    pub prefix: String,
    pub scope: Scope,
}

/// What a stored credential (a token or an S3 key) grants, and for how long: what both kinds share. The rules
/// that decide with it (`Rights::check`) are `auth`'s; a decision is `auth::AllowedRead` or `auth::AllowedS3Request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    /// In the order they were given; a request needs one that covers it.
    pub grants: Vec<Grant>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

impl Rights {
    /// A test's rights: `scope` on the whole bucket, made at 0, live and never expiring.
    #[cfg(test)]
    pub fn whole_bucket(bucket_id: i64, bucket_name: &str, scope: Scope) -> Rights {
        Rights::one(Grant {
            bucket: Some(GrantedBucket { id: bucket_id, name: bucket_name.into() }),
            prefix: String::new(),
            scope,
        })
    }

    /// A test's rights: `scope` on the keys under `prefix` of one bucket, made at 0, live and never expiring.
    #[cfg(test)]
    pub fn prefixed(bucket_id: i64, bucket_name: &str, scope: Scope, prefix: String) -> Rights {
        let mut rights = Rights::whole_bucket(bucket_id, bucket_name, scope);
        rights.grants[0].prefix = prefix;
        rights
    }

    /// A test's rights: one grant, made at 0, live and never expiring.
    #[cfg(test)]
    pub fn one(grant: Grant) -> Rights {
        Rights { grants: vec![grant], created_at: 0, expires_at: None, revoked_at: None }
    }
}

/// A bearer token's stored form: never the token itself, only its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: String,
    pub secret_hash: Vec<u8>,
    pub rights: Rights,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningKey {
    pub id: String,
    pub secret: Vec<u8>,
    pub created_at: i64,
    pub retired_at: Option<i64>,
}

/// Where one kind of credential is stored: its table (`id`, the secret column, the lifetime columns, and the
/// one-grant columns older releases read) and its grants' table.
pub(super) struct CredentialTable {
    pub(super) table: &'static str,
    pub(super) secret_column: &'static str,
    pub(super) grants: &'static str,
    /// The grants' column naming their credential.
    pub(super) owner: &'static str,
    /// How errors name one (`token`, `S3 key`).
    pub(super) what: &'static str,
}

pub(super) const TOKENS: CredentialTable = CredentialTable {
    table: "tokens",
    secret_column: "secret_hash",
    grants: "token_grants",
    owner: "token_id",
    what: "token",
};

/// A credential's row, its secret as stored.
pub(super) struct CredentialRow {
    pub(super) id: String,
    pub(super) secret: Vec<u8>,
    created_at: i64,
    expires_at: Option<i64>,
    revoked_at: Option<i64>,
}
from_row!(CredentialRow { id, secret, created_at, expires_at, revoked_at });

/// A grant row as stored, with its bucket's name: the scope still text.
struct GrantRow {
    owner: String,
    bucket_id: Option<i64>,
    bucket_name: Option<String>,
    prefix: String,
    scope: String,
}
from_row!(GrantRow { owner, bucket_id, bucket_name, prefix, scope });

impl GrantRow {
    /// The grant, its scope parsed; `what` names the credential in the error (`token 0123…`).
    fn parse(self, what: &str) -> Result<Grant, MetadataError> {
        let scope = Scope::parse(&self.scope).ok_or_else(|| {
            MetadataError::Invalid(format!("{what} {} has an unknown scope {:?}", self.owner, self.scope))
        })?;
        let bucket = match (self.bucket_id, self.bucket_name) {
            (Some(id), Some(name)) => Some(GrantedBucket { id, name }),
            (None, _) => None,
            (Some(id), None) => {
                return Err(MetadataError::Invalid(format!("{what} {} names a missing bucket {id}", self.owner)));
            }
        };
        Ok(Grant { bucket, prefix: self.prefix, scope })
    }
}

impl Metadata {
    pub async fn create_token(&self, token: &TokenRecord) -> Result<(), MetadataError> {
        self.insert_credential(&TOKENS, &token.id, &token.secret_hash, &token.rights).await
    }

    /// Inserts a credential: its row (`id`, `secret`, the lifetime), its grants in order, then the one-grant
    /// columns older releases read, set to its first grant that names a bucket (an update, so the trigger that
    /// turns an older release's insert into a grant leaves it alone). One transaction.
    pub(super) async fn insert_credential(
        &self,
        t: &CredentialTable,
        id: &str,
        secret: &[u8],
        rights: &Rights,
    ) -> Result<(), MetadataError> {
        let insert = format!(
            "INSERT INTO {} (id, {}, created_at, expires_at) VALUES ($1, $2, $3, $4)",
            t.table, t.secret_column
        );
        let insert_grant = format!(
            "INSERT INTO {} ({}, position, bucket_id, prefix, scope) VALUES ($1, $2, $3, $4, $5)",
            t.grants, t.owner
        );
        let legacy = format!("UPDATE {} SET bucket_id = $2, prefix = $3, scope = $4 WHERE id = $1", t.table);
        let mut tx = self.begin_write().await?;
        with_tx!(&mut tx.tx, conn => {
            sqlx::query(&insert)
                .bind(id)
                .bind(secret)
                .bind(rights.created_at)
                .bind(rights.expires_at)
                .execute(&mut **conn)
                .await?;
            for (position, grant) in rights.grants.iter().enumerate() {
                sqlx::query(&insert_grant)
                    .bind(id)
                    .bind(position as i64)
                    .bind(grant.bucket.as_ref().map(|b| b.id))
                    .bind(&grant.prefix)
                    .bind(grant.scope.as_str())
                    .execute(&mut **conn)
                    .await?;
            }
            if let Some((grant, bucket)) = rights.grants.iter().find_map(|g| Some((g, g.bucket.as_ref()?))) {
                sqlx::query(&legacy)
                    .bind(id)
                    .bind(bucket.id)
                    .bind(&grant.prefix)
                    .bind(grant.scope.as_str())
                    .execute(&mut **conn)
                    .await?;
            }
            Ok::<_, MetadataError>(())
        })?;
        tx.commit().await
    }

    /// The credentials of one kind with their rights: the one `id`, or every one (oldest first).
    pub(super) async fn credentials(
        &self,
        t: &CredentialTable,
        id: Option<&str>,
    ) -> Result<Vec<(CredentialRow, Rights)>, MetadataError> {
        // `coalesce($1, id)`: one statement for one credential and for all of them, on both backends.
        let rows_sql = format!(
            "SELECT id, {} AS secret, created_at, expires_at, revoked_at FROM {} WHERE id = coalesce($1, id)
             ORDER BY created_at, id",
            t.secret_column, t.table
        );
        let grants_sql = format!(
            "SELECT g.{owner} AS owner, g.bucket_id, b.name AS bucket_name, g.prefix, g.scope
             FROM {grants} g LEFT JOIN buckets b ON b.id = g.bucket_id WHERE g.{owner} = coalesce($1, g.{owner})
             ORDER BY g.{owner}, g.position",
            owner = t.owner,
            grants = t.grants,
        );
        let (rows, grants): (Vec<CredentialRow>, Vec<GrantRow>) = with_pool!(&self.backend, pool => (
            sqlx::query_as(&rows_sql).bind(id).fetch_all(pool).await?,
            sqlx::query_as(&grants_sql).bind(id).fetch_all(pool).await?,
        ));
        let mut by_owner: std::collections::HashMap<String, Vec<Grant>> = std::collections::HashMap::new();
        for g in grants {
            let owner = g.owner.clone();
            by_owner.entry(owner).or_default().push(g.parse(t.what)?);
        }
        Ok(rows
            .into_iter()
            .map(|r| {
                let rights = Rights {
                    grants: by_owner.remove(&r.id).unwrap_or_default(),
                    created_at: r.created_at,
                    expires_at: r.expires_at,
                    revoked_at: r.revoked_at,
                };
                (r, rights)
            })
            .collect())
    }

    pub async fn token(&self, id: &str) -> Result<Option<TokenRecord>, MetadataError> {
        Ok(self.credentials(&TOKENS, Some(id)).await?.into_iter().next().map(token_record))
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>, MetadataError> {
        Ok(self.credentials(&TOKENS, None).await?.into_iter().map(token_record).collect())
    }
}

/// A signing key as stored: its secret sealed (or, from before sealing, in the clear).
struct SigningKeyRow {
    id: String,
    secret: Vec<u8>,
    created_at: i64,
    retired_at: Option<i64>,
}
from_row!(SigningKeyRow { id, secret, created_at, retired_at });

struct StoredSecret {
    id: String,
    secret: Vec<u8>,
}
from_row!(StoredSecret { id, secret });

fn token_record((row, rights): (CredentialRow, Rights)) -> TokenRecord {
    TokenRecord { id: row.id, secret_hash: row.secret, rights }
}

impl Metadata {
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
            // At most a batch per revocation: the rest go with the next ones.
            sqlx::query(
                "DELETE FROM revoked_signatures WHERE signature IN
                     (SELECT signature FROM revoked_signatures WHERE expires_at < $1 LIMIT $2)",
            )
            .bind(now)
            .bind(super::PRUNE_ON_WRITE)
            .execute(&mut **sqlite)
            .await?;
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
            rights: Rights {
                created_at: 3,
                expires_at: Some(10),
                ..Rights::prefixed(bucket.id, "bkt", Scope::Write, "p/".into())
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
                sqlx::query("UPDATE token_grants SET scope = 'owner'").execute(&mut *conn).await.unwrap();
                sqlx::query("PRAGMA ignore_check_constraints = OFF").execute(&mut *conn).await.unwrap();
            }
            Backend::Postgres(pool) => {
                let drop = "ALTER TABLE token_grants DROP CONSTRAINT token_grants_scope_check";
                sqlx::query(drop).execute(pool).await.unwrap();
                sqlx::query("UPDATE token_grants SET scope = 'owner'").execute(pool).await.unwrap();
            }
        }
        let err = meta.token(&token.id).await.unwrap_err();
        assert!(err.to_string().contains("unknown scope \"owner\""), "{err}");
    }

    on_both_backends!(several_grants_read_back_in_order_and_a_bucket_takes_only_its_own);
    async fn several_grants_read_back_in_order_and_a_bucket_takes_only_its_own(backend: TestBackend) {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::store::metadata::test_database_url(backend, dir.path()).await;
        let store = crate::store::Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        let meta = &store.meta;
        let a = meta.create_bucket(&BucketName::parse("aaa").unwrap(), false, 0).await.unwrap();
        let b = meta.create_bucket(&BucketName::parse("bbb").unwrap(), false, 0).await.unwrap();
        let on = |bucket: &crate::store::Bucket, prefix: &str, scope| Grant {
            bucket: Some(GrantedBucket { id: bucket.id, name: bucket.name.clone() }),
            prefix: prefix.into(),
            scope,
        };
        let every = Grant { bucket: None, prefix: String::new(), scope: Scope::Admin };
        let token = |id: &str, grants: Vec<Grant>| TokenRecord {
            id: id.into(),
            secret_hash: vec![2; 32],
            rights: Rights { grants, created_at: 1, expires_at: None, revoked_at: None },
        };
        let several = token("several00000", vec![on(&b, "x/", Scope::Write), every.clone(), on(&a, "", Scope::Read)]);
        let only_a = token("onlya0000000", vec![on(&a, "", Scope::Write), on(&a, "p/", Scope::Admin)]);
        let only_every = token("onlyevery000", vec![every.clone()]);
        for t in [&several, &only_a, &only_every] {
            meta.create_token(t).await.unwrap();
            assert_eq!(meta.token(&t.id).await.unwrap().as_ref(), Some(t), "read back as given, in order");
        }
        // The columns the release before grants reads: the first grant that names a bucket, else NULL.
        let legacy: Vec<(String, Option<i64>, Option<String>)> = with_pool!(&meta.backend, pool =>
            sqlx::query_as("SELECT id, bucket_id, scope FROM tokens ORDER BY id").fetch_all(pool).await.unwrap());
        assert_eq!(
            legacy,
            vec![
                ("onlya0000000".into(), Some(a.id), Some("write".into())),
                ("onlyevery000".into(), None, None),
                ("several00000".into(), Some(b.id), Some("write".into())),
            ]
        );

        let deleted = store.delete_bucket(&BucketName::parse("aaa").unwrap(), false).await.unwrap();
        assert!(matches!(deleted, crate::store::BucketDeletion::Deleted { tokens: 1, .. }), "{deleted:?}");
        assert_eq!(meta.token(&only_a.id).await.unwrap(), None, "it granted that bucket only");
        let left = meta.token(&several.id).await.unwrap().unwrap();
        assert_eq!(left.rights.grants, vec![on(&b, "x/", Scope::Write), every], "the others lose its grants");
        assert_eq!(meta.token(&only_every.id).await.unwrap().as_ref(), Some(&only_every));
        let ids: Vec<String> = meta.list_tokens().await.unwrap().into_iter().map(|t| t.id).collect();
        assert_eq!(ids, ["onlyevery000", "several00000"]);
    }

    on_both_backends!(credentials_from_before_grants_keep_their_meaning);
    async fn credentials_from_before_grants_keep_their_meaning(backend: TestBackend) {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::store::metadata::test_database_url(backend, dir.path()).await;
        // The schema as the release before grants left it: the migrations up to 0017 (a test may build a
        // Migrator from sqlx's semver-exempt fields: nothing else migrates part-way).
        let before = |migrator: &sqlx::migrate::Migrator| sqlx::migrate::Migrator {
            migrations: migrator.migrations.iter().filter(|m| m.version <= 17).cloned().collect(),
            ..sqlx::migrate::Migrator::DEFAULT
        };
        // The release before writes tokens and S3 keys with their one grant in their own columns.
        let old_rows = "INSERT INTO buckets (name, public, created_at) VALUES ('bkt', false, 0);
             INSERT INTO tokens (id, secret_hash, bucket_id, prefix, scope, created_at)
                 SELECT 'oldtoken0000', X'00', id, 'p/', 'write', 5 FROM buckets";
        let late_row = "INSERT INTO tokens (id, secret_hash, bucket_id, prefix, scope, created_at)
             SELECT 'latetoken000', X'00', id, '', 'read', 6 FROM buckets";
        match &url {
            crate::config::DatabaseUrl::Sqlite(path) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path).create_if_missing(true);
                let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
                before(&super::super::migrations::MIGRATOR).run(&pool).await.unwrap();
                sqlx::raw_sql(old_rows).execute(&pool).await.unwrap();
                pool.close().await;
            }
            crate::config::DatabaseUrl::Postgres(pg) => {
                let pool = sqlx::PgPool::connect(pg.expose_secret()).await.unwrap();
                before(&super::super::migrations::PG_MIGRATOR).run(&pool).await.unwrap();
                sqlx::raw_sql(&old_rows.replace("X'00'", "'\\x00'::bytea")).execute(&pool).await.unwrap();
                pool.close().await;
            }
        }
        let meta = Metadata::open(&url, dir.path(), Duration::from_secs(5)).await.unwrap();
        let bucket = meta.bucket(&BucketName::parse("bkt").unwrap()).await.unwrap().unwrap();
        let old = meta.token("oldtoken0000").await.unwrap().unwrap();
        assert_eq!(
            old.rights,
            Rights { created_at: 5, ..Rights::prefixed(bucket.id, "bkt", Scope::Write, "p/".into()) }
        );
        // A release before grants, still running beside this one (a rollout), inserts the old way: its row gets
        // its grant.
        let late_row = match backend {
            TestBackend::Sqlite => late_row.to_owned(),
            TestBackend::Postgres => late_row.replace("X'00'", "'\\x00'::bytea"),
        };
        with_pool!(&meta.backend, pool => sqlx::raw_sql(&late_row).execute(pool).await.unwrap().rows_affected());
        let late = meta.token("latetoken000").await.unwrap().unwrap();
        assert_eq!(late.rights, Rights { created_at: 6, ..Rights::whole_bucket(bucket.id, "bkt", Scope::Read) });
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
