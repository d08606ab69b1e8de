//! RFC 3986 percent-encoding as SigV4 and S3 write it: every byte but the unreserved characters
//! (`A-Z a-z 0-9 - . _ ~`) as `%XY`, uppercase hex. One set for SigV4's canonical query, signed URLs and S3's
//! `encoding-type=url`; [`PATH`] is the same with `/` kept.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

/// What a URI component encodes: everything but the unreserved characters.
pub const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// [`COMPONENT`] with `/` kept: a path of segments, or a key whose `/` a client decodes back.
pub const PATH: &AsciiSet = &COMPONENT.remove(b'/');

/// Whether [`COMPONENT`] keeps `b` as it is (`AsciiSet` does not say, and scanners need it per byte).
pub fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use percent_encoding::percent_encode;

    use super::*;

    #[test]
    fn the_unreserved_bytes_are_the_ones_the_sets_keep() {
        for b in 0..=u8::MAX {
            let kept = |set| percent_encode(&[b], set).to_string().as_bytes() == [b];
            assert_eq!(kept(COMPONENT), is_unreserved(b), "{b:#04x}");
            assert_eq!(kept(PATH), is_unreserved(b) || b == b'/', "{b:#04x}");
        }
        assert_eq!(percent_encode("a é/+".as_bytes(), COMPONENT).to_string(), "a%20%C3%A9%2F%2B");
    }
}
