//! S3's additional checksums (`x-amz-checksum-*`): an algorithm named by header, computed incrementally over the
//! object bytes, compared as base64 of the big-endian digest; and an object's stored checksum ([`ObjectChecksum`]),
//! whole or made of its parts' as S3 makes a multipart upload's (composite, or CRCs combined). Pure.

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

    /// The algorithm of S3's name (`CRC32`, …), as `x-amz-checksum-algorithm` and the stored column give it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(name))
    }

    /// GetObjectAttributes' and the multipart XML's element: `ChecksumCRC32`, …
    pub fn element(self) -> &'static str {
        match self {
            ChecksumAlgorithm::Crc32 => "ChecksumCRC32",
            ChecksumAlgorithm::Crc32c => "ChecksumCRC32C",
            ChecksumAlgorithm::Crc64Nvme => "ChecksumCRC64NVME",
            ChecksumAlgorithm::Sha1 => "ChecksumSHA1",
            ChecksumAlgorithm::Sha256 => "ChecksumSHA256",
        }
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
        Checksum { algorithm, base64: STANDARD.encode(self.digest()) }
    }

    /// The big-endian digest of everything fed.
    fn digest(self) -> Vec<u8> {
        match self.state {
            State::Crc32(h) => h.finalize().to_be_bytes().to_vec(),
            State::Crc32c(h) => h.finalize().to_be_bytes().to_vec(),
            State::Crc64Nvme(h) => h.finalize().to_be_bytes().to_vec(),
            State::Sha1(h) => h.finalize().to_vec(),
            State::Sha256(h) => h.finalize().to_vec(),
        }
    }
}

/// S3's `x-amz-checksum-type`: a checksum of the whole object, or of its parts' checksums (a multipart upload's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumType {
    FullObject,
    Composite,
}

impl ChecksumType {
    pub fn name(self) -> &'static str {
        match self {
            ChecksumType::FullObject => "FULL_OBJECT",
            ChecksumType::Composite => "COMPOSITE",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [ChecksumType::FullObject, ChecksumType::Composite].into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// S3's type for a multipart upload that names only its algorithm: CRC-64/NVME is full-object, the rest
    /// composite.
    pub fn default_for(algorithm: ChecksumAlgorithm) -> Self {
        match algorithm {
            ChecksumAlgorithm::Crc64Nvme => ChecksumType::FullObject,
            _ => ChecksumType::Composite,
        }
    }

    /// Whether S3 makes a multipart upload's checksum of this type with `algorithm`: only CRCs combine into a
    /// full-object checksum, and CRC-64/NVME has no composite form.
    pub fn allowed_with(self, algorithm: ChecksumAlgorithm) -> bool {
        match self {
            ChecksumType::FullObject => crc_params(algorithm).is_some(),
            ChecksumType::Composite => algorithm != ChecksumAlgorithm::Crc64Nvme,
        }
    }
}

/// An object's (or a part's) stored checksum, compact (36 bytes, `Copy`): the per-object cache holds one per
/// object, and header values are made only for a request that asks (`x-amz-checksum-mode: ENABLED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectChecksum {
    pub algorithm: ChecksumAlgorithm,
    pub kind: ChecksumType,
    /// A composite checksum's number of parts (the `-N` of its value); 0 for a full-object one.
    pub parts: u16,
    /// The digest, big-endian, in its first `algorithm.digest_len()` bytes.
    digest: [u8; 32],
}

impl ObjectChecksum {
    /// A full-object checksum from its digest, if the length is the algorithm's.
    pub fn full(algorithm: ChecksumAlgorithm, digest: &[u8]) -> Option<Self> {
        Self::new(algorithm, ChecksumType::FullObject, 0, digest)
    }

    fn new(algorithm: ChecksumAlgorithm, kind: ChecksumType, parts: u16, digest: &[u8]) -> Option<Self> {
        if digest.len() != algorithm.digest_len() {
            return None;
        }
        let mut bytes = [0u8; 32];
        bytes[..digest.len()].copy_from_slice(digest);
        Some(Self { algorithm, kind, parts, digest: bytes })
    }

    /// A verified or computed checksum of a whole body.
    pub fn of(checksum: &Checksum) -> Option<Self> {
        Self::full(checksum.algorithm, &STANDARD.decode(&checksum.base64).ok()?)
    }

    /// The SHA-256 of an object from its hex content hash (the blob key), which every object has.
    pub fn sha256_hex(sha256: &str) -> Option<Self> {
        Self::full(ChecksumAlgorithm::Sha256, &hex::decode(sha256).ok()?)
    }

    pub fn digest(&self) -> &[u8] {
        &self.digest[..self.algorithm.digest_len()]
    }

    /// The value as S3 sends it: base64 of the digest, and for a composite checksum `-N`.
    pub fn value(&self) -> String {
        let base64 = STANDARD.encode(self.digest());
        match self.kind {
            ChecksumType::FullObject => base64,
            ChecksumType::Composite => format!("{base64}-{}", self.parts),
        }
    }

