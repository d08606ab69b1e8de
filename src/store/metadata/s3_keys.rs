//! S3 access keys: the secret is sealed on insert and opened on read (`store::sealing`), so callers see plain
//! secrets and the database never holds one in the clear.

use super::auth::{CredentialRow, CredentialTable, Rights};
use super::{Backend, Metadata, MetadataError};
use crate::store::sealing;

/// An S3 access key as the server uses it: its secret opened.
#[derive(Clone, PartialEq, Eq)]
pub struct S3KeyRecord {
    /// The access key id.
    pub id: String,
    /// The secret access key (the SigV4 signing secret).
    pub secret: String,
    pub rights: Rights,
}

/// Never prints the secret.
impl std::fmt::Debug for S3KeyRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3KeyRecord")
            .field("id", &self.id)
            .field("grants", &self.rights.grants)
            .field("expires_at", &self.rights.expires_at)
            .field("revoked_at", &self.rights.revoked_at)
            .finish_non_exhaustive()
    }
}

pub(super) const S3_KEYS: CredentialTable = CredentialTable {
    table: "s3_keys",
    secret_column: "secret",
    grants: "s3_key_grants",
    owner: "key_id",
    what: "S3 key",
};

/// The associated data a secret is sealed with: its own id, in a namespace of its own, so a sealed secret moved
/// to another row, or into `signing_keys`, does not open.
fn sealing_label(id: &str) -> String {
    format!("s3_key:{id}")
}

impl Metadata {
    pub async fn create_s3_key(&self, key: &S3KeyRecord) -> Result<(), MetadataError> {
        let sealed = sealing::seal(
            self.secrets_key()?,
            &sealing_label(&key.id),
            key.secret.as_bytes(),
            super::auth::fresh_nonce()?,
        );
        self.insert_credential(&S3_KEYS, &key.id, &sealed, &key.rights).await
    }

    pub async fn s3_key(&self, id: &str) -> Result<Option<S3KeyRecord>, MetadataError> {
        let found = self.credentials(&S3_KEYS, Some(id)).await?.into_iter().next();
        found.map(|(row, rights)| self.open_s3_key(row, rights)).transpose()
    }

    pub async fn list_s3_keys(&self) -> Result<Vec<S3KeyRecord>, MetadataError> {
        let found = self.credentials(&S3_KEYS, None).await?;
        found.into_iter().map(|(row, rights)| self.open_s3_key(row, rights)).collect()
    }

    /// Marks an access key revoked; `false` when there is no such live key.
    pub async fn revoke_s3_key(&self, id: &str, now: i64) -> Result<bool, MetadataError> {
        self.stamp_once("UPDATE s3_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL", id, now).await
    }

