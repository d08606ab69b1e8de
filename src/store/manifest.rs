//! A blob's slice manifest: the SHA-256 of each chunk of the blob ([`CHUNK_BYTES`] from offset 0), so that the
//! object-store cache can check each slice it fetches before anyone reads it, where the blob's own name checks
//! only the whole. It lives in the store beside its blob (`<blob key>.slices`), written at upload and by `blobs
//! migrate`, and it is sealed: an HMAC-SHA256 over the blob's name and the manifest, under a key derived from the
//! secrets key (`store::sealing`), so whoever can write to the store but does not hold the key can change a blob
//! but not the digests it is checked against. Pure: the caller fetches and stores.
//!
//! Sealed form: `bgslice1` ‖ size (u64 LE) ‖ chunk bytes (u64 LE) ‖ one 32-byte digest per chunk ‖ 32-byte tag.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::sealing::SecretsKey;

/// The chunk each digest covers in manifests written by this version; a cache slice is a whole number of them.
pub const CHUNK_BYTES: u64 = crate::config::SLICE_CHECK_BYTES;
const MAGIC: &[u8; 8] = b"bgslice1";
const DIGEST_LEN: usize = 32;
const HEADER_LEN: usize = MAGIC.len() + 16;
/// Bounds what a forged manifest can make us allocate: a digest per chunk of a blob up to 64 TiB of 1 MiB chunks.
const MAX_CHUNKS: u64 = 1 << 26;

pub type ChunkDigest = [u8; DIGEST_LEN];

/// The key manifests are sealed with, derived from the secrets key (never the key itself, which seals secrets).
#[derive(Clone)]
pub struct ManifestKey([u8; 32]);

impl std::fmt::Debug for ManifestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ManifestKey(..)")
    }
}

impl ManifestKey {
    pub fn derive(secrets: &SecretsKey) -> Self {
        Self(secrets.derive(b"blobgate slice manifest v1"))
    }

    fn mac(&self, sha256: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(sha256.as_bytes());
        mac.update(body);
        mac
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("its slice manifest is malformed")]
    Malformed,
    #[error("its slice manifest is not sealed with this server's key (forged, or another deployment's)")]
    BadSeal,
    #[error("its slice manifest is for {0} bytes, not the object's {1}")]
    WrongSize(u64, u64),
    #[error("bytes {0}..{1} do not match the slice manifest")]
    Mismatch(u64, u64),
}

/// The digests of a blob's chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceManifest {
    size: u64,
    chunk_bytes: u64,
    digests: Vec<ChunkDigest>,
}

impl SliceManifest {
    /// A blob of `size` bytes whose chunks of `chunk_bytes` hash to `digests`, in order.
    pub fn new(size: u64, chunk_bytes: u64, digests: Vec<ChunkDigest>) -> Result<Self, ManifestError> {
        if chunk_bytes == 0 || digests.len() as u64 != size.div_ceil(chunk_bytes) {
            return Err(ManifestError::Malformed);
        }
        Ok(Self { size, chunk_bytes, digests })
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// The sealed form of the manifest of the blob `sha256`.
    pub fn seal(&self, key: &ManifestKey, sha256: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + DIGEST_LEN * (self.digests.len() + 1));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.chunk_bytes.to_le_bytes());
        self.digests.iter().for_each(|d| out.extend_from_slice(d));
        let tag = key.mac(sha256, &out).finalize().into_bytes();
        out.extend_from_slice(&tag);
        out
    }

    /// The manifest of the blob `sha256` of `size` bytes from its sealed form, if `key` sealed it for that blob.
    pub fn open(sealed: &[u8], key: &ManifestKey, sha256: &str, size: u64) -> Result<Self, ManifestError> {
        if sealed.len() < HEADER_LEN + DIGEST_LEN || !sealed.starts_with(MAGIC) {
            return Err(ManifestError::Malformed);
        }
        let (body, tag) = sealed.split_at(sealed.len() - DIGEST_LEN);
        key.mac(sha256, body).verify_slice(tag).map_err(|_| ManifestError::BadSeal)?;
        let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let (stored_size, chunk_bytes) = (word(MAGIC.len()), word(MAGIC.len() + 8));
        if stored_size != size {
            return Err(ManifestError::WrongSize(stored_size, size));
        }
        let digests = &body[HEADER_LEN..];
        if chunk_bytes == 0 || size.div_ceil(chunk_bytes) > MAX_CHUNKS || digests.len() % DIGEST_LEN != 0 {
            return Err(ManifestError::Malformed);
        }
        let digests = digests.chunks_exact(DIGEST_LEN).map(|d| d.try_into().expect("32 bytes")).collect();
        Self::new(size, chunk_bytes, digests)
    }

    /// Checks `digests`, those of the chunks from `offset` (a chunk boundary) on, against the manifest.
    pub fn check(&self, offset: u64, digests: &[ChunkDigest]) -> Result<(), ManifestError> {
        let first = offset / self.chunk_bytes;
        for (i, digest) in digests.iter().enumerate() {
            let chunk = first + i as u64;
            let start = chunk * self.chunk_bytes;
            let end = (start + self.chunk_bytes).min(self.size);
            let expected = self.digests.get(chunk as usize).ok_or(ManifestError::Mismatch(start, end))?;
            if offset % self.chunk_bytes != 0 || expected != digest {
                return Err(ManifestError::Mismatch(start, end));
            }
        }
        Ok(())
    }
}

