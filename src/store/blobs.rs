//! Content-addressed, immutable blob files under `<data_dir>/blobs/ab/cd/<sha256>`: staging (hashed as it is
//! written, with the MD5 S3 needs), install, retire, the sweep's scan; multipart part files in `parts/` and their
//! assembly into one blob, and ranges staged for UploadPartCopy. Assembly and range copies are done by the kernel
//! (`copy_file_range`) and read once to hash what they store.
//!
//! A blob is written to `<data_dir>/tmp/`, fsynced, then renamed into place, so a reader never sees a partial file
//! under a blob name. Blob names come only from content hashes: object keys never become file paths. Installing
//! and retiring blobs happen while the caller holds the blob-reference lock, which serialises them across
//! processes (a CLI `put` beside a running server, or replicas on several hosts sharing the directory) against the
//! references in the database. Staging names say which process on which host writes them (`store::staging`), so
//! the start-up sweep leaves a live peer's uploads alone. ARCHITECTURE.md, "Shared blob directory", says what a
//! shared filesystem must provide.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use md5::Md5;
use sha2::{Digest, Sha256};

use super::staging::{self, STAGE_PREFIX, StageOwner};
/// Prefix of blobs being removed: renamed out of `blobs/` first, so a failed commit can put them back.
const RETIRED_PREFIX: &str = "retired-";

#[derive(Debug, Clone)]
pub struct BlobStore {
    // Shared, so that cloning the store (once per request, inside the app state) allocates nothing.
    blobs_dir: Arc<Path>,
    tmp_dir: Arc<Path>,
    /// Parts of multipart uploads, named by their rows (`staged_name`), not by content.
    parts_dir: Arc<Path>,
}

/// A fully written and fsynced temp file that is not yet visible as a blob. Dropping it removes the temp file,
/// so an aborted upload or a failed commit leaves nothing behind.
#[derive(Debug)]
pub struct StagedBlob {
    temp_path: PathBuf,
    pub sha256: String,
    pub size: u64,
    /// Hex MD5 of the content, from a `BlobWriter` (a part's ETag, and a put object's S3 ETag); `None` for an
    /// assembled multipart object, whose S3 ETag is made of its parts' MD5s.
    pub md5: Option<String>,
    /// The S3 checksum the upload presented and that verified (PutObject, UploadPart), stored with the object or
    /// part; `None` for the native API's, whose SHA-256 is their key.
    pub checksum: Option<crate::header_values::checksum::ObjectChecksum>,
}

impl StagedBlob {
    /// The staged file (an upload to the object store reads it from here).
    pub fn path(&self) -> &Path {
        &self.temp_path
    }
}

impl Drop for StagedBlob {
    fn drop(&mut self) {
        // After `install` the temp path is gone and this is a harmless ENOENT.
        let _ = fs::remove_file(&self.temp_path);
    }
}

/// A blob moved aside by `retire`. `discard` deletes it after the metadata commit; `restore` puts it back when the
/// commit failed.
#[derive(Debug)]
pub struct RetiredBlob {
    retired_path: PathBuf,
    blob_path: PathBuf,
}

impl RetiredBlob {
    /// Unlinks the retired file; `false` when it was already gone (a peer's sweep got there first), which is no
    /// error: the file is gone either way, and only one unlink of it can succeed.
    pub fn discard(self) -> bool {
        match fs::remove_file(&self.retired_path) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => {
                tracing::warn!(path = %self.retired_path.display(), error = %e, "could not remove a retired blob; the next sweep will");
                false
            }
        }
    }

    /// Puts the blob back under its hash. Already back (a peer's sweep restored it) is success.
    pub fn restore(self) -> io::Result<()> {
        if let Some(dir) = self.blob_path.parent() {
            fs::create_dir_all(dir)?;
        }
        match fs::rename(&self.retired_path, &self.blob_path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.blob_path.is_file() => Ok(()),
            other => other,
        }
    }

    /// The hash of the blob this was.
    pub fn sha256(&self) -> &str {
        self.blob_path.file_name().and_then(|n| n.to_str()).unwrap_or_default()
    }

    /// Whether a blob of that hash is in place again (identical content stored since).
    pub fn blob_present(&self) -> bool {
        self.blob_path.is_file()
    }
}

