//! `blobgate blobs migrate --to s3://…`: the move from blobs in the data dir to an object store, and the slice
//! manifests (`store::manifest`) of blobs a store got before them.
//!
//! Every blob file an object references is uploaded unless the store already holds it with its size (its name is
//! its content's hash, so that is the same blob): running it again after an interruption uploads only what is
//! missing. Servers keep serving from the data dir meanwhile; uploads made during the copy are caught by running
//! it again once they are stopped (README, "Moving blobs to an object store").

use anyhow::Context;

use crate::config::{ObjectStoreLocation, Settings};
use crate::store::Store;
use crate::store::remote::{Listing, ManifestRepair, RemoteBlobs};

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
    // Blobs the store got before slice manifests (from servers, not from this data dir): each referenced one
    // without a manifest is fetched, checked whole and given one.
    let (mut manifests_written, mut corrupt) = (0u64, Vec::new());
    let scratch = store.blobs.tmp_dir().to_owned();
    let mut blobs = Listing::blobs();
    let listed = |e| anyhow::Error::new(e).context(format!("cannot list the blobs in {location}"));
    while let Some(page) = remote.next_page(&mut blobs).await.map_err(listed)? {
        for (sha, _) in page {
            if !store.meta.blob_is_referenced(&sha).await? {
                continue;
            }
            let repair = remote.write_missing_manifest(&sha, &scratch).await;
            match repair.with_context(|| format!("cannot write the slice manifest of blob {sha} in {location}"))? {
                ManifestRepair::Present => {}
                ManifestRepair::Written => manifests_written += 1,
                ManifestRepair::Corrupt => corrupt.push(sha),
            }
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
            "manifests_written": manifests_written,
            "corrupt": corrupt,
        })
    );
    if let Some(first) = corrupt.first() {
        anyhow::bail!(
            "{} blob(s) in {location} do not match their SHA-256 (first: {first}); upload them again from a sound copy",
            corrupt.len()
        );
    }
    Ok(())
}
