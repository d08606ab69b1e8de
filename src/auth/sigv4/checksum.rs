//! S3's additional checksums (`x-amz-checksum-*`): an algorithm named by header, computed incrementally over the
//! object bytes, compared as base64 of the big-endian digest. Pure.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// CRC-32C (Castagnoli) and CRC-64/NVME from the `crc` crate's catalogue; CRC-32 from `crc32fast` (SIMD).
static CRC32C: crc::Crc<u32, crc::Table<16>> = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISCSI);
static CRC64NVME: crc::Crc<u64, crc::Table<16>> = crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_NVME);

/// The checksum algorithms S3 accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChecksumAlgorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl ChecksumAlgorithm {
    pub const ALL: [ChecksumAlgorithm; 5] = [
        ChecksumAlgorithm::Crc32,
        ChecksumAlgorithm::Crc32c,
        ChecksumAlgorithm::Crc64Nvme,
        ChecksumAlgorithm::Sha1,
        ChecksumAlgorithm::Sha256,
    ];

    /// The header (or trailer) that carries it: `x-amz-checksum-crc32`, …
    pub fn header_name(self) -> &'static str {
        match self {
            ChecksumAlgorithm::Crc32 => "x-amz-checksum-crc32",
            ChecksumAlgorithm::Crc32c => "x-amz-checksum-crc32c",
            ChecksumAlgorithm::Crc64Nvme => "x-amz-checksum-crc64nvme",
            ChecksumAlgorithm::Sha1 => "x-amz-checksum-sha1",
            ChecksumAlgorithm::Sha256 => "x-amz-checksum-sha256",
        }
    }

    /// S3's name, as in `x-amz-sdk-checksum-algorithm` and in error messages: `CRC32`, …
    pub fn name(self) -> &'static str {
        match self {
            ChecksumAlgorithm::Crc32 => "CRC32",
            ChecksumAlgorithm::Crc32c => "CRC32C",
            ChecksumAlgorithm::Crc64Nvme => "CRC64NVME",
            ChecksumAlgorithm::Sha1 => "SHA1",
            ChecksumAlgorithm::Sha256 => "SHA256",
        }
    }

    /// The algorithm of a header name (any case), if it is one of ours.
    pub fn from_header_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.header_name().eq_ignore_ascii_case(name))
    }

    /// Length in bytes of the digest.
    pub fn digest_len(self) -> usize {
        match self {
            ChecksumAlgorithm::Crc32 | ChecksumAlgorithm::Crc32c => 4,
            ChecksumAlgorithm::Crc64Nvme => 8,
            ChecksumAlgorithm::Sha1 => 20,
            ChecksumAlgorithm::Sha256 => 32,
        }
    }
}

/// An algorithm with its computed or presented value (base64 of the digest, as S3 sends it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    pub algorithm: ChecksumAlgorithm,
    pub base64: String,
}

impl Checksum {
    /// A presented value, checked to be base64 of a digest of the right length.
    pub fn parse(algorithm: ChecksumAlgorithm, value: &str) -> Option<Self> {
        let digest = STANDARD.decode(value.trim()).ok()?;
        (digest.len() == algorithm.digest_len()).then(|| Checksum { algorithm, base64: STANDARD.encode(digest) })
    }
}

/// The running state of one checksum over the bytes seen so far.
#[derive(Clone)]
pub struct Checksummer {
    state: State,
}