/// Streams bytes into a staged blob, hashing as it goes: SHA-256 (its name, the native ETag) and MD5 (the S3 ETag
/// that clients such as rclone and s3cmd compare with their own).
pub struct BlobWriter {
    file: File,
    hasher: Sha256,
    md5: Md5,
    size: u64,
    /// Owns the temp path so that an abandoned writer removes its file on drop.
    staged: StagedBlob,
}

impl BlobWriter {
    pub fn write(&mut self, chunk: &[u8]) -> io::Result<()> {
        self.file.write_all(chunk)?;
        self.hasher.update(chunk);
        self.md5.update(chunk);
        self.size += chunk.len() as u64;
        Ok(())
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// fsyncs the data and returns the staged blob, named by its hash.
    pub fn finish(mut self) -> io::Result<StagedBlob> {
        self.file.sync_all()?;
        // Taking the path disarms the writer's own clean-up: the returned StagedBlob owns the file now.
        Ok(StagedBlob {
            temp_path: std::mem::take(&mut self.staged.temp_path),
            sha256: hex::encode(self.hasher.finalize_reset()),
            size: self.size,
            md5: Some(hex::encode(self.md5.finalize_reset())),
            checksum: None,
        })
    }
}

/// Creates `dir` and any missing parents owner-only, whatever the umask.
fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(super::PRIVATE_DIR_MODE)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

impl BlobStore {
    pub fn open(data_dir: &Path) -> anyhow::Result<Self> {
        let store = Self::at(data_dir);
        for dir in [&store.blobs_dir, &store.tmp_dir, &store.parts_dir] {
            create_private_dir(dir)?;
        }
        Ok(store)
    }

    /// The blob store of a data dir, for reading only: creates nothing.
    pub fn at(data_dir: &Path) -> Self {
        Self {
            blobs_dir: Arc::from(data_dir.join("blobs")),
            tmp_dir: Arc::from(data_dir.join("tmp")),
            parts_dir: Arc::from(data_dir.join("parts")),
        }
    }

    /// `tmp/`, where staged files live.
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp_dir
    }

    /// `blobs/ab/cd/abcd…`: two fan-out levels keep directories small at millions of blobs.
    pub fn path_of(&self, sha256: &str) -> PathBuf {
        debug_assert!(is_blob_hash(sha256));
        self.blobs_dir.join(&sha256[0..2]).join(&sha256[2..4]).join(sha256)
    }

    pub fn open_blob(&self, sha256: &str) -> io::Result<File> {
        File::open(self.path_of(sha256))
    }

    pub fn writer(&self) -> io::Result<BlobWriter> {
        let (file, temp_path) = self.create_stage_file()?;
        Ok(BlobWriter {
            file,
            hasher: Sha256::new(),
            md5: Md5::new(),
            size: 0,
            staged: StagedBlob { temp_path, sha256: String::new(), size: 0, md5: None, checksum: None },
        })
    }

    /// A new temp file in `tmp/`, named after this process (`staging::stage_name`) so that no sweep removes it
    /// while we live.
    fn create_stage_file(&self) -> io::Result<(File, PathBuf)> {
        let temp_path = self.tmp_dir.join(staging::stage_name(this_process(), &random_suffix()));
        // Owner-only whatever the umask; the blob keeps this mode when it is renamed into place.
        let file = OpenOptions::new().write(true).create_new(true).mode(super::PRIVATE_FILE_MODE).open(&temp_path)?;
        Ok((file, temp_path))
    }

