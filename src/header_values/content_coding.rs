//! The content codings blobgate stores and sends (`Content-Encoding`). Here, below `store`, because the store
//! records variants by coding, the catalog and the driver carry it, and `http` negotiates it.

/// A content coding we store and send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ContentCoding {
    #[default]
    Identity,
    Gzip,
    Br,
}

impl ContentCoding {
    /// Every coding, in the order of preference at equal q (smallest stored form first).
    pub const PREFERENCE: [ContentCoding; 3] = [ContentCoding::Br, ContentCoding::Gzip, ContentCoding::Identity];

    /// The `Content-Encoding` token; identity is sent as no header at all.
    pub fn token(self) -> &'static str {
        match self {
            ContentCoding::Identity => "identity",
            ContentCoding::Gzip => "gzip",
            ContentCoding::Br => "br",
        }
    }

    /// Parses a stored or sent token (case-insensitive); `x-gzip` is gzip (§8.4.1.3).
    pub fn from_token(token: &[u8]) -> Option<ContentCoding> {
        if token.eq_ignore_ascii_case(b"br") {
            Some(ContentCoding::Br)
        } else if token.eq_ignore_ascii_case(b"gzip") || token.eq_ignore_ascii_case(b"x-gzip") {
            Some(ContentCoding::Gzip)
        } else if token.eq_ignore_ascii_case(b"identity") {
            Some(ContentCoding::Identity)
        } else {
            None
        }
    }
}

/// The encoded variants an object has besides its identity bytes (which it always has).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variants {
    pub br: bool,
    pub gzip: bool,
}

impl Variants {
    pub fn has(self, coding: ContentCoding) -> bool {
        match coding {
            ContentCoding::Identity => true,
            ContentCoding::Gzip => self.gzip,
            ContentCoding::Br => self.br,
        }
    }

    /// True if the object has any encoded variant, so its responses carry `Vary: Accept-Encoding`.
    pub fn any(self) -> bool {
        self.br || self.gzip
    }
}