#[derive(Clone)]
enum State {
    Crc32(crc32fast::Hasher),
    Crc32c(crc::Digest<'static, u32, crc::Table<16>>),
    Crc64Nvme(crc::Digest<'static, u64, crc::Table<16>>),
    Sha1(Sha1),
    Sha256(Sha256),
}

impl Checksummer {
    pub fn new(algorithm: ChecksumAlgorithm) -> Self {
        let state = match algorithm {
            ChecksumAlgorithm::Crc32 => State::Crc32(crc32fast::Hasher::new()),
            ChecksumAlgorithm::Crc32c => State::Crc32c(CRC32C.digest()),
            ChecksumAlgorithm::Crc64Nvme => State::Crc64Nvme(CRC64NVME.digest()),
            ChecksumAlgorithm::Sha1 => State::Sha1(Sha1::new()),
            ChecksumAlgorithm::Sha256 => State::Sha256(Sha256::new()),
        };
        Self { state }
    }

    pub fn algorithm(&self) -> ChecksumAlgorithm {
        match self.state {
            State::Crc32(_) => ChecksumAlgorithm::Crc32,
            State::Crc32c(_) => ChecksumAlgorithm::Crc32c,
            State::Crc64Nvme(_) => ChecksumAlgorithm::Crc64Nvme,
            State::Sha1(_) => ChecksumAlgorithm::Sha1,
            State::Sha256(_) => ChecksumAlgorithm::Sha256,
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match &mut self.state {
            State::Crc32(h) => h.update(data),
            State::Crc32c(h) => h.update(data),
            State::Crc64Nvme(h) => h.update(data),
            State::Sha1(h) => h.update(data),
            State::Sha256(h) => h.update(data),
        }
    }

    /// The checksum of everything fed, as S3 sends it.
    pub fn finish(self) -> Checksum {
        let algorithm = self.algorithm();
        let digest: Vec<u8> = match self.state {
            State::Crc32(h) => h.finalize().to_be_bytes().to_vec(),
            State::Crc32c(h) => h.finalize().to_be_bytes().to_vec(),
            State::Crc64Nvme(h) => h.finalize().to_be_bytes().to_vec(),
            State::Sha1(h) => h.finalize().to_vec(),
            State::Sha256(h) => h.finalize().to_vec(),
        };
        Checksum { algorithm, base64: STANDARD.encode(digest) }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The catalogue check values (the digest of `123456789`), big-endian as S3 sends them.
    #[test]
    fn check_values() {
        let cases: [(ChecksumAlgorithm, &str); 5] = [
            (ChecksumAlgorithm::Crc32, "cbf43926"),
            (ChecksumAlgorithm::Crc32c, "e3069283"),
            (ChecksumAlgorithm::Crc64Nvme, "ae8b14860a799888"),
            (ChecksumAlgorithm::Sha1, "f7c3bc1d808e04732adf679965ccc34ca7ae3441"),
            (ChecksumAlgorithm::Sha256, "15e2b0d3c33891ebb0f1ef609ec419420c20e320ce94c65fbc8c3312448eb225"),
        ];
        for (algorithm, hex_digest) in cases {
            let mut c = Checksummer::new(algorithm);
            c.update(b"1234");
            c.update(b"56789");
            let want = STANDARD.encode(hex::decode(hex_digest).unwrap());
            assert_eq!(c.finish(), Checksum { algorithm, base64: want.clone() }, "{algorithm:?}");
            assert_eq!(Checksum::parse(algorithm, &want).map(|c| c.base64), Some(want), "{algorithm:?}");
            assert_eq!(ChecksumAlgorithm::from_header_name(&algorithm.header_name().to_uppercase()), Some(algorithm));
        }
        // S3's CRC64NVME of the empty object.
        assert_eq!(Checksummer::new(ChecksumAlgorithm::Crc64Nvme).finish().base64, "AAAAAAAAAAA=");
        assert_eq!(Checksum::parse(ChecksumAlgorithm::Crc32, "AAAAAAAAAAA="), None, "a CRC-64 length");
        assert_eq!(Checksum::parse(ChecksumAlgorithm::Crc32, "not base64"), None);
        assert_eq!(ChecksumAlgorithm::from_header_name("x-amz-checksum-md5"), None);
    }

    proptest! {
        /// However the bytes are split into updates, the checksum is the same.
        #[test]
        fn updates_compose(data in proptest::collection::vec(any::<u8>(), 0..2000), cut in any::<prop::sample::Index>()) {
            let at = cut.index(data.len() + 1);
            for algorithm in ChecksumAlgorithm::ALL {
                let mut whole = Checksummer::new(algorithm);
                whole.update(&data);
                let mut split = Checksummer::new(algorithm);
                split.update(&data[..at]);
                split.update(&data[at..]);
                prop_assert_eq!(whole.finish(), split.finish());
            }
        }
    }
}