    /// Copies a local file into a staged blob. `progress` is told about every chunk copied.
    pub fn stage_file(&self, source: &Path, mut progress: impl FnMut(u64)) -> anyhow::Result<StagedBlob> {
        let mut input = File::open(source).with_context(|| format!("cannot open {}", source.display()))?;
        let mut writer = self.writer().context("cannot create a temp file in the data dir")?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot read {}", source.display()));
                }
            };
            writer.write(&buf[..n]).context("cannot write to the data dir")?;
            progress(n as u64);
        }
        writer.finish().context("cannot sync the staged blob")
    }

    /// Makes a staged blob visible under its hash. Call while holding the blob-reference lock. Idempotent: when
    /// the blob already exists (identical content, since the name is its hash) the existing file is kept and the
    /// staged copy is removed when it drops. A file of the wrong size under that name (damaged by hand) is
    /// replaced, atomically, by the rename.
    pub fn install(&self, staged: &StagedBlob) -> anyhow::Result<()> {
        let target = self.path_of(&staged.sha256);
        if has_size(&target, staged.size) {
            return Ok(());
        }
        let dir = target.parent().expect("blob paths have a parent");
        create_private_dir(dir)?;
        match fs::rename(&staged.temp_path, &target) {
            Ok(()) => {}
            // NFS retransmits a rename whose reply was lost; the retry finds the source gone although the first
            // attempt moved it into place.
            Err(e) if e.kind() == io::ErrorKind::NotFound && has_size(&target, staged.size) => {}
            Err(e) => return Err(e).with_context(|| format!("cannot move blob into {}", target.display())),
        }
        // The rename is durable only once the directory entry is.
        File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("cannot sync {}", dir.display()))?;
        Ok(())
    }

    /// Moves a blob out of `blobs/` so that it can be deleted once the metadata commit that dropped its last
    /// reference succeeds. Call while holding the blob-reference lock, after re-checking under it that nothing
    /// references the blob. `None` when the blob is already gone (ENOENT is no error).
    pub fn retire(&self, sha256: &str) -> anyhow::Result<Option<RetiredBlob>> {
        let blob_path = self.path_of(sha256);
        let retired_path = self.tmp_dir.join(format!("{RETIRED_PREFIX}{sha256}-{}", random_suffix()));
        match fs::rename(&blob_path, &retired_path) {
            Ok(()) => Ok(Some(RetiredBlob { retired_path, blob_path })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot retire blob {sha256}")),
        }
    }

    /// Removes staged files in `tmp/` that no live process is writing: those of a dead process on this host at
    /// once, any other only when it has not been written for `grace` (it may be a peer's upload on another host,
    /// or another container's). A live local process's files stay (a concurrent CLI put, another replica).
    /// Returns how many it removed, and the retired blobs it found, which only the database can tell to restore
    /// or discard (see `Store::sweep`).
    pub fn sweep_temp_files(&self, grace: Duration) -> anyhow::Result<(usize, Vec<RetiredBlob>)> {
        let mut removed = 0;
        let mut retired = Vec::new();
        let this_host = &this_process().host;
        for entry in fs::read_dir(&self.tmp_dir).with_context(|| format!("cannot list {}", self.tmp_dir.display()))? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let stale = if let Some(rest) = name.strip_prefix(RETIRED_PREFIX) {
                match rest.get(..64).filter(|sha| is_blob_hash(sha)) {
                    Some(sha) => {
                        retired.push(RetiredBlob { retired_path: entry.path(), blob_path: self.path_of(sha) });
                        false
                    }
                    None => true,
                }
            } else if name.starts_with(STAGE_PREFIX) {
                let owner = staging::classify_stage(&name, this_host, process_start_ticks);
                // Gone since it was listed (its upload finished): nothing to judge.
                let Ok(idle) = idle_time(&entry.path()) else { continue };
                staging::may_sweep_temp(owner, idle, grace)
            } else {
                false
            };
            // A directory is a CLI command's blob cache (`BlobCache::open`), named as a staging file is.
            let gone = match entry.file_type() {
                Ok(kind) if kind.is_dir() => stale && fs::remove_dir_all(entry.path()).is_ok(),
                _ => stale && fs::remove_file(entry.path()).is_ok(),
            };
            if gone {
                removed += 1;
            }
        }
        Ok((removed, retired))
    }

    /// The hashes of blobs on disk not modified for `grace`: the only ones the sweep may consider unreferenced
    /// (a younger one may be a peer's, installed a moment ago).
    pub fn hashes_idle_for(&self, grace: Duration) -> anyhow::Result<Vec<String>> {
        let mut hashes = Vec::new();
        self.idle_hash_batches(grace, usize::MAX, |batch| {
            hashes.extend(batch);
            true
        })?;
        Ok(hashes)
    }

    /// [`BlobStore::hashes_idle_for`] as the walk finds them, handed to `batch` at most `size` at a time, so that
    /// no more than one batch of millions of hashes is in memory. Stops when `batch` returns false.
    pub fn idle_hash_batches(
        &self,
        grace: Duration,
        size: usize,
        mut batch: impl FnMut(Vec<String>) -> bool,
    ) -> anyhow::Result<()> {
        let mut hashes = Vec::new();
        for sha in self.walk_hashes() {
            let sha = sha?;
            if let Ok(idle) = idle_time(&self.path_of(&sha))
                && staging::may_sweep_unreferenced_blob(idle, grace)
            {
                hashes.push(sha);
                if hashes.len() >= size && !batch(std::mem::take(&mut hashes)) {
                    return Ok(());
                }
            }
        }
        if !hashes.is_empty() {
            batch(hashes);
        }
        Ok(())
    }

    /// Every blob hash present on disk.
    pub fn list_hashes(&self) -> anyhow::Result<Vec<String>> {
        self.walk_hashes().collect()
    }

    /// The blob hashes on disk, one directory entry at a time.
    fn walk_hashes(&self) -> impl Iterator<Item = anyhow::Result<String>> + use<> {
        // A data dir whose blobs live in an object store may have none.
        let present = self.blobs_dir.exists();
        let walk = present.then(|| walkdir::WalkDir::new(&*self.blobs_dir).min_depth(3).max_depth(3));
        walk.into_iter().flatten().filter_map(|entry| match entry {
            Err(e) => Some(Err(e).context("cannot list the blob directory")),
            Ok(entry) => (entry.file_type().is_file() && entry.file_name().to_str().is_some_and(is_blob_hash))
                .then(|| Ok(entry.file_name().to_string_lossy().into_owned())),
        })
    }

    /// A new, never reused name for a part file (so a replaced part's old file can go once its row has changed).
    pub fn new_part_name() -> String {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the OS random source is available");
        hex::encode(bytes)
    }

    /// `parts/<name>`.
    pub fn part_path(&self, name: &str) -> PathBuf {
        debug_assert!(is_part_name(name));
        self.parts_dir.join(name)
    }

    /// Moves a staged blob to `parts/<name>`, durably. Call while holding the metadata write lock, in the
    /// transaction that writes the part's row, so that the sweep (which checks under the lock) never sees the
    /// file without its row unless the transaction failed.
    pub fn install_part(&self, staged: &StagedBlob, name: &str) -> anyhow::Result<()> {
        let target = self.part_path(name);
        create_private_dir(&self.parts_dir)?;
        fs::rename(&staged.temp_path, &target)
            .with_context(|| format!("cannot move a part into {}", target.display()))?;
        File::open(&*self.parts_dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync {}", self.parts_dir.display()))
    }

    /// A temp file to fetch a part into from the object store (swept like any staging file if we die), then
    /// `install_fetched_part`.
    pub fn stage_part_fetch(&self) -> io::Result<(File, PathBuf)> {
        self.create_stage_file()
    }

    /// Moves a fully fetched part (`stage_part_fetch`'s file, synced) to `parts/<name>`.
    pub fn install_fetched_part(&self, temp: &Path, name: &str) -> anyhow::Result<()> {
        create_private_dir(&self.parts_dir)?;
        fs::rename(temp, self.part_path(name))
            .with_context(|| format!("cannot move the fetched part {name} into place"))
    }

    /// Removes a part file that no row names any more; a failure is left to the next sweep.
    pub fn remove_part(&self, name: &str) {
        match fs::remove_file(self.part_path(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(part = name, error = %e, "could not remove a part file; the next sweep will"),
        }
    }

    /// The names of every part file on disk (for the start-up sweep of parts no upload names).
    pub fn list_part_names(&self) -> anyhow::Result<Vec<String>> {
        let entries = match fs::read_dir(&*self.parts_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", self.parts_dir.display())),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list {}", self.parts_dir.display()))?;
            if let Some(name) = entry.file_name().to_str().filter(|n| is_part_name(n)) {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    /// Assembles part files, in order, into one staged blob. The bytes are copied by the kernel
    /// (`copy_file_range`, never through our memory); the parts are read once to hash the whole. Each part must
    /// have its recorded size. Every part is opened before anything is copied, so a part replaced or removed
    /// meanwhile is either wholly in the result or an error.
    pub fn assemble(&self, parts: &[(String, u64)]) -> anyhow::Result<StagedBlob> {
        self.assemble_with(parts, KernelCopy::CopyFileRange)
    }

    fn assemble_with(&self, parts: &[(String, u64)], mut how: KernelCopy) -> anyhow::Result<StagedBlob> {
        let mut inputs = Vec::with_capacity(parts.len());
        for (name, size) in parts {
            anyhow::ensure!(is_part_name(name), "invalid part file name {name:?}");
            let file = File::open(self.part_path(name)).with_context(|| format!("cannot open part file {name}"))?;
            let actual = file.metadata().with_context(|| format!("cannot stat part file {name}"))?.len();
            anyhow::ensure!(actual == *size, "part file {name} has {actual} bytes, its row says {size}");
            inputs.push((file, *size));
        }
        let (mut output, temp_path) = self.create_stage_file().context("cannot create a temp file in the data dir")?;
        // Owns the temp file from here: an error on the way removes it.
        let mut staged = StagedBlob { temp_path, sha256: String::new(), size: 0, md5: None, checksum: None };
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut out_offset: i64 = 0;
        for (mut input, size) in inputs {
            loop {
                match input.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => hasher.update(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e).context("cannot read a part file"),
                }
            }
            copy_in_kernel(&input, 0, &mut output, &mut out_offset, size, &mut how)?;
            staged.size += size;
        }
        output.sync_all().context("cannot sync the assembled object")?;
        staged.sha256 = hex::encode(hasher.finalize());
        Ok(staged)
    }

    /// Stages `len` bytes of the blob `sha256` from `offset` (UploadPartCopy), with their MD5 (the part's ETag).
    /// Like `assemble`, the bytes are copied by the kernel and read once to hash them. `Ok(None)` when the blob is
    /// gone: its object was deleted after the caller read its row.
    /// `cached`: the blob's file in the object store's cache, holding the range, instead of the data dir's.
    pub fn stage_range(
        &self,
        sha256: &str,
        cached: Option<&File>,
        offset: u64,
        len: u64,
    ) -> anyhow::Result<Option<StagedBlob>> {
        use std::os::unix::fs::FileExt;
        anyhow::ensure!(is_blob_hash(sha256), "invalid blob hash {sha256:?}");
        let opened;
        let input = match cached {
            Some(file) => file,
            None => match self.open_blob(sha256) {
                Ok(file) => {
                    opened = file;
                    &opened
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e).with_context(|| format!("cannot open blob {sha256}")),
            },
        };
        let end = offset.checked_add(len).context("range end beyond u64")?;
        let actual = input.metadata().with_context(|| format!("cannot stat blob {sha256}"))?.len();
        anyhow::ensure!(end <= actual, "blob {sha256} has {actual} bytes, the range ends at {end}");
        let (mut output, temp_path) = self.create_stage_file().context("cannot create a temp file in the data dir")?;
        let mut staged = StagedBlob { temp_path, sha256: String::new(), size: len, md5: None, checksum: None };
        let (mut sha, mut md5) = (Sha256::new(), Md5::new());
        let mut buf = vec![0u8; usize::try_from(len.min(1 << 20)).expect("1 MiB fits in usize")];
        let mut at = offset;
        while at < end {
            let want = usize::try_from((end - at).min(buf.len() as u64)).expect("bounded by the buffer");
            match input.read_at(&mut buf[..want], at) {
                Ok(0) => anyhow::bail!("blob {sha256} ended before {end} bytes"),
                Ok(n) => {
                    sha.update(&buf[..n]);
                    md5.update(&buf[..n]);
                    at += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).with_context(|| format!("cannot read blob {sha256}")),
            }
        }
        let mut out_offset = 0;
        copy_in_kernel(input, offset, &mut output, &mut out_offset, len, &mut KernelCopy::CopyFileRange)?;
        output.sync_all().context("cannot sync the staged copy")?;
        staged.sha256 = hex::encode(sha.finalize());
        staged.md5 = Some(hex::encode(md5.finalize()));
        Ok(Some(staged))
    }
}

/// How `assemble` and `stage_range` move bytes between files; both keep them in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KernelCopy {
    CopyFileRange,
    /// Where `copy_file_range` cannot copy between the two files (another filesystem, or one without support).
    Sendfile,
}