/// Hashes bytes as they stream by, one digest per `chunk_bytes` (the last chunk may be shorter).
#[derive(Debug, Clone)]
pub struct ChunkHasher {
    chunk_bytes: u64,
    current: Sha256,
    filled: u64,
    digests: Vec<ChunkDigest>,
    /// Digests already handed out by `new_digests`.
    reported: usize,
}

impl ChunkHasher {
    pub fn new(chunk_bytes: u64) -> Self {
        assert!(chunk_bytes > 0, "chunks have bytes");
        Self { chunk_bytes, current: Sha256::new(), filled: 0, digests: Vec::new(), reported: 0 }
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// The chunks completed since the last call: (index from the first chunk hashed, digest).
    pub fn new_digests(&mut self) -> Vec<(usize, ChunkDigest)> {
        let fresh: Vec<_> = (self.reported..self.digests.len()).map(|i| (i, self.digests[i])).collect();
        self.reported = self.digests.len();
        fresh
    }

    /// Ends the last chunk, short or not, so that `new_digests` reports it too.
    pub fn end(&mut self) {
        if self.filled > 0 {
            self.digests.push(std::mem::take(&mut self.current).finalize().into());
            self.filled = 0;
        }
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = (self.chunk_bytes - self.filled).min(bytes.len() as u64) as usize;
            self.current.update(&bytes[..take]);
            self.filled += take as u64;
            bytes = &bytes[take..];
            if self.filled == self.chunk_bytes {
                self.digests.push(std::mem::take(&mut self.current).finalize().into());
                self.filled = 0;
            }
        }
    }

    /// The digests of every chunk, the short last one included.
    pub fn finish(mut self) -> Vec<ChunkDigest> {
        self.end();
        self.digests
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(b: u8) -> ManifestKey {
        ManifestKey::derive(&SecretsKey::from_bytes([b; 32]))
    }

    fn digests(bytes: &[u8], chunk: u64) -> Vec<ChunkDigest> {
        bytes.chunks(chunk as usize).map(|c| Sha256::digest(c).into()).collect()
    }

    const SHA: &str = "ab00000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn a_sealed_manifest_opens_only_with_its_key_for_its_blob_and_size() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let manifest = SliceManifest::new(10_000, 4096, digests(&bytes, 4096)).unwrap();
        let sealed = manifest.seal(&key(1), SHA);
        assert_eq!(sealed.len(), 8 + 16 + 3 * 32 + 32);
        assert_eq!(SliceManifest::open(&sealed, &key(1), SHA, 10_000).unwrap(), manifest);
        assert_eq!(SliceManifest::open(&sealed, &key(2), SHA, 10_000), Err(ManifestError::BadSeal));
        let other = SHA.replace("ab", "cd");
        assert_eq!(SliceManifest::open(&sealed, &key(1), &other, 10_000), Err(ManifestError::BadSeal), "moved");
        assert_eq!(SliceManifest::open(&sealed, &key(1), SHA, 9_999), Err(ManifestError::WrongSize(10_000, 9_999)));
        for i in 0..sealed.len() {
            let mut tampered = sealed.clone();
            tampered[i] ^= 1;
            assert!(SliceManifest::open(&tampered, &key(1), SHA, 10_000).is_err(), "byte {i}");
        }
        for cut in [0, 10, sealed.len() - 1] {
            assert!(SliceManifest::open(&sealed[..cut], &key(1), SHA, 10_000).is_err(), "{cut}");
        }
        assert_eq!(format!("{:?}", key(1)), "ManifestKey(..)");
    }

    #[test]
    fn chunks_are_checked_where_they_lie() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 4096 * 13) as u8).collect();
        let all = digests(&bytes, 4096);
        let manifest = SliceManifest::new(10_000, 4096, all.clone()).unwrap();
        manifest.check(0, &all).unwrap();
        manifest.check(4096, &all[1..]).unwrap();
        assert_eq!(manifest.check(4096, &all[..1]), Err(ManifestError::Mismatch(4096, 8192)), "shifted");
        assert_eq!(manifest.check(8192, &all[1..]), Err(ManifestError::Mismatch(8192, 10_000)));
        assert!(manifest.check(100, &all[..1]).is_err(), "unaligned");
        let mut rotten = bytes.clone();
        rotten[9_000] ^= 1;
        assert_eq!(manifest.check(0, &digests(&rotten, 4096)), Err(ManifestError::Mismatch(8192, 10_000)));
        assert!(SliceManifest::new(10_000, 4096, all[..2].to_vec()).is_err());
    }

    proptest! {
        #[test]
        fn streaming_hashes_equal_chunked_ones(len in 0usize..20_000, chunk in 1u64..5000, cuts in proptest::collection::vec(0usize..20_000, 0..8)) {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let mut hasher = ChunkHasher::new(chunk);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(len)).collect();
            cuts.sort();
            let mut at = 0;
            for cut in cuts.into_iter().chain([len]) {
                hasher.update(&bytes[at..cut]);
                at = cut;
            }
            prop_assert_eq!(hasher.finish(), digests(&bytes, chunk));
        }
    }
}
