//! `blobgate blobs migrate --to s3://…`: the move from blobs in the data dir to an object store.
//!
//! Every blob file an object references is uploaded unless the store already holds it with its size (its name is
//! its content's hash, so that is the same blob): running it again after an interruption uploads only what is
//! missing. Servers keep serving from the data dir meanwhile; uploads made during the copy are caught by running
//! it again once they are stopped (README, "Moving blobs to an object store").

use anyhow::Context;

use crate::config::{ObjectStoreLocation, Settings};
use crate::store::Store;
use crate::store::remote::RemoteBlobs;

pub(super) async fn migrate(store: &Store, to: &str, settings: &Settings) -> anyhow::Result<()> {
    let location = ObjectStoreLocation::parse(to, &settings.blob_store)?;
    let mut remote = RemoteBlobs::new(&location)?;
    if let Some(secrets) = store.meta.secrets() {
        remote = remote.with_manifest_key(crate::store::manifest::ManifestKey::derive(secrets));
    }
    remote.ping().await.with_context(|| format!("cannot reach the object store {location}"))?;
    let blobs = store.blobs.clone();
    let hashes = tokio::task::spawn_blocking(move || blobs.list_hashes()).await??;
    let (mut uploaded, mut present, mut unreferenced, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    for sha in hashes {
        if !store.meta.blob_is_referenced(&sha).await? {
            unreferenced += 1;
            continue;
        }
        let path = store.blobs.path_of(&sha);
        let size = std::fs::metadata(&path).with_context(|| format!("cannot stat blob {sha}"))?.len();
        if remote.upload(path, &sha, size).await.with_context(|| format!("cannot upload blob {sha} to {location}"))? {
            uploaded += 1;
            bytes += size;
        } else {
            present += 1;
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "to": location.to_string(),
            "uploaded": uploaded,
            "uploaded_bytes": bytes,
            "already_present": present,
            "skipped_unreferenced": unreferenced,
        })
    );
    Ok(())
}