/// Appends `size` bytes of `input` from `from` to `output` at `out_offset`, which it advances.
fn copy_in_kernel(
    input: &File,
    from: u64,
    output: &mut File,
    out_offset: &mut i64,
    size: u64,
    how: &mut KernelCopy,
) -> anyhow::Result<()> {
    use nix::errno::Errno;
    use std::io::{Seek, SeekFrom};
    let mut in_offset = i64::try_from(from).context("offset beyond i64")?;
    let mut left = size;
    while left > 0 {
        let chunk = usize::try_from(left.min(1 << 30)).expect("1 GiB fits in usize");
        let copied = match *how {
            KernelCopy::CopyFileRange => {
                match nix::fcntl::copy_file_range(input, Some(&mut in_offset), &*output, Some(out_offset), chunk) {
                    Err(Errno::EXDEV | Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINVAL) => {
                        *how = KernelCopy::Sendfile;
                        continue;
                    }
                    other => other,
                }
            }
            KernelCopy::Sendfile => {
                // sendfile writes at the output's own position.
                output.seek(SeekFrom::Start(*out_offset as u64)).context("cannot seek the assembled object")?;
                let sent = nix::sys::sendfile::sendfile64(&*output, input, Some(&mut in_offset), chunk);
                if let Ok(n) = sent {
                    *out_offset += n as i64;
                }
                sent
            }
        };
        match copied {
            Ok(0) => anyhow::bail!("a file ended before its recorded size"),
            Ok(n) => left -= n as u64,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(io::Error::from(e)).context("cannot copy between files in the data dir"),
        }
    }
    Ok(())
}

