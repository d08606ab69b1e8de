//! The CLI's auth commands: tokens and S3 keys (`--grant BUCKET[/PREFIX]:SCOPE`, parsed by the pure
//! `parse_grant`), signed URLs and signing keys.

use crate::throttle::{LimitSet, Subject};
use anyhow::{Context, bail};

use super::{GrantArgs, S3KeyCommand, SigningCommand, TokenCommand, rfc3339};
use crate::auth::presign::{self, PresignParams, SignedFields};
use crate::auth::token::{self, Scope};
use crate::config::Settings;
use crate::names::{BucketName, ObjectKey, parse_attrs, parse_object_path};
use crate::store::{Grant, GrantedBucket, Rights, S3KeyRecord, SigningKey, Store, TokenRecord, unix_now};

/// One `--grant BUCKET[/PREFIX]:SCOPE`, parsed: the last `:` separates the scope, the first `/` the prefix;
/// `*` names every bucket. Pure; the bucket is looked up by [`rights`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantSpec {
    /// `None`: every bucket (`*`).
    pub bucket: Option<BucketName>,
    pub prefix: String,
    pub scope: Scope,
}

pub fn parse_grant(spec: &str) -> anyhow::Result<GrantSpec> {
    let usage = || format!("invalid --grant {spec:?}: expected BUCKET[/PREFIX]:SCOPE (or '*:admin')");
    let (target, scope) = spec.rsplit_once(':').with_context(usage)?;
    let scope = Scope::parse(scope).with_context(|| format!("{}: the scope is read, write or admin", usage()))?;
    let (bucket, prefix) = target.split_once('/').unwrap_or((target, ""));
    let bucket = match bucket {
        "*" => None,
        name => Some(BucketName::parse(name).with_context(usage)?),
    };
    check_prefix(prefix)?;
    Ok(GrantSpec { bucket, prefix: prefix.to_owned(), scope })
}

/// A prefix is a key prefix: hold it to the key rules (a trailing `/` is fine).
fn check_prefix(prefix: &str) -> anyhow::Result<()> {
    if !prefix.is_empty() {
        ObjectKey::parse(prefix).with_context(|| format!("invalid prefix {prefix:?}"))?;
    }
    Ok(())
}

/// The store's rights for `token create` and `s3-key create`: the one-grant form (`--bucket`, `--prefix`,
/// `--scope`) first, then each `--grant`, every bucket found; created at `now`, the expiry counted from it.
async fn rights(store: &Store, args: GrantArgs, now: i64) -> anyhow::Result<Rights> {
    let GrantArgs { bucket, prefix, scope, grants, expires_in } = args;
    let mut specs = Vec::with_capacity(grants.len() + 1);
    match bucket {
        Some(bucket) => {
            let scope = scope.as_deref().unwrap_or("read");
            let scope =
                Scope::parse(scope).with_context(|| format!("invalid scope {scope:?}: use read, write or admin"))?;
            let prefix = prefix.unwrap_or_default();
            check_prefix(&prefix)?;
            specs.push(GrantSpec { bucket: Some(BucketName::parse(&bucket)?), prefix, scope });
        }
        None if prefix.is_some() || scope.is_some() => bail!("--prefix and --scope go with --bucket"),
        None if grants.is_empty() => bail!("give --bucket NAME or --grant BUCKET[/PREFIX]:SCOPE"),
        None => {}
    }
    for spec in &grants {
        specs.push(parse_grant(spec)?);
    }
    let mut granted = Vec::with_capacity(specs.len());
    for GrantSpec { bucket, prefix, scope } in specs {
        let bucket = match bucket {
            Some(name) => {
                let found = crate::store::require_bucket(store.meta.bucket(&name).await?, &name)?;
                Some(GrantedBucket { id: found.id, name: found.name })
            }
            None => None,
        };
        granted.push(Grant { bucket, prefix, scope });
    }
    let expires_at = match expires_in {
        Some(0) => bail!("--expires-in must be at least 1 second"),
        Some(secs) => Some(now.saturating_add(i64::try_from(secs).context("--expires-in is too large")?)),
        None => None,
    };
    Ok(Rights { grants: granted, created_at: now, expires_at, revoked_at: None })
}

/// How a grant is written on the command line and in listings: `BUCKET[/PREFIX]:SCOPE`, `*` for every bucket.
fn grant_spec(grant: &Grant) -> String {
    let bucket = grant.bucket.as_ref().map_or("*", |b| b.name.as_str());
    let slash = if grant.prefix.is_empty() { "" } else { "/" };
    format!("{bucket}{slash}{}:{}", grant.prefix, grant.scope.as_str())
}

/// A credential as the list commands print it: its id and what it grants (`grants`, as `--grant` takes them;
/// `bucket`, `prefix` and `scope`, its first grant's, as before credentials had several), `state` being `live`,
/// `revoked` or `expired`.
fn list_line(id: &str, rights: &Rights, now: i64, limit: Option<&LimitSet>) -> serde_json::Value {
    let state = if rights.revoked_at.is_some() {
        "revoked"
    } else if rights.expires_at.is_some_and(|at| now >= at) {
        "expired"
    } else {
        "live"
    };
    let first = rights.grants.first();
    serde_json::json!({
        "id": id,
        "bucket": first.map(|g| g.bucket.as_ref().map_or("*", |b| b.name.as_str())),
        "prefix": first.map(|g| g.prefix.as_str()),
        "scope": first.map(|g| g.scope.as_str()),
        "grants": rights.grants.iter().map(grant_spec).collect::<Vec<_>>(),
        "created_at": rfc3339(rights.created_at), "expires_at": rights.expires_at.map(rfc3339),
        "revoked_at": rights.revoked_at.map(rfc3339), "state": state,
        "limit": limit.map(LimitSet::describe),
    })
}

