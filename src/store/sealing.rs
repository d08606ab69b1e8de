//! Signing-key secrets sealed at rest: XChaCha20-Poly1305 under a secrets key kept outside the database (the
//! file `<data_dir>/signing-secrets.key`), with the signing key's id as associated data, so a copy of the
//! database alone (a backup, a dump, a database server's operator) cannot forge signed URLs, and a sealed secret
//! moved to another key's row does not open. Pure: the caller brings the nonce and does the IO.
//!
//! Stored form: `bgs1` ‖ 24-byte nonce ‖ ciphertext with its 16-byte tag. Rows written before sealing hold the
//! 32 raw bytes; `Store::open` seals them.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

const MAGIC: &[u8; 4] = b"bgs1";
pub const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
pub const SECRETS_KEY_LEN: usize = 32;

/// The key that seals signing-key secrets. Its `Debug` never shows the bytes.
#[derive(Clone)]
pub struct SecretsKey([u8; SECRETS_KEY_LEN]);

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(..)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the secrets key file must hold {SECRETS_KEY_LEN} bytes as 64 hex digits")]
    BadKeyFile,
    #[error("signing key {0} does not open with this secrets key (another data dir's key file?)")]
    WrongKey(String),
    #[error("signing key {0} is neither sealed nor a plain 32-byte secret")]
    Malformed(String),
}

impl SecretsKey {
    pub fn from_bytes(bytes: [u8; SECRETS_KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// The key file's text: 64 hex digits, surrounding whitespace ignored.
    pub fn parse(text: &str) -> Result<Self, SealError> {
        let mut bytes = [0u8; SECRETS_KEY_LEN];
        hex::decode_to_slice(text.trim(), &mut bytes).map_err(|_| SealError::BadKeyFile)?;
        Ok(Self(bytes))
    }

    /// What [`SecretsKey::parse`] reads back.
    pub fn to_file_text(&self) -> String {
        format!("{}\n", hex::encode(self.0))
    }

    /// A key for another purpose, named by `label`: HMAC-SHA256 of the label under this key, so that the secrets
    /// key itself only ever seals.
    pub fn derive(&self, label: &[u8]) -> [u8; 32] {
        use hmac::{Hmac, Mac};
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.finalize().into_bytes().into()
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(&self.0.into())
    }
}

/// Whether a stored secret is in sealed form (else it is a plaintext row from before sealing).
pub fn is_sealed(stored: &[u8]) -> bool {
    stored.len() > MAGIC.len() + NONCE_LEN + TAG_LEN && stored.starts_with(MAGIC)
}

/// Seals `secret` for the signing key `key_id`. `nonce` must be fresh randomness.
pub fn seal(key: &SecretsKey, key_id: &str, secret: &[u8], nonce: [u8; NONCE_LEN]) -> Vec<u8> {
    let sealed = key
        .cipher()
        .encrypt(XNonce::from_slice(&nonce), Payload { msg: secret, aad: key_id.as_bytes() })
        .expect("XChaCha20-Poly1305 seals messages of any practical length");
    [&MAGIC[..], &nonce, &sealed].concat()
}

/// The secret of signing key `key_id`, from its stored form: opened when sealed, as it is when it is a plaintext
/// row from before sealing (32 bytes).
pub fn open(key: &SecretsKey, key_id: &str, stored: &[u8]) -> Result<Vec<u8>, SealError> {
    if !is_sealed(stored) {
        return if stored.len() == 32 { Ok(stored.to_vec()) } else { Err(SealError::Malformed(key_id.to_owned())) };
    }
    let (nonce, sealed) = stored[MAGIC.len()..].split_at(NONCE_LEN);
    key.cipher()
        .decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad: key_id.as_bytes() })
        .map_err(|_| SealError::WrongKey(key_id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: [u8; 32] = [9; 32];

    fn key(b: u8) -> SecretsKey {
        SecretsKey::from_bytes([b; 32])
    }

    #[test]
    fn sealed_secrets_open_only_with_their_key_and_id() {
        let sealed = seal(&key(1), "k1", &SECRET, [3; NONCE_LEN]);
        assert!(is_sealed(&sealed));
        assert_eq!(sealed.len(), 4 + NONCE_LEN + 32 + TAG_LEN);
        assert!(!sealed.windows(32).any(|w| w == SECRET), "the secret is not in the sealed form");
        assert_eq!(open(&key(1), "k1", &sealed).unwrap(), SECRET);
        assert_eq!(open(&key(2), "k1", &sealed), Err(SealError::WrongKey("k1".into())));
        assert_eq!(open(&key(1), "k2", &sealed), Err(SealError::WrongKey("k2".into())), "moved to another row");
        for i in 0..sealed.len() {
            let mut tampered = sealed.clone();
            tampered[i] ^= 1;
            assert!(open(&key(1), "k1", &tampered).is_err(), "byte {i}");
        }
        assert_ne!(seal(&key(1), "k1", &SECRET, [4; NONCE_LEN]), sealed, "the nonce makes each seal distinct");
    }

    #[test]
    fn plaintext_rows_from_before_sealing_are_read_as_they_are() {
        assert!(!is_sealed(&SECRET));
        assert_eq!(open(&key(1), "k1", &SECRET).unwrap(), SECRET);
        assert_eq!(open(&key(1), "k1", b"short"), Err(SealError::Malformed("k1".into())));
    }

    #[test]
    fn key_files_round_trip_and_bad_ones_are_refused() {
        let k = key(0xab);
        let text = k.to_file_text();
        assert_eq!(text.trim().len(), 64);
        assert_eq!(SecretsKey::parse(&text).unwrap().0, k.0);
        for bad in ["", "abcd", &"g".repeat(64), &"a".repeat(66)] {
            assert_eq!(SecretsKey::parse(bad).unwrap_err(), SealError::BadKeyFile, "{bad:?}");
        }
        assert_eq!(format!("{k:?}"), "SecretsKey(..)");
    }
}