/// A part file's name: 32 lower-case hex digits (`BlobStore::new_part_name`).
pub fn is_part_name(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Lower-case hex SHA-256, the only form a blob name takes.
pub fn is_blob_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A name in `tmp/` that the sweep judges by this process (a staging name), for a file or a directory.
pub fn new_stage_name() -> String {
    staging::stage_name(this_process(), &random_suffix())
}

fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    hex::encode(bytes)
}

/// This process as the owner of its staging files, found out once.
pub fn this_process() -> &'static StageOwner {
    static OWNER: OnceLock<StageOwner> = OnceLock::new();
    OWNER.get_or_init(|| {
        let pid = std::process::id();
        match process_start_ticks(pid) {
            Some(start_ticks) => StageOwner { host: this_host_id(), pid, start_ticks },
            // No /proc: no process here can check a pid, so this one names itself a host of its own, whose files
            // (and whose view of others') go by age only.
            None => StageOwner { host: random_suffix(), pid, start_ticks: 0 },
        }
    })
}

/// What makes a pid meaningful here: the machine (its id, else its hostname alone), this boot, and this pid
/// namespace (each container has its own). See `staging::host_id_from`.
fn this_host_id() -> String {
    let read = |path: &str| fs::read_to_string(path).ok().filter(|s| !s.trim().is_empty());
    let machine_id = read("/etc/machine-id").or_else(|| read("/var/lib/dbus/machine-id"));
    let hostname = read("/proc/sys/kernel/hostname");
    let boot_id = read("/proc/sys/kernel/random/boot_id");
    let pid_namespace = fs::read_link("/proc/self/ns/pid").ok().map(|p| p.to_string_lossy().into_owned());
    staging::host_id_from(machine_id.as_deref(), hostname.as_deref(), boot_id.as_deref(), pid_namespace.as_deref())
}

