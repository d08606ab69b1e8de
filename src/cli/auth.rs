//! The CLI's auth commands: tokens, signed URLs and signing keys.

use anyhow::{Context, bail};

use super::{GrantArgs, S3KeyCommand, SigningCommand, TokenCommand, rfc3339};
use crate::auth::presign::{self, PresignParams, SignedFields};
use crate::auth::token::{self, Scope};
use crate::config::Settings;
use crate::names::{BucketName, ObjectKey, parse_attrs, parse_object_path};
use crate::store::{Grant, S3KeyRecord, SigningKey, Store, TokenRecord, unix_now};

/// The store's grant for `token create` and `s3-key create`: the bucket found, the prefix and scope checked, the
/// expiry computed.
async fn grant(store: &Store, args: GrantArgs) -> anyhow::Result<Grant> {
    let GrantArgs { bucket, prefix, scope, expires_in } = args;
    let bucket = BucketName::parse(&bucket)?;
    let scope = Scope::parse(&scope).with_context(|| format!("invalid scope {scope:?}: use read, write or admin"))?;
    if !prefix.is_empty() {
        // A prefix is a key prefix: hold it to the key rules (a trailing `/` is fine).
        ObjectKey::parse(&prefix).context("invalid prefix")?;
    }
    let bucket = crate::store::require_bucket(store.meta.bucket(&bucket).await?, &bucket)?;
    let now = unix_now();
    let expires_at = match expires_in {
        Some(0) => bail!("--expires-in must be at least 1 second"),
        Some(secs) => Some(now.saturating_add(i64::try_from(secs).context("--expires-in is too large")?)),
        None => None,
    };
    Ok(Grant {
        bucket_id: bucket.id,
        bucket_name: bucket.name,
        prefix,
        scope,
        created_at: now,
        expires_at,
        revoked_at: None,
    })
}

/// A credential as the list commands print it: its id and what it grants, `state` being `live`, `revoked` or
/// `expired`.
fn list_line(id: &str, grant: &Grant, now: i64) -> serde_json::Value {
    let state = if grant.revoked_at.is_some() {
        "revoked"
    } else if grant.expires_at.is_some_and(|at| now >= at) {
        "expired"
    } else {
        "live"
    };
    serde_json::json!({
        "id": id, "bucket": grant.bucket_name, "prefix": grant.prefix, "scope": grant.scope.as_str(),
        "created_at": rfc3339(grant.created_at), "expires_at": grant.expires_at.map(rfc3339),
        "revoked_at": grant.revoked_at.map(rfc3339), "state": state,
    })
}

pub async fn s3_key(store: &Store, command: S3KeyCommand) -> anyhow::Result<()> {
    match command {
        S3KeyCommand::Create { grant: args } => {
            let grant = grant(store, args).await?;
            let new = crate::auth::access_key::generate();
            store.meta.create_s3_key(&S3KeyRecord { id: new.id.clone(), secret: new.secret.clone(), grant }).await?;
            println!("{} {}", new.id, new.secret);
        }
        S3KeyCommand::Revoke { access_key_id } => {
            let id = access_key_id.trim();
            if !store.meta.revoke_s3_key(id, unix_now()).await? {
                bail!("no live S3 key with id {id}");
            }
            eprintln!("revoked S3 key {id}");
        }
        S3KeyCommand::List => {
            let now = unix_now();
            for k in store.meta.list_s3_keys().await? {
                println!("{}", list_line(&k.id, &k.grant, now));
            }
        }
    }
    Ok(())
}

pub async fn token(store: &Store, command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create { grant: args } => {
            let grant = grant(store, args).await?;
            let new = token::generate();
            store
                .meta
                .create_token(&TokenRecord { id: new.id.clone(), secret_hash: new.secret_hash.to_vec(), grant })
                .await?;
            println!("{}", new.token);
        }
        TokenCommand::Revoke { token: given } => {
            let id = token::id_of(given.trim()).context("not a token or token id")?;
            if !store.meta.revoke_token(id, unix_now()).await? {
                bail!("no live token with id {id}");
            }
            eprintln!("revoked token {id}");
        }
        TokenCommand::List => {
            let now = unix_now();
            for t in store.meta.list_tokens().await? {
                println!("{}", list_line(&t.id, &t.grant, now));
            }
        }
    }
    Ok(())
}

