//! S3 access keys as a client sees them: an access key id (`AKBG` and 16 characters of base32, 20 in all, the
//! shape of AWS's) and a secret access key (40 alphanumeric characters, about 238 random bits). Both are made
//! here; the secret is stored sealed (`store::sealing`), since SigV4 verification needs it. Pure, apart from the
//! OS random source.

const ID_PREFIX: &str = "AKBG";
const ID_RANDOM_LEN: usize = 16;
const SECRET_LEN: usize = 40;
const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const ALPHANUMERIC: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A freshly generated access key: both halves are shown once, by `s3-key create`.
pub struct NewAccessKey {
    pub id: String,
    pub secret: String,
}

pub fn generate() -> NewAccessKey {
    NewAccessKey {
        id: format!("{ID_PREFIX}{}", random_text(BASE32, ID_RANDOM_LEN)),
        secret: random_text(ALPHANUMERIC, SECRET_LEN),
    }
}

/// Whether `id` has the shape of an access key id we issue (so obvious junk needs no lookup).
pub fn is_access_key_id(id: &str) -> bool {
    id.len() == ID_PREFIX.len() + ID_RANDOM_LEN
        && id.starts_with(ID_PREFIX)
        && id.bytes().skip(ID_PREFIX.len()).all(|b| matches!(b, b'A'..=b'Z' | b'2'..=b'7'))
}

/// `len` characters drawn uniformly from `alphabet` (rejection sampling: no modulo bias).
fn random_text(alphabet: &[u8], len: usize) -> String {
    let limit = 256 - 256 % alphabet.len();
    let mut out = String::with_capacity(len);
    while out.len() < len {
        let mut batch = [0u8; 64];
        getrandom::fill(&mut batch).expect("the OS random source is available");
        for b in batch {
            if (b as usize) < limit && out.len() < len {
                out.push(alphabet[b as usize % alphabet.len()] as char);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_their_shape_and_differ() {
        let a = generate();
        let b = generate();
        assert!(is_access_key_id(&a.id), "{}", a.id);
        assert_eq!(a.id.len(), 20);
        assert_eq!(a.secret.len(), 40);
        assert!(a.secret.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a.id, b.id);
        assert_ne!(a.secret, b.secret);
        // The shape check's ranges are the BASE32 alphabet exactly.
        for b in 0..=u8::MAX {
            let id = format!("AKBGAAAAAAAAAAAAAAA{}", b as char);
            assert_eq!(is_access_key_id(&id), BASE32.contains(&b), "{b}");
        }
        for bad in ["", "AKIAAAAAAAAAAAAAAAAA", "AKBGaaaaaaaaaaaaaaaa", "AKBG", "AKBGAAAAAAAAAAAAAAAAA"] {
            assert!(!is_access_key_id(bad), "{bad}");
        }
    }
}