    /// The stored form: `ALGORITHM TYPE VALUE` (`CRC32 COMPOSITE o8hrCg==-2`).
    pub fn column(&self) -> String {
        format!("{} {} {}", self.algorithm.name(), self.kind.name(), self.value())
    }

    /// A stored form read back; anything else (written by hand) is none.
    pub fn from_column(column: &str) -> Option<Self> {
        let mut words = column.split(' ');
        let algorithm = ChecksumAlgorithm::from_name(words.next()?)?;
        let kind = ChecksumType::from_name(words.next()?)?;
        let value = words.next()?;
        if words.next().is_some() {
            return None;
        }
        let (base64, parts) = match kind {
            ChecksumType::FullObject => (value, 0),
            ChecksumType::Composite => {
                let (base64, parts) = value.rsplit_once('-')?;
                (base64, parts.parse().ok().filter(|&n| n > 0)?)
            }
        };
        Self::new(algorithm, kind, parts, &STANDARD.decode(base64).ok()?)
    }
}

/// A multipart object's checksum from its parts' full checksums (all of `algorithm`, with their sizes), in part
/// order, as S3 makes it: composite, the checksum of the concatenated part digests with `-N`; full-object, the
/// parts' CRCs combined into the CRC of the whole. `None` for no parts, more than 10,000, a part of another
/// algorithm, or a type S3 does not make with the algorithm.
pub fn multipart_checksum(
    algorithm: ChecksumAlgorithm,
    kind: ChecksumType,
    parts: &[(ObjectChecksum, u64)],
) -> Option<ObjectChecksum> {
    let count = u16::try_from(parts.len()).ok().filter(|&n| (1..=10_000).contains(&n))?;
    if !kind.allowed_with(algorithm) || parts.iter().any(|(c, _)| c.algorithm != algorithm) {
        return None;
    }
    match kind {
        ChecksumType::Composite => {
            let mut summer = Checksummer::new(algorithm);
            parts.iter().for_each(|(c, _)| summer.update(c.digest()));
            ObjectChecksum::new(algorithm, kind, count, &summer.digest())
        }
        ChecksumType::FullObject => {
            let (poly, width) = crc_params(algorithm)?;
            let crc = parts.iter().fold(None, |whole: Option<u64>, (part, size)| {
                let crc = part.digest().iter().fold(0u64, |n, &b| (n << 8) | u64::from(b));
                Some(match whole {
                    None => crc,
                    Some(whole) => crc_combine(whole, crc, *size, poly, width),
                })
            })?;
            let bytes = crc.to_be_bytes();
            ObjectChecksum::new(algorithm, kind, 0, &bytes[bytes.len() - algorithm.digest_len()..])
        }
    }
}

/// The reflected polynomial and width of the CRCs S3 combines (all reflected, with all-ones init and xorout).
fn crc_params(algorithm: ChecksumAlgorithm) -> Option<(u64, u32)> {
    match algorithm {
        ChecksumAlgorithm::Crc32 => Some((0xEDB8_8320, 32)),
        ChecksumAlgorithm::Crc32c => Some((0x82F6_3B78, 32)),
        ChecksumAlgorithm::Crc64Nvme => Some((0x9A6C_9329_AC4B_C9B5, 64)),
        ChecksumAlgorithm::Sha1 | ChecksumAlgorithm::Sha256 => None,
    }
}

/// The CRC of `A ‖ B` from `crc(A)`, `crc(B)` and `B`'s length: zlib's `crc32_combine`, `crc(A)·x^(8·len) ⊕
/// crc(B)` modulo the polynomial, for any width (the all-ones init and xorout cancel out).
fn crc_combine(crc_a: u64, crc_b: u64, len_b: u64, poly: u64, width: u32) -> u64 {
    // x^(8·len) by squaring, from x^8 (reflected: x^k is the bit `width - 1 - k`).
    let (mut power, mut square, mut n) = (1u64 << (width - 1), 1u64 << (width - 9), len_b);
    while n > 0 {
        if n & 1 == 1 {
            power = mult_mod(power, square, poly, width);
        }
        square = mult_mod(square, square, poly, width);
        n >>= 1;
    }
    mult_mod(power, crc_a, poly, width) ^ crc_b
}

/// `a·b` modulo the polynomial, reflected (zlib's `multmodp`).
fn mult_mod(a: u64, mut b: u64, poly: u64, width: u32) -> u64 {
    let (mut m, mut product) = (1u64 << (width - 1), 0u64);
    while m != 0 {
        if a & m != 0 {
            product ^= b;
        }
        m >>= 1;
        b = if b & 1 == 1 { (b >> 1) ^ poly } else { b >> 1 };
    }
    product
}

