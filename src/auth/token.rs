//! Bearer tokens: `bg_<id>_<secret>`, where the id (12 hex digits) finds the stored row and the secret is 256
//! random bits. Only SHA-256 of the whole token is stored, and it is compared in constant time. Pure: no IO
//! besides the OS random source when generating.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use super::{all_alphanumeric_or, ct_eq};

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

/// A token's length: `bg_`, the id, `_`, the secret.
const TOKEN_LEN: usize = PREFIX.len() + ID_HEX_LEN + 1 + SECRET_LEN;

/// The id part of a well-formed token, or `None` for anything else.
pub fn token_id(token: &str) -> Option<&str> {
    well_formed(token.as_bytes()).then(|| &token[PREFIX.len()..PREFIX.len() + ID_HEX_LEN])
}

/// The id a token of our length and layout names, its characters unchecked: what [`matches`] needs to find the
/// stored row. Checking them would add nothing there: a token matches only by the digest of all its bytes.
pub fn claimed_id(token: &str) -> Option<&str> {
    let bytes = token.as_bytes();
    let laid_out =
        bytes.len() == TOKEN_LEN && bytes.starts_with(PREFIX.as_bytes()) && bytes[PREFIX.len() + ID_HEX_LEN] == b'_';
    laid_out.then(|| token.get(PREFIX.len()..PREFIX.len() + ID_HEX_LEN)).flatten()
}

/// Whether `bytes` are laid out as a token of ours: every part has a fixed length, so the check reads each byte once,
/// in place (it runs on every bearer request). Such a token is also an RFC 6750 `b64token`.
pub fn well_formed(bytes: &[u8]) -> bool {
    if bytes.len() != TOKEN_LEN || !bytes.starts_with(PREFIX.as_bytes()) || bytes[PREFIX.len() + ID_HEX_LEN] != b'_' {
        return false;
    }
    let id = &bytes[PREFIX.len()..PREFIX.len() + ID_HEX_LEN];
    let secret = &bytes[PREFIX.len() + ID_HEX_LEN + 1..];
    // Folded without an early exit, as `all_alphanumeric_or` is and for the same reason.
    let id_ok = id.iter().fold(true, |all, &b| all & ((b.wrapping_sub(b'0') < 10) | (b.wrapping_sub(b'a') < 6)));
    // The secret is unpadded base64url.
    let secret_ok = all_alphanumeric_or(secret, b"-_");
    id_ok & secret_ok
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

/// Constant-time: how much of the hash matches must not show in the timing. A keep-alive client presents the same
/// token with every request, so the digest of a token that matched lately on this thread is taken from
/// [`RECENT`] rather than hashed again (most of a bearer check's work): found by the token's id, then the whole
/// presented token compared in constant time with the one remembered, so the digest is always that of exactly
/// the bytes presented. Only matching tokens are remembered: a wrong guess is always hashed.
/// `id` is the presented token's [`claimed_id`], which the caller has already read to find the stored row.
pub fn matches(presented: &str, id: Option<&str>, stored_hash: &[u8]) -> bool {
    let Some(id) = id else {
        return ct_eq(&hash(presented), stored_hash);
    };
    let remembered = RECENT.with_borrow(|recent| recent.digest_of(id, presented));
    let digest = remembered.unwrap_or_else(|| hash(presented));
    let matched = ct_eq(&digest, stored_hash);
    if matched && remembered.is_none() {
        RECENT.with_borrow_mut(|recent| recent.remember(id, presented, digest));
    }
    matched
}

/// How many tokens each thread remembers the digest of.
const RECENT_TOKENS: usize = 16;

thread_local! {
    /// The digests of the tokens that matched lately on this thread (each data worker is one thread).
    static RECENT: std::cell::RefCell<RecentDigests> = const { std::cell::RefCell::new(RecentDigests::new()) };
}

/// A few tokens with their digests, by id, replaced oldest first.
struct RecentDigests {
    entries: [Option<Remembered>; RECENT_TOKENS],
    next: usize,
}

struct Remembered {
    id: [u8; ID_HEX_LEN],
    token: String,
    digest: [u8; 32],
}

impl RecentDigests {
    const fn new() -> Self {
        Self { entries: [const { None }; RECENT_TOKENS], next: 0 }
    }

    fn slot_of(&self, id: &[u8]) -> Option<usize> {
        self.entries.iter().position(|e| e.as_ref().is_some_and(|r| r.id == id))
    }

    /// The remembered digest of `presented`, whose id is `id`: the entry for its id (not secret), then the whole
    /// token compared in constant time.
    fn digest_of(&self, id: &str, presented: &str) -> Option<[u8; 32]> {
        let remembered = self.entries[self.slot_of(id.as_bytes())?].as_ref()?;
        ct_eq(remembered.token.as_bytes(), presented.as_bytes()).then_some(remembered.digest)
    }

    fn remember(&mut self, id: &str, presented: &str, digest: [u8; 32]) {
        let Ok(id) = <[u8; ID_HEX_LEN]>::try_from(id.as_bytes()) else { return };
        let slot = self.slot_of(&id).unwrap_or_else(|| {
            let oldest = self.next;
            self.next = (self.next + 1) % RECENT_TOKENS;
            oldest
        });
        self.entries[slot] = Some(Remembered { id, token: presented.to_owned(), digest });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_parse_and_match_their_hash_only() {
        let t = generate();
        assert_eq!(token_id(&t.token), Some(t.id.as_str()));
        assert!(matches(&t.token, token_id(&t.token), &t.secret_hash));
        let mut other = t.token.clone();
        other.pop();
        other.push(if t.token.ends_with('A') { 'B' } else { 'A' });
        assert!(!matches(&other, token_id(&other), &t.secret_hash));
        assert_ne!(generate().token, t.token);
    }

    #[test]
    fn a_remembered_digest_serves_only_the_same_token() {
        let t = generate();
        assert!(matches(&t.token, token_id(&t.token), &t.secret_hash), "hashed, then remembered");
        assert!(matches(&t.token, token_id(&t.token), &t.secret_hash), "from the remembered digest");
        // Same id, another secret: never the remembered digest.
        let mut other = t.token.clone();
        other.pop();
        other.push(if t.token.ends_with('A') { 'B' } else { 'A' });
        assert!(!matches(&other, token_id(&other), &t.secret_hash));
        assert!(!matches(&t.token, token_id(&t.token), &[0u8; 32]), "a stored hash that changed is compared as ever");
        // More tokens than a thread remembers: each still matches, the oldest hashed again.
        let many: Vec<NewToken> = (0..RECENT_TOKENS + 3).map(|_| generate()).collect();
        for _ in 0..2 {
            for n in &many {
                assert!(matches(&n.token, token_id(&n.token), &n.secret_hash));
            }
        }
        assert!(matches(&t.token, token_id(&t.token), &t.secret_hash));
        assert!(!matches("bg_not-a-token", None, &t.secret_hash));
    }

    #[test]
    fn a_claimed_id_finds_the_row_and_only_the_whole_token_matches() {
        let t = generate();
        assert_eq!(claimed_id(&t.token), token_id(&t.token));
        assert!(matches(&t.token, claimed_id(&t.token), &t.secret_hash));
        // The layout of a token with a character no token has: an id to look up, never a match.
        let mut odd = t.token.clone();
        odd.replace_range(odd.len() - 1.., "/");
        assert_eq!(token_id(&odd), None);
        assert_eq!(claimed_id(&odd), Some(t.id.as_str()));
        assert!(!matches(&odd, claimed_id(&odd), &t.secret_hash));
        assert_eq!(claimed_id("bg_short"), None);
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