/// The start time of process `pid` on this host (clock ticks since boot); `None` when there is no such process.
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/stat")).ok().as_deref().and_then(staging::start_ticks_from_stat)
}

/// How long ago a file was last modified; `Ok(None)` when its mtime is in the future (another host's clock).
fn idle_time(path: &Path) -> io::Result<Option<Duration>> {
    let modified = fs::metadata(path)?.modified()?;
    Ok(SystemTime::now().duration_since(modified).ok())
}

/// Whether `path` is a regular file of `size` bytes.
fn has_size(path: &Path, size: u64) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == size)
}

/// Test set-up shared by the store's and the catalog's tests.
#[cfg(test)]
impl BlobStore {
    /// `bytes` staged as a blob (not installed).
    pub(crate) fn stage_bytes(&self, bytes: &[u8]) -> StagedBlob {
        let mut w = self.writer().unwrap();
        w.write(bytes).unwrap();
        w.finish().unwrap()
    }

    /// `bytes` staged and installed.
    pub(crate) fn install_bytes(&self, bytes: &[u8]) -> StagedBlob {
        let staged = self.stage_bytes(bytes);
        self.install(&staged).unwrap();
        staged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob store in a fresh temp dir.
    fn blob_store() -> (tempfile::TempDir, BlobStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn staged_blobs_are_named_by_content_and_installed_once() {
        let (dir, store) = blob_store();
        let mut w = store.writer().unwrap();
        w.write(b"hello ").unwrap();
        w.write(b"world").unwrap();
        let staged = w.finish().unwrap();
        assert_eq!(staged.sha256, "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9");
        assert_eq!(staged.size, 11);
        store.install(&staged).unwrap();
        drop(staged);
        let path = store.path_of("b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9");
        assert_eq!(fs::read(&path).unwrap(), b"hello world");
        assert!(path.starts_with(dir.path().join("blobs/b9/4d")));
        // The temp file is gone after install + drop.
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn parts_assemble_in_order_by_either_kernel_copy() {
        let (dir, store) = blob_store();
        let mut parts = Vec::new();
        for content in [&b"first "[..], b"", b"second ", &[7u8; 3 << 20]] {
            let mut w = store.writer().unwrap();
            w.write(content).unwrap();
            let staged = w.finish().unwrap();
            assert_eq!(staged.md5.as_deref().map(str::len), Some(32));
            let name = BlobStore::new_part_name();
            store.install_part(&staged, &name).unwrap();
            parts.push((name, content.len() as u64));
        }
        let want = [&b"first second "[..], &[7u8; 3 << 20]].concat();
        for how in [KernelCopy::CopyFileRange, KernelCopy::Sendfile] {
            let staged = store.assemble_with(&parts, how).unwrap();
            assert_eq!((staged.size, staged.sha256.clone()), (want.len() as u64, hex::encode(Sha256::digest(&want))));
            store.install(&staged).unwrap();
            assert_eq!(fs::read(store.path_of(&staged.sha256)).unwrap(), want, "{how:?}");
            store.retire(&staged.sha256).unwrap().unwrap().discard();
        }
        // A part whose file is not its recorded size is refused, and nothing is left staged.
        let mut wrong = parts.clone();
        wrong[0].1 += 1;
        let err = store.assemble(&wrong).unwrap_err();
        assert!(format!("{err:#}").contains("its row says"), "{err:#}");
        fs::remove_file(store.part_path(&parts[2].0)).unwrap();
        assert!(store.assemble(&parts).is_err(), "a missing part");
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn dropped_writers_and_staged_blobs_leave_no_temp_files() {
        let (dir, store) = blob_store();
        let mut w = store.writer().unwrap();
        w.write(b"partial").unwrap();
        drop(w);
        let staged = store.writer().unwrap().finish().unwrap();
        drop(staged);
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn retire_then_restore_or_discard() {
        let (_dir, store) = blob_store();
        let staged = store.install_bytes(b"x");
        let path = store.path_of(&staged.sha256);
        let retired = store.retire(&staged.sha256).unwrap().unwrap();
        assert!(!path.exists());
        retired.restore().unwrap();
        assert!(path.exists());
        store.retire(&staged.sha256).unwrap().unwrap().discard();
        assert!(!path.exists());
        assert!(store.retire(&staged.sha256).unwrap().is_none());
    }

    fn set_idle(path: &Path, idle: Duration) {
        File::options().write(true).open(path).unwrap().set_modified(SystemTime::now() - idle).unwrap();
    }

    #[test]
    fn the_sweep_removes_only_what_no_live_process_writes() {
        let (dir, store) = blob_store();
        let tmp = dir.path().join("tmp");
        let grace = Duration::from_secs(3600);
        let me = this_process();
        assert_eq!(me.start_ticks, process_start_ticks(me.pid).unwrap());
        let named = |owner: &StageOwner| tmp.join(staging::stage_name(owner, &random_suffix()));
        // pid 0 is never a user process; a live pid with another start time is a reused pid.
        let dead = named(&StageOwner { pid: 0, ..me.clone() });
        let reused = named(&StageOwner { start_ticks: me.start_ticks + 1, ..me.clone() });
        let elsewhere = StageOwner { host: "0000000000000000".into(), pid: 0, start_ticks: 0 };
        let (fresh_elsewhere, old_elsewhere) = (named(&elsewhere), named(&elsewhere));
        let old_format = tmp.join("stage-0-abc");
        for path in [&dead, &reused, &fresh_elsewhere, &old_elsewhere, &old_format] {
            fs::write(path, b"x").unwrap();
        }
        // A CLI command's blob cache: a directory, named the same way.
        let (dead_cache, live_cache) = (named(&StageOwner { pid: 0, ..me.clone() }), tmp.join(new_stage_name()));
        for dir in [&dead_cache, &live_cache] {
            fs::create_dir_all(dir.join("ab/cd")).unwrap();
            fs::write(dir.join("ab/cd/blob"), b"x").unwrap();
        }
        set_idle(&old_elsewhere, grace);
        fs::write(tmp.join(format!("retired-{}-x", "a".repeat(64))), b"old").unwrap();
        let mut live = store.writer().unwrap();
        live.write(b"in progress").unwrap();
        set_idle(&live.staged.temp_path, 2 * grace);

        let (removed, retired) = store.sweep_temp_files(grace).unwrap();
        assert_eq!(removed, 4, "the dead, the reused, the old one of another host and the dead command's cache");
        assert!(!dead.exists() && !reused.exists() && !old_elsewhere.exists() && !dead_cache.exists());
        assert!(live_cache.join("ab/cd/blob").exists(), "a running command's cache stays");
        assert!(fresh_elsewhere.exists(), "another host's fresh upload stays");
        assert!(old_format.exists(), "a name without a host is judged by age only");
        assert!(live.staged.temp_path.exists(), "a live process's upload stays, however idle");
        assert_eq!(retired.len(), 1, "retired blobs are left for the caller to decide");
        assert_eq!(retired[0].sha256(), "a".repeat(64));
        drop(live);
    }

    #[test]
    fn install_is_idempotent_and_repairs_a_damaged_blob() {
        let (dir, store) = blob_store();
        let (first, second) = (store.stage_bytes(b"same"), store.stage_bytes(b"same"));
        store.install(&first).unwrap();
        let path = store.path_of(&first.sha256);
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let installed = inode(&path);
        store.install(&second).unwrap();
        assert_eq!(inode(&path), installed, "the existing blob is kept");
        drop((first, second));
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "the second copy is removed");

        fs::write(&path, b"sa").unwrap();
        let third = store.stage_bytes(b"same");
        store.install(&third).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"same", "a blob of the wrong size is replaced");
    }

    #[test]
    fn a_retired_blob_is_unlinked_or_restored_once_whoever_gets_there_first() {
        let (_dir, store) = blob_store();
        let staged = store.install_bytes(b"x");
        let retired = store.retire(&staged.sha256).unwrap().unwrap();
        let twin = RetiredBlob { retired_path: retired.retired_path.clone(), blob_path: retired.blob_path.clone() };
        assert!(retired.discard());
        assert!(!twin.discard(), "the second unlink finds ENOENT, which is no error");

        let staged = store.install_bytes(b"x");
        let retired = store.retire(&staged.sha256).unwrap().unwrap();
        let twin = RetiredBlob { retired_path: retired.retired_path.clone(), blob_path: retired.blob_path.clone() };
        retired.restore().unwrap();
        twin.restore().unwrap();
        assert!(store.path_of(&staged.sha256).is_file());
    }

    #[test]
    fn only_blobs_idle_past_the_grace_period_are_sweep_candidates() {
        let (_dir, store) = blob_store();
        let mut hashes = Vec::new();
        for bytes in [b"young".as_slice(), b"old"] {
            hashes.push(store.install_bytes(bytes).sha256.clone());
        }
        let grace = Duration::from_secs(60);
        set_idle(&store.path_of(&hashes[1]), grace);
        assert_eq!(store.hashes_idle_for(grace).unwrap(), vec![hashes[1].clone()]);
        assert_eq!(store.hashes_idle_for(Duration::ZERO).unwrap().len(), 2);
    }
}
