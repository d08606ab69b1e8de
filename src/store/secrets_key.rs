//! The secrets key file, `<data_dir>/signing-secrets.key`: the key that seals signing-key secrets in the database
//! (`store::sealing`). It is kept out of the database so that a copy of the database alone cannot forge signed
//! URLs. Created owner-only on first use; never created over a database whose keys were sealed with a lost one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;

use super::Metadata;
use super::sealing::{SECRETS_KEY_LEN, SecretsKey};

pub const SECRETS_KEY_FILE: &str = "signing-secrets.key";

/// Reads the data dir's secrets key, creating it when the database has nothing sealed yet.
pub async fn load_or_create(data_dir: &Path, meta: &Metadata) -> anyhow::Result<SecretsKey> {
    let path = data_dir.join(SECRETS_KEY_FILE);
    if let Some(key) = read(&path)? {
        return Ok(key);
    }
    if meta.has_sealed_signing_keys().await? || meta.has_s3_keys().await? {
        return Err(missing_key(&path));
    }
    let mut bytes = [0u8; SECRETS_KEY_LEN];
    getrandom::fill(&mut bytes).context("no OS randomness")?;
    let key = SecretsKey::from_bytes(bytes);
    // Written aside, then linked into place (which never replaces a file): when two processes start at once on
    // a new data dir, one file wins and both use it.
    let mut suffix = [0u8; 4];
    getrandom::fill(&mut suffix).context("no OS randomness")?;
    let temp = data_dir.join(format!("{SECRETS_KEY_FILE}.{}-{}", std::process::id(), hex::encode(suffix)));
    let written = write_synced(&temp, key.to_file_text().as_bytes()).and_then(|()| fs::hard_link(&temp, &path));
    let _ = fs::remove_file(&temp);
    match written {
        Ok(()) => {
            File::open(data_dir).and_then(|d| d.sync_all()).context("cannot sync the data dir")?;
            Ok(key)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            read(&path)?.with_context(|| format!("{} vanished while it was created", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
    }
}

/// Reads the data dir's secrets key if it has one, creating nothing (for read-only opens); a missing key over
/// sealed keys is the same error as in `load_or_create`.
pub async fn load_existing(data_dir: &Path, meta: &Metadata) -> anyhow::Result<Option<SecretsKey>> {
    let path = data_dir.join(SECRETS_KEY_FILE);
    match read(&path)? {
        Some(key) => Ok(Some(key)),
        None if meta.has_sealed_signing_keys().await? || meta.has_s3_keys().await? => Err(missing_key(&path)),
        None => Ok(None),
    }
}

fn missing_key(path: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is missing, but the database holds signing keys or S3 keys sealed with it: restore that file",
        path.display()
    )
}

fn read(path: &Path) -> anyhow::Result<Option<SecretsKey>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(SecretsKey::parse(&text).with_context(|| format!("cannot use {}", path.display()))?)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).mode(super::PRIVATE_FILE_MODE).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