/// The checksums a GET or HEAD with `x-amz-checksum-mode: ENABLED` (and GetObjectAttributes) answers for an
/// object: its stored one, and its SHA-256 (its content hash) unless the stored one is composite or is it.
pub fn answered(stored: Option<ObjectChecksum>, sha256_hex: &str) -> Vec<ObjectChecksum> {
    let mut answered: Vec<ObjectChecksum> = stored.into_iter().collect();
    let whole = stored.is_none_or(|c| c.kind == ChecksumType::FullObject && c.algorithm != ChecksumAlgorithm::Sha256);
    if whole {
        answered.extend(ObjectChecksum::sha256_hex(sha256_hex));
    }
    answered
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

    fn full_of(algorithm: ChecksumAlgorithm, data: &[u8]) -> (ObjectChecksum, u64) {
        let mut summer = Checksummer::new(algorithm);
        summer.update(data);
        (ObjectChecksum::of(&summer.finish()).unwrap(), data.len() as u64)
    }

    /// Against awscrt's `checksums` and hashlib (botocore's own): two parts, `b"hello " * 1000` and
    /// `b"world" * 777`.
    #[test]
    fn multipart_checksums_are_what_the_sdk_computes() {
        use ChecksumAlgorithm::*;
        use ChecksumType::*;
        let (a, b) = (b"hello ".repeat(1000), b"world".repeat(777));
        let cases = [
            (Crc32, FullObject, "OJOtNQ=="),
            (Crc32, Composite, "o8hrCg==-2"),
            (Crc32c, FullObject, "LwA+xA=="),
            (Crc32c, Composite, "9/1WJg==-2"),
            (Crc64Nvme, FullObject, "JsNYf/vKPwU="),
            (Sha1, Composite, "R/NxQaAKs1CefExSCw5ohn/xwk0=-2"),
            (Sha256, Composite, "rNoAxKe+xzQS5O0bzFaBDdyYfo895IsdxrLb4b/oLH0=-2"),
        ];
        for (algorithm, kind, want) in cases {
            let parts = [full_of(algorithm, &a), full_of(algorithm, &b)];
            let got = multipart_checksum(algorithm, kind, &parts).unwrap();
            assert_eq!(got.value(), want, "{algorithm:?} {kind:?}");
            assert_eq!(ObjectChecksum::from_column(&got.column()), Some(got), "{}", got.column());
        }
        let parts = [full_of(Sha256, &a)];
        assert_eq!(multipart_checksum(Sha256, FullObject, &parts), None, "SHA-256 does not combine");
        assert_eq!(multipart_checksum(Crc64Nvme, Composite, &[full_of(Crc64Nvme, &a)]), None);
        assert_eq!(multipart_checksum(Crc32, Composite, &parts), None, "a part of another algorithm");
        assert_eq!(multipart_checksum(Crc32, Composite, &[]), None);
        assert_eq!(ObjectChecksum::from_column("CRC32 COMPOSITE o8hrCg==-0"), None);
        assert_eq!(ObjectChecksum::from_column("MD5 FULL_OBJECT o8hrCg=="), None);
    }

    #[test]
    fn an_object_answers_its_stored_checksum_and_its_sha256_unless_composite() {
        let sha = "15e2b0d3c33891ebb0f1ef609ec419420c20e320ce94c65fbc8c3312448eb225";
        let sha256 = ObjectChecksum::sha256_hex(sha).unwrap();
        let crc = full_of(ChecksumAlgorithm::Crc32, b"x").0;
        let composite = multipart_checksum(ChecksumAlgorithm::Crc32, ChecksumType::Composite, &[(crc, 1)]).unwrap();
        assert_eq!(answered(None, sha), [sha256]);
        assert_eq!(answered(Some(crc), sha), [crc, sha256]);
        assert_eq!(answered(Some(sha256), sha), [sha256]);
        assert_eq!(answered(Some(composite), sha), [composite]);
        assert_eq!(std::mem::size_of::<Option<ObjectChecksum>>(), 36, "compact in the object cache");
    }

    proptest! {
        /// A full-object CRC combined from any split is the CRC of the whole.
        #[test]
        fn combined_crcs_are_the_whole_crc(data in proptest::collection::vec(any::<u8>(), 0..3000), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 1..4)) {
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
            at.sort_unstable();
            let bounds: Vec<usize> = std::iter::once(0).chain(at).chain(std::iter::once(data.len())).collect();
            for algorithm in [ChecksumAlgorithm::Crc32, ChecksumAlgorithm::Crc32c, ChecksumAlgorithm::Crc64Nvme] {
                let parts: Vec<_> = bounds.windows(2).map(|w| full_of(algorithm, &data[w[0]..w[1]])).collect();
                let combined = multipart_checksum(algorithm, ChecksumType::FullObject, &parts).unwrap();
                let whole = full_of(algorithm, &data).0;
                prop_assert_eq!(combined.digest(), whole.digest());
            }
        }

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
