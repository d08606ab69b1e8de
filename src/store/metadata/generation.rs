//! The change feed's counter: a writer bumps it after each metadata commit; the server compares it with the value
//! it last synchronised its caches at, one atomic load per request.
//!
//! - SQLite ([`Generation::open`]): shared by every process that opens the data dir, in a small memory-mapped
//!   file (`<data_dir>/blobgate.generation`). So a change committed by the CLI (a token revocation, say) is seen
//!   by the very next request, without the server polling the database.
//! - PostgreSQL ([`Generation::local`]): writers are on other machines, so no mapping can be shared; the counter
//!   is this process's own and counts only its own commits (so it reads its own writes at once). Other
//!   processes' commits reach the caches through the change-log watcher (`pg_feed.rs`), in the background.

#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use memmap2::{MmapOptions, MmapRaw};

/// One page: the counter sits at offset 0, page-aligned.
const FILE_LEN: u64 = 4096;

pub enum Generation {
    /// Offset 0 of the shared file's page-aligned mapping. `MmapRaw` hands out raw pointers only, never a Rust
    /// reference to the mapped bytes, so the one reference that exists is the `&AtomicU64` of `counter`.
    Mapped(MmapRaw),
    /// Seen by this process only.
    Local(AtomicU64),
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
        let map = MmapOptions::new()
            .len(FILE_LEN as usize)
            .map_raw(&file)
            .with_context(|| format!("cannot map {}", path.display()))?;
        Ok(Self::Mapped(map))
    }

    /// A process-local counter: for a read-only store (it opens no file and never commits), and for a backend
    /// whose writers announce themselves through the database.
    pub fn local() -> Self {
        Self::Local(AtomicU64::new(0))
    }

    #[inline]
    fn counter(&self) -> &AtomicU64 {
        let map = match self {
            Self::Local(counter) => return counter,
            Self::Mapped(map) => map,
        };
        // SAFETY: `AtomicU64::from_ptr` needs an aligned pointer, valid for the reference's life, whose bytes are
        // only ever accessed atomically and at one size meanwhile.
        // - Alignment and the cast: mmap returns a page-aligned address, more than AtomicU64's 8 bytes; the mapping
        //   holds FILE_LEN ≥ 8 bytes of a file never truncated below that, and lives as long as `self`, which the
        //   returned reference borrows. Every bit pattern is a valid u64.
        // - Aliasing: this `&AtomicU64` (an `UnsafeCell`, so writes through a shared reference are allowed) is the
        //   only Rust reference to the mapped bytes: `MmapRaw` hands out raw pointers, never a `&[u8]`, and this one
        //   comes from `as_mut_ptr`, whose provenance permits writes. Other processes change the bytes behind our
        //   back, which only an `UnsafeCell` accessed atomically tolerates.
        // - Races: every access, here and in the other (blobgate) processes mapping the file, is an 8-byte atomic at
        //   offset 0, and atomics on shared memory are coherent between processes on Linux.
        unsafe { AtomicU64::from_ptr(map.as_mut_ptr().cast::<u64>()) }
    }

    #[inline]
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

    #[test]
    fn a_local_counter_is_not_shared() {
        let (a, b) = (Generation::local(), Generation::local());
        a.bump();
        assert_eq!((a.current(), b.current()), (1, 0));
    }
}