pub struct PresignRequest {
    pub bucket: String,
    pub key: String,
    pub expires_in: u64,
    pub base_url: String,
    pub response_content_disposition: Option<String>,
}

pub async fn presign(store: &Store, settings: &Settings, request: PresignRequest) -> anyhow::Result<()> {
    let bucket = BucketName::parse(&request.bucket)?;
    let key = ObjectKey::parse(&request.key)?;
    let max = settings.auth.presign_max_lifetime.as_secs();
    if request.expires_in == 0 || request.expires_in > max {
        bail!("--expires-in must be between 1 and {max} seconds (auth.presign_max_lifetime)");
    }
    if !(request.base_url.starts_with("http://") || request.base_url.starts_with("https://")) {
        bail!("--base-url must start with http:// or https://");
    }
    if let Some(d) = &request.response_content_disposition {
        parse_attrs(None, None, Some(d.clone()))?;
    }
    crate::store::require_bucket(store.meta.bucket(&bucket).await?, &bucket)?;
    let signing_key = match store.meta.newest_signing_key().await? {
        Some(k) => k,
        None => new_signing_key(store).await?,
    };
    let fields = SignedFields {
        method: "GET",
        bucket: bucket.as_str(),
        key: key.as_str(),
        expires: unix_now().saturating_add(request.expires_in as i64),
        key_id: &signing_key.id,
        response_disposition: request.response_content_disposition.as_deref(),
    };
    let signature = presign::sign(&signing_key.secret, &fields);
    println!("{}", presign::build_url(&request.base_url, &fields, &signature));
    Ok(())
}

pub async fn signing(store: &Store, command: SigningCommand) -> anyhow::Result<()> {
    match command {
        SigningCommand::Rotate => {
            let key = new_signing_key(store).await?;
            println!("{}", serde_json::json!({ "key_id": key.id, "created_at": rfc3339(key.created_at) }));
        }
        SigningCommand::Retire { key_id } => {
            if !store.meta.retire_signing_key(&key_id, unix_now()).await? {
                bail!("no active signing key {key_id}");
            }
            eprintln!("retired signing key {key_id}");
        }
        SigningCommand::List => {
            for k in store.meta.list_signing_keys().await? {
                println!(
                    "{}",
                    serde_json::json!({ "key_id": k.id, "created_at": rfc3339(k.created_at),
                        "retired_at": k.retired_at.map(rfc3339) })
                );
            }
        }
        SigningCommand::RevokeUrl { url } => {
            let params = verified_url(store, &url).await.context("not revoked")?;
            // The expiry is the signed one: an edited copy cannot make the revocation end (or be pruned) early.
            store.meta.revoke_signature(&params.signature, params.expires, unix_now()).await?;
            eprintln!("revoked the signed URL (until it expires at {})", rfc3339(params.expires));
        }
    }
    Ok(())
}

/// The parameters of a signed URL whose signature verifies against the key it names, exactly as the server
/// checks it; an error for anything else.
async fn verified_url(store: &Store, url: &str) -> anyhow::Result<PresignParams> {
    let uri: http::Uri = url.trim().parse().context("not a URL")?;
    let params = presign::parse_query(uri.query())?
        .context("not a signed URL: it has no bg-expires/bg-key/bg-sig parameters")?;
    let (bucket, key) = parse_object_path(uri.path()).context("not a signed URL of an object")?;
    let signing_key = store
        .meta
        .signing_key(&params.key_id)
        .await?
        .with_context(|| format!("the URL names signing key {}, which does not exist", params.key_id))?;
    if !params.verify(&signing_key.secret, bucket.as_str(), key.as_str()) {
        bail!("the URL's signature does not verify (was the URL changed or cut short?)");
    }
    Ok(params)
}

async fn new_signing_key(store: &Store) -> anyhow::Result<SigningKey> {
    let mut id = [0u8; 4];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id).context("no OS randomness")?;
    getrandom::fill(&mut secret).context("no OS randomness")?;
    let key = SigningKey {
        id: format!("k{}", hex::encode(id)),
        secret: secret.to_vec(),
        created_at: unix_now(),
        retired_at: None,
    };
    store.meta.create_signing_key(&key).await?;
    Ok(key)
}