/// The limit set on `subject` itself (`token list` and `s3-key list` show it; the default is not theirs).
fn limit_on(limits: &[(Subject, LimitSet)], subject: Subject) -> Option<&LimitSet> {
    limits.iter().find(|(s, _)| *s == subject).map(|(_, l)| l)
}

pub async fn s3_key(store: &Store, command: S3KeyCommand) -> anyhow::Result<()> {
    match command {
        S3KeyCommand::Create { grant: args } => {
            let (id, secret) = create_s3_key(store, args, unix_now()).await?;
            println!("{id} {secret}");
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
            let limits = store.meta.limits().await?;
            for k in store.meta.list_s3_keys().await? {
                let limit = limit_on(&limits, Subject::S3Key(k.id.clone()));
                println!("{}", list_line(&k.id, &k.rights, now, limit));
            }
        }
    }
    Ok(())
}

/// `s3-key create` as of `now`: the new key's id and secret.
pub async fn create_s3_key(store: &Store, args: GrantArgs, now: i64) -> anyhow::Result<(String, String)> {
    let rights = rights(store, args, now).await?;
    let new = crate::auth::access_key::generate();
    store.meta.create_s3_key(&S3KeyRecord { id: new.id.clone(), secret: new.secret.clone(), rights }).await?;
    Ok((new.id, new.secret))
}

/// `token create` as of `now` (the CLI's clock; a test's fixture may name another, e.g. an hour ago for a token
/// that has already expired): the new token.
pub async fn create_token(store: &Store, args: GrantArgs, now: i64) -> anyhow::Result<String> {
    let rights = rights(store, args, now).await?;
    let new = token::generate();
    store.meta.create_token(&TokenRecord { id: new.id.clone(), secret_hash: new.secret_hash.to_vec(), rights }).await?;
    Ok(new.token)
}

pub async fn token(store: &Store, command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create { grant: args } => println!("{}", create_token(store, args, unix_now()).await?),
        TokenCommand::Revoke { token: given } => {
            let id = token::id_of(given.trim()).context("not a token or token id")?;
            if !store.meta.revoke_token(id, unix_now()).await? {
                bail!("no live token with id {id}");
            }
            eprintln!("revoked token {id}");
        }
        TokenCommand::List => {
            let now = unix_now();
            let limits = store.meta.limits().await?;
            for t in store.meta.list_tokens().await? {
                let limit = limit_on(&limits, Subject::Token(t.id.clone()));
                println!("{}", list_line(&t.id, &t.rights, now, limit));
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
    println!("{}", presigned_url(store, settings, request, unix_now()).await?);
    Ok(())
}

/// The signed URL `presign` prints, signed as of `now` (its expiry counted from it): the CLI passes its clock, a
/// test's fixture may pass an earlier time for a URL that has already expired.
pub async fn presigned_url(
    store: &Store,
    settings: &Settings,
    request: PresignRequest,
    now: i64,
) -> anyhow::Result<String> {
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
        expires: now.saturating_add(request.expires_in as i64),
        key_id: &signing_key.id,
        response_disposition: request.response_content_disposition.as_deref(),
    };
    let signature = presign::sign(&signing_key.secret, &fields);
    Ok(presign::build_url(&request.base_url, &fields, &signature))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_parse_as_bucket_prefix_and_scope() {
        let spec = |bucket: Option<&str>, prefix: &str, scope| GrantSpec {
            bucket: bucket.map(|b| BucketName::parse(b).unwrap()),
            prefix: prefix.into(),
            scope,
        };
        assert_eq!(parse_grant("releases:read").unwrap(), spec(Some("releases"), "", Scope::Read));
        assert_eq!(parse_grant("cicd/builds/:write").unwrap(), spec(Some("cicd"), "builds/", Scope::Write));
        assert_eq!(parse_grant("*:admin").unwrap(), spec(None, "", Scope::Admin));
        assert_eq!(parse_grant("*/logs/:read").unwrap(), spec(None, "logs/", Scope::Read));
        // The last `:` separates the scope, so a prefix may hold one.
        assert_eq!(parse_grant("bkt/x:y:read").unwrap(), spec(Some("bkt"), "x:y", Scope::Read));
        for bad in ["releases", "releases:", "releases:owner", ":read", "Bad_Name:read", "b/../x:read", ""] {
            let err = parse_grant(bad).unwrap_err();
            assert!(
                format!("{err:#}").contains("BUCKET[/PREFIX]:SCOPE") || format!("{err:#}").contains("prefix"),
                "{bad}: {err:#}"
            );
        }
    }

    #[test]
    fn grants_print_as_they_are_given() {
        let g = |bucket: Option<&str>, prefix: &str, scope| Grant {
            bucket: bucket.map(|name| GrantedBucket { id: 1, name: name.into() }),
            prefix: prefix.into(),
            scope,
        };
        assert_eq!(grant_spec(&g(Some("cicd"), "builds/", Scope::Write)), "cicd/builds/:write");
        assert_eq!(grant_spec(&g(Some("cicd"), "", Scope::Read)), "cicd:read");
        assert_eq!(grant_spec(&g(None, "", Scope::Admin)), "*:admin");
        for printed in ["cicd/builds/:write", "cicd:read", "*:admin"] {
            let parsed = parse_grant(printed).unwrap();
            let back = g(parsed.bucket.as_ref().map(|b| b.as_str()), &parsed.prefix, parsed.scope);
            assert_eq!(grant_spec(&back), printed, "round trip");
        }
    }
}