    /// Whether any access key is stored: its secret is sealed, so a missing secrets key file is then an error.
    /// A database from before migration 0010 (read before it is migrated) has none.
    pub async fn has_s3_keys(&self) -> Result<bool, MetadataError> {
        // Both refuse a statement naming a missing table when they prepare it, so ask first.
        let table: bool = match &self.backend {
            Backend::Sqlite(pool) => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 's3_keys')",
                )
                .fetch_one(pool)
                .await?
            }
            Backend::Postgres(pool) => {
                sqlx::query_scalar("SELECT to_regclass('s3_keys') IS NOT NULL").fetch_one(pool).await?
            }
        };
        if !table {
            return Ok(false);
        }
        let found: bool = with_pool!(&self.backend, pool =>
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM s3_keys)").fetch_one(pool).await?);
        Ok(found)
    }

    fn open_s3_key(&self, r: CredentialRow, rights: Rights) -> Result<S3KeyRecord, MetadataError> {
        if !sealing::is_sealed(&r.secret) {
            return Err(MetadataError::Invalid(format!("S3 key {} is not sealed", r.id)));
        }
        let secret = sealing::open(self.secrets_key()?, &sealing_label(&r.id), &r.secret)?;
        let secret = String::from_utf8(secret)
            .map_err(|_| MetadataError::Invalid(format!("S3 key {} has a secret that is not text", r.id)))?;
        Ok(S3KeyRecord { id: r.id, secret, rights })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::names::BucketName;
    use crate::store::metadata::{Scope, TestBackend, test_database_url};
    use crate::store::{Catchup, ChangeKind};

    on_both_backends!(keys_are_sealed_read_back_revoked_logged_and_go_with_their_bucket);
    async fn keys_are_sealed_read_back_revoked_logged_and_go_with_their_bucket(backend: TestBackend) {
        let dir = tempfile::tempdir().unwrap();
        let url = test_database_url(backend, dir.path()).await;
        let store = crate::store::Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        let meta = &store.meta;
        let bucket = meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let start = meta.feed().last_change().await.unwrap();
        assert!(!meta.has_s3_keys().await.unwrap());
        let key = S3KeyRecord {
            id: "AKBGTESTTESTTESTTEST".into(),
            secret: "s".repeat(40),
            rights: Rights {
                created_at: 3,
                expires_at: Some(10),
                ..Rights::prefixed(bucket.id, "bkt", Scope::Read, "p/".into())
            },
        };
        meta.create_s3_key(&key).await.unwrap();
        assert!(meta.has_s3_keys().await.unwrap());
        assert_eq!(meta.s3_key(&key.id).await.unwrap(), Some(key.clone()));
        assert_eq!(meta.list_s3_keys().await.unwrap(), vec![key.clone()]);
        assert!(!format!("{key:?}").contains(&key.secret), "Debug hides the secret");
        let stored: Vec<u8> = with_pool!(&meta.backend, pool =>
            sqlx::query_scalar("SELECT secret FROM s3_keys").fetch_one(pool).await.unwrap());
        assert!(!stored.windows(40).any(|w| w == key.secret.as_bytes()), "sealed at rest");

        assert!(meta.revoke_s3_key(&key.id, 5).await.unwrap());
        assert!(!meta.revoke_s3_key(&key.id, 6).await.unwrap(), "already revoked");
        assert_eq!(meta.s3_key(&key.id).await.unwrap().unwrap().rights.revoked_at, Some(5));
        store.delete_bucket(&BucketName::parse("bkt").unwrap(), false).await.unwrap();
        assert_eq!(meta.s3_key(&key.id).await.unwrap(), None, "gone with its bucket");
        let Catchup::Changes(changes) = meta.feed().changes_since(start).await.unwrap() else {
            panic!("nothing was pruned")
        };
        let kinds: Vec<_> = changes.into_iter().filter(|c| c.kind == ChangeKind::S3Key).map(|c| c.name).collect();
        // Insert, its grant, the one-grant columns older releases read; revoke; its grant and itself deleted.
        assert_eq!(kinds, vec![key.id.clone(); 6], "insert, revoke, delete");
    }

    on_both_backends!(sealed_s3_keys_need_their_secrets_key_file);
    async fn sealed_s3_keys_need_their_secrets_key_file(backend: TestBackend) {
        let dir = tempfile::tempdir().unwrap();
        let url = test_database_url(backend, dir.path()).await;
        let store = crate::store::Store::open(dir.path(), &url, Duration::from_secs(5)).await.unwrap();
        let bucket = store.meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
        let key = S3KeyRecord {
            id: "AKBGBBBBBBBBBBBBBBBB".into(),
            secret: "t".repeat(40),
            rights: Rights::whole_bucket(bucket.id, "bkt", Scope::Read),
        };
        store.meta.create_s3_key(&key).await.unwrap();
        store.meta.close().await;
        std::fs::remove_file(dir.path().join(crate::store::secrets_key::SECRETS_KEY_FILE)).unwrap();
        let err = crate::store::Store::open(dir.path(), &url, Duration::from_secs(5)).await.err().expect("refused");
        assert!(format!("{err:#}").contains("is missing"), "{err:#}");
    }
}
