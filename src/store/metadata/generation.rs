//! The change feed's counter for SQLite, shared by every process that opens the data dir, in a small memory-mapped file
//! (`<data_dir>/blobgate.generation`). A writer bumps it after each metadata commit; the server compares it with
//! the value it last synchronised its caches at, one atomic load per request. So a change committed by the CLI
//! (a token revocation, say) is seen by the very next request, without the server polling the database.

#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use memmap2::MmapMut;

/// One page: the counter sits at offset 0, page-aligned.
const FILE_LEN: u64 = 4096;

pub struct Generation {
    map: MmapMut,
}

impl Generation {
    pub fn open(data_dir: &Path) -> anyhow::Result<Self> {
        let path = data_dir.join("blobgate.generation");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(crate::store::PRIVATE_FILE_MODE)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        if file.metadata()?.len() < FILE_LEN {
            file.set_len(FILE_LEN).with_context(|| format!("cannot size {}", path.display()))?;
        }
        // SAFETY: the file is ours (inside the data dir) and is never truncated below FILE_LEN; other blobgate
        // processes only touch it through the same atomic below, so the mapping never changes under us in a
        // way Rust cannot see.
        let map = unsafe { MmapMut::map_mut(&file) }.with_context(|| format!("cannot map {}", path.display()))?;
        Ok(Self { map })
    }

    /// A counter no other process sees, for a read-only store: it opens no file and never commits.
    pub fn private() -> anyhow::Result<Self> {
        let map = MmapMut::map_anon(FILE_LEN as usize).context("cannot map a private generation counter")?;
        Ok(Self { map })
    }

    fn counter(&self) -> &AtomicU64 {
        // SAFETY: the mapping (of the file, or anonymous) is page-aligned and at least 8 bytes long, so offset 0 is a valid, aligned u64 for
        // as long as `self` lives. AtomicU64 has the size and alignment of u64 and accepts every bit pattern, and
        // atomic operations on shared memory are coherent between processes on Linux. All access goes through
        // atomics, so there is no data race.
        unsafe { &*(self.map.as_ptr() as *const AtomicU64) }
    }

    pub fn current(&self) -> u64 {
        self.counter().load(Ordering::Acquire)
    }

    /// Called after a commit: every process that reads a newer value can see that commit.
    pub fn bump(&self) {
        self.counter().fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bumps_are_shared_between_mappings() {
        let dir = tempfile::tempdir().unwrap();
        let a = Generation::open(dir.path()).unwrap();
        let b = Generation::open(dir.path()).unwrap();
        let start = a.current();
        b.bump();
        b.bump();
        assert_eq!(a.current(), start + 2);
        drop(b);
        let c = Generation::open(dir.path()).unwrap();
        assert_eq!(c.current(), start + 2, "the value persists across opens");
    }
}
