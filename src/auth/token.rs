//! Bearer tokens: `bg_<id>_<secret>`, where the id (12 hex digits) finds the stored row and the secret is 256
//! random bits. Only SHA-256 of the whole token is stored, and it is compared in constant time. Pure: no IO
//! besides the OS random source when generating.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const PREFIX: &str = "bg_";
const ID_HEX_LEN: usize = 12;
/// 32 random bytes in unpadded base64url.
const SECRET_LEN: usize = 43;

/// Stored with the token's row and parsed when it is read (`store::metadata`).
pub use crate::store::Scope;

/// A freshly generated token: `token` is shown once, `secret_hash` is what gets stored.
pub struct NewToken {
    pub id: String,
    pub token: String,
    pub secret_hash: [u8; 32],
}

pub fn generate() -> NewToken {
    let mut id = [0u8; ID_HEX_LEN / 2];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id).expect("the OS random source is available");
    getrandom::fill(&mut secret).expect("the OS random source is available");
    let id = hex::encode(id);
    let token = format!("{PREFIX}{id}_{}", URL_SAFE_NO_PAD.encode(secret));
    let secret_hash = hash(&token);
    NewToken { id, token, secret_hash }
}

/// The id part of a well-formed token, or `None` for anything else.
pub fn token_id(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let id_ok = id.len() == ID_HEX_LEN && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let secret_ok =
        secret.len() == SECRET_LEN && secret.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    (id_ok && secret_ok).then_some(id)
}

/// Accepts either a whole token or a bare id (for `token revoke`).
pub fn id_of(token_or_id: &str) -> Option<&str> {
    if let Some(id) = token_id(token_or_id) {
        return Some(id);
    }
    let is_id = token_or_id.len() == ID_HEX_LEN && token_or_id.bytes().all(|b| b.is_ascii_hexdigit());
    is_id.then_some(token_or_id)
}

pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Constant-time: how much of the hash matches must not show in the timing.
pub fn matches(presented: &str, stored_hash: &[u8]) -> bool {
    hash(presented).ct_eq(stored_hash).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_parse_and_match_their_hash_only() {
        let t = generate();
        assert_eq!(token_id(&t.token), Some(t.id.as_str()));
        assert!(matches(&t.token, &t.secret_hash));
        let mut other = t.token.clone();
        other.pop();
        other.push(if t.token.ends_with('A') { 'B' } else { 'A' });
        assert!(!matches(&other, &t.secret_hash));
        assert_ne!(generate().token, t.token);
    }

    #[test]
    fn malformed_tokens_have_no_id() {
        let t = generate().token;
        for bad in
            ["", "bg_", "bg__", "xx_0123456789ab_secret", &t[..t.len() - 1], &format!("{t}x"), &t.replace("bg_", "BG_")]
        {
            assert_eq!(token_id(bad), None, "{bad}");
        }
        assert_eq!(id_of("0123456789ab"), Some("0123456789ab"));
        assert_eq!(id_of("0123456789"), None);
    }
}
