//! Pure HTTP/1.1 request-head parsing, framing decisions and response-head serialisation. No IO.
//!
//! A parsed head keeps one copy of its bytes: fields are offsets into it (`HeadFields`), and an origin-form target
//! whose every byte `Uri` accepts is read in place, a `Uri` built only for a handler that takes an `http::Request`.
//!
//! Which requests may carry a body is the listener's [`Bodies`] policy. Where none is taken (GET, HEAD, OPTIONS
//! and DELETE on the data listener), framing is simple and strict: any `Transfer-Encoding` or a non-zero
//! `Content-Length` ends the connection after an error response (RFC 9112 §6.3 says a server that cannot determine
//! the framing MUST close). Where one is taken (PUT and POST on the data listener, every method on the admin
//! listener), a `Content-Length` body or a `chunked` one (decoded by `body.rs`) is, and everything ambiguous is
//! refused the same way.
//! After any parse error the connection is closed: we never try to find the next request in a byte stream we
//! failed to understand.

use std::mem::MaybeUninit;

use http::header::{self, HeaderMap};
use http::{Method, StatusCode, Uri, Version};

use super::body::BodyFraming;
use crate::file_body::{SharedFields, write_fields};
use crate::header_values::fields::{self, Fields, HeadFields};

#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub max_uri_bytes: usize,
    /// Which requests may carry a body.
    pub bodies: Bodies,
}

/// Which requests a listener takes a body with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bodies {
    /// None: every body is refused.
    Never,
    /// PUT and POST only (uploads, S3 writes and their XML bodies): the data listener, whose reads stay body-free.
    OnWrites,
    /// Every method: the admin listener.
    Any,
}

impl Bodies {
    fn takes(self, method: &Method) -> bool {
        match self {
            Bodies::Never => false,
            Bodies::OnWrites => *method == Method::PUT || *method == Method::POST,
            Bodies::Any => true,
        }
    }
}

/// A parsed request head.
#[derive(Debug)]
pub struct RequestHead {
    pub method: Method,
    target: Target,
    pub version: Version,
    /// The header fields, as parsed (an `http::HeaderMap` is built from them only for the handlers that take one).
    pub fields: HeadFields,
    /// Whether the connection may carry another request after this one (RFC 9112 §9.3).
    pub keep_alive: bool,
    /// How its body is framed; always `BodyFraming::None` for a method `HeadLimits::bodies` takes none with.
    pub body: BodyFraming,
    /// Bytes of the buffer this head used; whatever follows belongs to the next (pipelined) request.
    pub len: usize,
    /// The client's address (an IPv4 address mapped into IPv6 as IPv4), set by the connection: what limits on
    /// anonymous clients count by.
    pub peer: std::net::IpAddr,
}

/// Why a request head was refused. The connection is always closed afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadError {
    pub status: StatusCode,
    pub message: &'static str,
}

impl HeadError {
    fn new(status: StatusCode, message: &'static str) -> Self {
        Self { status, message }
    }
}

pub enum Parsed {
    /// Boxed: the head (with its fields inline) is hundreds of bytes, and it moves through the driver's layers
    /// and into the application's future, where one pointer is copied instead each time.
    Complete(Box<RequestHead>),
    /// More bytes are needed.
    Partial,
}

/// Parses one request head from the start of `buf`.
pub fn parse_request_head(buf: &[u8], limits: &HeadLimits) -> Result<Parsed, HeadError> {
    // RFC 9112 §2.2: a server SHOULD ignore at least one empty line before the request-line.
    let skipped = leading_empty_lines(buf);
    let buf = &buf[skipped..];
    // Room for the default limit on the stack and left uninitialised (httparse initialises what it parses), so a
    // head allocates nothing here; a higher limit spills to the heap.
    let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; 128];
    let mut spill;
    let slots: &mut [MaybeUninit<httparse::Header<'_>>] = if limits.max_headers <= storage.len() {
        &mut storage[..limits.max_headers]
    } else {
        spill = vec![MaybeUninit::uninit(); limits.max_headers];
        &mut spill
    };
    let mut req = httparse::Request::new(&mut []);
    let status = match req.parse_with_uninit_headers(buf, slots) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "too many header fields"));
        }
        Err(httparse::Error::Token) if req.method.is_none() => {
            return Err(HeadError::new(StatusCode::BAD_REQUEST, "malformed request line"));
        }
        // httparse reports any request line it cannot read to the end as a version error: `GE T /x HTTP/1.1`
        // too. Only a well-formed line whose version is not 1.0 or 1.1 is 505.
        Err(httparse::Error::Version) => return Err(version_error(buf)),
        Err(_) => {
            return Err(HeadError::new(StatusCode::BAD_REQUEST, "malformed request head"));
        }
    };
    let len = match status {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => {
            return if request_line_too_long(buf, limits) {
                Err(HeadError::new(StatusCode::URI_TOO_LONG, "request target too long"))
            } else if buf.len() + skipped >= limits.max_head_bytes {
                Err(HeadError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"))
            } else {
                Ok(Parsed::Partial)
            };
        }
    };
    // httparse tolerates bare LF line ends; a proxy in front may not, and disagreement is how smuggling starts.
    if has_bare_lf(&buf[..len]) {
        return Err(HeadError::new(StatusCode::BAD_REQUEST, "bare LF in request head"));
    }
    let target = req.path.unwrap_or_default();
    if target.len() > limits.max_uri_bytes {
        return Err(HeadError::new(StatusCode::URI_TOO_LONG, "request target too long"));
    }
    if len + skipped > limits.max_head_bytes {
        return Err(HeadError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"));
    }
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::new(StatusCode::BAD_REQUEST, "malformed method"))?;
    // One copy of the head; the target and every field are views into it rather than a copy each. httparse
    // hands out subslices of `buf`, so each one's offset in `buf` is its offset in the copy.
    // An HTTP/1.0 absolute-form request may come without Host: the copy then ends with a `host` name for the
    // target's authority to be the value of (below), a field the request did not spell but RFC 9112 §3.2.2 gives.
    let host_from_target = version == Version::HTTP_10
        && !target.starts_with('/')
        && !req.headers.iter().any(|h| h.name.eq_ignore_ascii_case("host"));
    let copy = if host_from_target {
        bytes::Bytes::from([&buf[..len], b"host"].concat())
    } else {
        bytes::Bytes::copy_from_slice(&buf[..len])
    };
    let mut fields = HeadFields::new(copy, req.headers.len() + usize::from(host_from_target));
    // Anything else would be an httparse bug: refused rather than trusted.
    let not_ours = || HeadError::new(StatusCode::BAD_REQUEST, "malformed request head");
    let offset = |part: &[u8]| (part.as_ptr() as usize).checked_sub(buf.as_ptr() as usize).ok_or_else(not_ours);
    let target_start = offset(target.as_bytes())?;
    // The authority of an absolute-form target, where it lies in the head: the request's Host (below).
    let mut authority = None;
    let target = match origin_form(target) {
        Some(query) => {
            let start = u32::try_from(target_start).map_err(|_| not_ours())?;
            Target::Origin { start, len: target.len() as u32, query }
        }
        None => {
            // Sharing the head's bytes makes them reference-counted: only here, off the usual path.
            let shared = fields.bytes().slice(target_start..target_start + target.len());
            let (uri, span) = parse_target(target, shared, &method)?;
            authority = span.map(|(start, len)| (target_start + start, len));
            Target::Uri(uri)
        }
    };
    // Most requests have no framing or Connection field: noted here, they are not looked up again below.
    let (mut framed, mut connection, mut hosts) = (false, false, 0);
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        framed |= name.eq_ignore_ascii_case(b"content-length") || name.eq_ignore_ascii_case(b"transfer-encoding");
        connection |= name.eq_ignore_ascii_case(b"connection");
        let host = name.eq_ignore_ascii_case(b"host");
        hosts += usize::from(host);
        // RFC 9112 §3.2.2: with an absolute-form target, Host is ignored and the target's authority is the host,
        // for everything that reads it (the virtual-hosted bucket, SigV4's signed `host`, CORS, redirects).
        let (value_start, value_len) = match authority {
            Some(span) if host => span,
            _ => (offset(h.value)?, h.value.len()),
        };
        // httparse refused names that are not tokens and values with CR, LF, NUL or other controls: what
        // `HeaderName` and `HeaderValue` refuse.
        fields.push_at(offset(name)?, name, value_start, value_len).ok_or_else(not_ours)?;
    }
    if let (true, Some((start, len_of))) = (host_from_target, authority) {
        fields.push_at(len, b"host", start, len_of).ok_or_else(not_ours)?;
    }
    let body = if framed { check_framing(&fields, version, limits.bodies.takes(&method))? } else { BodyFraming::None };
    // RFC 9112 §3.2: a client MUST send Host in HTTP/1.1; a server MUST answer 400 when it is missing or repeated.
    if (version == Version::HTTP_11 && hosts != 1) || hosts > 1 {
        return Err(HeadError::new(StatusCode::BAD_REQUEST, "exactly one Host header is required"));
    }
    let keep_alive = if connection { wants_keep_alive(&fields, version) } else { version != Version::HTTP_10 };
    Ok(Parsed::Complete(Box::new(RequestHead {
        method,
        target,
        version,
        fields,
        keep_alive,
        body,
        len: len + skipped,
        peer: std::net::Ipv4Addr::UNSPECIFIED.into(),
    })))
}

/// A request target as the application reads it.
#[derive(Debug)]
enum Target {
    /// Origin-form (`/path?query`) whose every byte `Uri` accepts where it stands: its place in the head (and its
    /// `?`'s, from the target's start). The `Uri` is built only for a handler that takes an `http::Request`.
    Origin { start: u32, len: u32, query: Option<u32> },
    /// Anything else `Uri` accepts (absolute-form, kept as its path and query, its authority the Host field's
    /// value; or `*`).
    Uri(Uri),
}

impl RequestHead {
    /// The target's path (still percent-encoded) and its query, if it has one (`?` and nothing after it is an
    /// empty query, as `Uri` has it).
    pub fn path_and_query(&self) -> (&str, Option<&str>) {
        match &self.target {
            Target::Origin { query: None, .. } => (self.origin_target(), None),
            Target::Origin { query: Some(q), .. } => {
                let (path, query) = self.origin_target().split_at(*q as usize);
                (path, Some(&query[1..]))
            }
            Target::Uri(uri) => (uri.path(), uri.query()),
        }
    }

    pub fn path(&self) -> &str {
        self.path_and_query().0
    }

    pub fn query(&self) -> Option<&str> {
        self.path_and_query().1
    }

    /// The target as a `Uri`.
    pub fn uri(&self) -> Uri {
        match &self.target {
            Target::Origin { start, len, .. } => {
                let (start, end) = (*start as usize, (*start + *len) as usize);
                Uri::from_maybe_shared(self.fields.bytes().slice(start..end))
                    .expect("every byte of an origin-form target is one Uri accepts where it stands")
            }
            Target::Uri(uri) => uri.clone(),
        }
    }

    fn origin_target(&self) -> &str {
        let Target::Origin { start, len, .. } = self.target else { return "" };
        // httparse handed the target out as a `str`, and these are its bytes.
        std::str::from_utf8(&self.fields.bytes()[start as usize..][..len as usize]).unwrap_or("")
    }
}

/// For an origin-form target that `Uri` takes byte for byte: `Some` with the offset of its `?` (if any); `None`
/// for anything else, which `parse_target` then reads (and refuses, if it must).
fn origin_form(target: &str) -> Option<Option<u32>> {
    let bytes = target.as_bytes();
    if bytes.first() != Some(&b'/') || bytes.len() >= usize::from(u16::MAX) - 1 {
        return None;
    }
    let classes = target_byte_classes();
    let query = memchr::memchr(b'?', bytes);
    let (path, rest) = bytes.split_at(query.unwrap_or(bytes.len()));
    let rest = rest.get(1..).unwrap_or_default();
    (path.iter().all(|&b| classes.path[usize::from(b)]) && rest.iter().all(|&b| classes.query[usize::from(b)]))
        .then_some(query.map(|q| q as u32))
}

/// Which bytes `Uri` accepts in a target's path and in its query, asked of `http` itself once per byte (its check
/// is by byte class, so what it accepts alone it accepts in any sequence), so the two can never disagree. High
/// bytes are accepted as `Uri` accepts them in valid UTF-8, which every target httparse hands out is. `#` is
/// not among them: a fragment is refused (`parse_target`).
struct TargetBytes {
    path: [bool; 256],
    query: [bool; 256],
}

fn target_byte_classes() -> &'static TargetBytes {
    static CLASSES: std::sync::LazyLock<TargetBytes> = std::sync::LazyLock::new(|| {
        let accepts = |target: &[u8]| http::uri::PathAndQuery::try_from(target).is_ok();
        let mut classes = TargetBytes { path: [false; 256], query: [false; 256] };
        for b in 0..=255u8 {
            let (in_path, in_query) = if b.is_ascii() {
                (accepts(&[b'/', b]), accepts(&[b'/', b'?', b]))
            } else {
                (accepts("/é".as_bytes()), accepts("/?é".as_bytes()))
            };
            classes.path[usize::from(b)] = in_path && b != b'#' && b != b'?';
            classes.query[usize::from(b)] = in_query && b != b'#';
        }
        classes
    });
    &CLASSES
}

/// The HTTP/2 connection preface (RFC 9113 §3.4) as far as its request line: a client with prior knowledge.
const HTTP2_PREFACE_LINE: &[u8] = b"PRI * HTTP/2.0";

/// Why httparse refused a request line at its version: 505 for a well-formed `method SP target SP HTTP/d.d`
/// line (RFC 9112 §2.3) in another version, with its own message for the HTTP/2 preface; 400 for anything else.
fn version_error(buf: &[u8]) -> HeadError {
    if buf.starts_with(HTTP2_PREFACE_LINE) {
        return HeadError::new(StatusCode::HTTP_VERSION_NOT_SUPPORTED, HTTP2_NOT_SUPPORTED);
    }
    let line = buf.split(|&b| b == b'\r' || b == b'\n').next().unwrap_or_default();
    let well_formed = match line.split(|&b| b == b' ').collect::<Vec<_>>()[..] {
        [method, target, version] => {
            !method.is_empty()
                && method.iter().all(|&b| is_tchar(b))
                && !target.is_empty()
                && matches!(version, [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
                    if major.is_ascii_digit() && minor.is_ascii_digit())
        }
        _ => false,
    };
    if well_formed {
        HeadError::new(StatusCode::HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.0 and HTTP/1.1 are supported")
    } else {
        HeadError::new(StatusCode::BAD_REQUEST, "malformed request line")
    }
}

/// The 505 message for a client that speaks HTTP/2 with prior knowledge; the driver logs it at info.
pub const HTTP2_NOT_SUPPORTED: &str = "HTTP/2 is not supported on this listener; use HTTP/1.1";

/// RFC 9110 §5.6.2 tchar.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn has_bare_lf(head: &[u8]) -> bool {
    // memchr jumps from line end to line end; a byte-by-byte scan was a visible part of a small request's CPU.
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

fn leading_empty_lines(buf: &[u8]) -> usize {
    let mut i = 0;
    while buf[i..].starts_with(b"\r\n") {
        i += 2;
    }
    i
}

/// The request line is still incomplete but already longer than any target we accept.
fn request_line_too_long(buf: &[u8], limits: &HeadLimits) -> bool {
    let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    // Method, two spaces and "HTTP/1.1" fit easily in 64 bytes beside the target.
    line_end > limits.max_uri_bytes + 64
}

/// Origin-form (`/path?q`) and absolute-form (`http://host/path`, RFC 9112 §3.2.2) are accepted: the target as
/// a path and query, and for absolute-form where its authority lies in `target` (start, length), which then
/// stands for Host. `*` is for OPTIONS only; authority-form is for CONNECT, which we do not serve.
/// `shared` holds the same bytes as `target`, in the head's buffer: origin-form targets are taken without a copy.
fn parse_target(
    target: &str,
    shared: bytes::Bytes,
    method: &Method,
) -> Result<(Uri, Option<(usize, usize)>), HeadError> {
    let bad = || HeadError::new(StatusCode::BAD_REQUEST, "malformed request target");
    // RFC 9112 §3.2 has no fragment in a request target. `Uri` would drop it silently, so `/b/k#/../x` would be
    // served as `/b/k` while a proxy in front may have read it differently.
    if memchr::memchr(b'#', target.as_bytes()).is_some() {
        return Err(HeadError::new(StatusCode::BAD_REQUEST, "a request target must not contain a fragment (#)"));
    }
    if target == "*" {
        return if method == Method::OPTIONS { Ok((Uri::from_static("*"), None)) } else { Err(bad()) };
    }
    let uri = Uri::from_maybe_shared(shared).map_err(|_| bad())?;
    if target.starts_with('/') {
        return Ok((uri, None));
    }
    let (Some(scheme @ ("http" | "https")), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(bad());
    };
    // RFC 9110 §4.2.4: userinfo in an http(s) URI is an error; it would also make a host of `user@host`.
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return Err(HeadError::new(StatusCode::BAD_REQUEST, "the request target's authority must be a host"));
    }
    // `Uri` keeps the authority as it was written, just after `scheme://` (any case).
    let span = (scheme.len() + 3, authority.as_str().len());
    if target.get(span.0..span.0 + span.1) != Some(authority.as_str()) {
        return Err(bad());
    }
    let pq = uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("/");
    Ok((pq.parse().map_err(|_| bad())?, Some(span)))
}

/// RFC 9112 §6.3: TE with CL, differing or invalid CL, and TE on HTTP/1.0 are framing errors. Without
/// `accept_bodies` (a method the listener takes no body with) every TE and every non-zero CL is refused; with it, a CL body or the
/// `chunked` coding alone is taken, and any other transfer coding gets 501 (§6.1). The connection closes after
/// every refusal.
fn check_framing(headers: &HeadFields, version: Version, accept_bodies: bool) -> Result<BodyFraming, HeadError> {
    if !accept_bodies && headers.contains(&fields::TRANSFER_ENCODING) {
        return Err(HeadError::new(
            StatusCode::BAD_REQUEST,
            "request bodies are not accepted for this method on this listener",
        ));
    }
    let mut lengths = headers.values(&fields::CONTENT_LENGTH);
    let length = match lengths.next() {
        None => None,
        Some(_) if lengths.next().is_some() => {
            return Err(HeadError::new(StatusCode::BAD_REQUEST, "repeated Content-Length"));
        }
        Some(value) => {
            let digits = value;
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return Err(HeadError::new(StatusCode::BAD_REQUEST, "invalid Content-Length"));
            }
            let zero = digits.iter().all(|&d| d == b'0');
            if !zero && !accept_bodies {
                return Err(HeadError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request bodies are not accepted for this method on this listener",
                ));
            }
            // Digits only, so the parse fails on overflow alone.
            let n = std::str::from_utf8(digits).ok().and_then(|d| d.parse::<u64>().ok());
            Some(n.ok_or_else(|| HeadError::new(StatusCode::BAD_REQUEST, "invalid Content-Length"))?)
        }
    };
    let mut codings = headers.values(&fields::TRANSFER_ENCODING);
    let framing = match (codings.next(), length) {
        (None, None | Some(0)) => BodyFraming::None,
        (None, Some(n)) => BodyFraming::Length(n),
        (Some(_), _) if version == Version::HTTP_10 => {
            return Err(HeadError::new(StatusCode::BAD_REQUEST, "Transfer-Encoding in an HTTP/1.0 request"));
        }
        (Some(_), Some(_)) => {
            return Err(HeadError::new(StatusCode::BAD_REQUEST, "Transfer-Encoding together with Content-Length"));
        }
        (Some(coding), None) => {
            if codings.next().is_some() || !coding.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err(HeadError::new(
                    StatusCode::NOT_IMPLEMENTED,
                    "only the chunked transfer coding is supported",
                ));
            }
            BodyFraming::Chunked
        }
    };
    Ok(framing)
}

fn wants_keep_alive(headers: &HeadFields, version: Version) -> bool {
    let has_token = |token: &str| {
        headers
            .values(&fields::CONNECTION)
            .any(|v| std::str::from_utf8(v).is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token))))
    };
    match version {
        Version::HTTP_10 => has_token("keep-alive"),
        _ => !has_token("close"),
    }
}

/// How the response head says the connection continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    KeepAlive,
    /// HTTP/1.0 keep-alive must be said explicitly (RFC 9112 §9.3).
    KeepAliveHttp10,
    Close,
}

/// Serialises a response head into `out`: `shared` fields first (a file response's, see
/// `FileBody::shared_fields`) except the names `headers` has, then `headers`, then `body_length` as
/// Content-Length if `headers` has none. `date` is the preformatted IMF-fixdate for the Date header.
pub fn write_response_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    shared: Option<&SharedFields>,
    body_length: Option<u64>,
    date: &[u8],
    persistence: Persistence,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
    match shared {
        Some(shared) if shared.overlap(headers) => {
            shared.write_except(out, headers);
        }
        Some(shared) => out.extend_from_slice(shared.wire()),
        None => {}
    }
    write_fields(out, headers);
    if let Some(length) = body_length.filter(|_| !headers.contains_key(header::CONTENT_LENGTH)) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n");
    match persistence {
        Persistence::KeepAlive => {}
        Persistence::KeepAliveHttp10 => out.extend_from_slice(b"connection: keep-alive\r\n"),
        Persistence::Close => out.extend_from_slice(b"connection: close\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const LIMITS: HeadLimits =
        HeadLimits { max_head_bytes: 1024, max_headers: 8, max_uri_bytes: 256, bodies: Bodies::Never };
    const ADMIN: HeadLimits = HeadLimits { bodies: Bodies::Any, ..LIMITS };
    const DATA: HeadLimits = HeadLimits { bodies: Bodies::OnWrites, ..LIMITS };

    fn parse(raw: &[u8]) -> Result<Parsed, HeadError> {
        parse_request_head(raw, &LIMITS)
    }

    fn complete(raw: &[u8]) -> Box<RequestHead> {
        match parse(raw) {
            Ok(Parsed::Complete(h)) => h,
            Ok(Parsed::Partial) => panic!("partial: {:?}", String::from_utf8_lossy(raw)),
            Err(e) => panic!("error {e:?} for {:?}", String::from_utf8_lossy(raw)),
        }
    }

    fn status_of(raw: &[u8]) -> StatusCode {
        match parse(raw) {
            Err(e) => e.status,
            Ok(_) => StatusCode::OK,
        }
    }

    #[test]
    fn header_limits_hold_on_the_stack_and_above_it() {
        // 128 slots live on the stack; a higher limit spills to the heap. Both count the same way.
        for max_headers in [8, 100, 128, 129, 300] {
            let limits = HeadLimits { max_head_bytes: 64 << 10, max_headers, ..LIMITS };
            let head = |fields: usize| {
                let mut raw = b"GET /b/k HTTP/1.1\r\nhost: x\r\n".to_vec();
                for i in 1..fields {
                    raw.extend_from_slice(format!("x-f{i}: {i}\r\n").as_bytes());
                }
                raw.extend_from_slice(b"\r\n");
                parse_request_head(&raw, &limits)
            };
            match head(max_headers) {
                Ok(Parsed::Complete(h)) => {
                    let map = h.fields.to_header_map();
                    assert_eq!(map.len(), max_headers);
                    assert_eq!(map.get(format!("x-f{}", max_headers - 1)).unwrap(), &*(max_headers - 1).to_string());
                }
                other => panic!("{max_headers} fields under a limit of {max_headers}: {:?}", other.err()),
            }
            let refused = head(max_headers + 1).err().map(|e| e.status);
            assert_eq!(refused, Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE), "limit {max_headers}");
        }
    }

    #[test]
    fn parses_a_pipelined_head_and_reports_its_length() {
        let raw = b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\nGET /b/j HTTP/1.1\r\n";
        let head = complete(raw);
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.path(), "/b/k");
        assert_eq!(&raw[head.len..], b"GET /b/j HTTP/1.1\r\n");
        assert!(head.keep_alive);
        assert!(matches!(parse(&raw[head.len..]), Ok(Parsed::Partial)));
    }

    #[test]
    fn keep_alive_follows_version_and_connection_tokens() {
        assert!(!complete(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n").keep_alive);
        assert!(!complete(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, close\r\n\r\n").keep_alive);
        assert!(!complete(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(complete(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
    }

    #[test]
    fn absolute_form_keeps_only_path_and_query() {
        let head = complete(b"GET http://example.com/b/k?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
        assert_eq!(head.path(), "/b/k");
        assert_eq!(head.query(), Some("x=1"));
        assert!(head.uri().authority().is_none());
    }

    #[test]
    fn an_absolute_form_target_s_authority_replaces_host() {
        let head = complete(b"GET HTTP://Other.s3.test:9000/a/x HTTP/1.1\r\nX: 1\r\nHost: priv.s3.test\r\n\r\n");
        assert_eq!((head.path(), head.query()), ("/a/x", None));
        assert_eq!(head.fields.get(&fields::HOST), Some(&b"Other.s3.test:9000"[..]));
        assert_eq!(head.fields.to_header_map()[header::HOST], "Other.s3.test:9000");
        assert_eq!(head.fields.to_header_map()["x"], "1", "the other fields are untouched");
        let head = complete(b"GET https://o/ HTTP/1.1\r\nHost: p\r\n\r\n");
        assert_eq!((head.path(), head.fields.get(&fields::HOST)), ("/", Some(&b"o"[..])));
        // HTTP/1.0 may send none: the authority is the host all the same.
        let head = complete(b"GET http://o:81/a HTTP/1.0\r\nX: 1\r\n\r\n");
        assert_eq!(head.fields.get(&fields::HOST), Some(&b"o:81"[..]));
        assert_eq!(head.fields.to_header_map()[header::HOST], "o:81");
        assert_eq!(complete(b"GET /a HTTP/1.0\r\n\r\n").fields.get(&fields::HOST), None);
        // Origin-form keeps its Host.
        assert_eq!(complete(b"GET /a HTTP/1.1\r\nHost: p\r\n\r\n").fields.get(&fields::HOST), Some(&b"p"[..]));
        for raw in [
            &b"GET http://u@o/a HTTP/1.1\r\nHost: p\r\n\r\n"[..],
            b"GET http://u:pw@o/a HTTP/1.1\r\nHost: p\r\n\r\n",
            b"GET http://o/a HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(status_of(raw), StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn refuses_bodies_and_ambiguous_framing() {
        let cases: &[(&[u8], u16)] = &[
            (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", 413),
            (b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x5\r\n\r\n", 400),
            (b"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\0b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n", 400),
            (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
            (b"GET / HTTP/3.0\r\nHost: x\r\n\r\n", 505),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
            (b"GE T /b/k HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"GET /b/k  HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"GET /b/k HTTP/1.1 x\r\nHost: x\r\n\r\n", 400),
            (b"GET /b/k HTTP/11\r\nHost: x\r\n\r\n", 400),
            (b"GET /b/k http/1.1\r\nHost: x\r\n\r\n", 400),
            (b"GET /b/k#frag HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"GET /priv/b/z.txt#/../a/x HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"GET http://h/b/k#x HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            (b"GET /b/k?q=1# HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"GET nothing HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"GET / HTTP/1.1\nHost: x\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x\r\n\n", 400),
        ];
        for (raw, want) in cases {
            assert_eq!(status_of(raw).as_u16(), *want, "{:?}", String::from_utf8_lossy(raw));
        }
        assert_eq!(status_of(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"), StatusCode::OK);
    }

    #[test]
    fn the_admin_listener_takes_length_and_chunked_bodies_and_refuses_ambiguity() {
        let framing = |raw: &[u8]| match parse_request_head(raw, &ADMIN) {
            Ok(Parsed::Complete(head)) => Ok(head.body),
            Ok(Parsed::Partial) => panic!("partial"),
            Err(e) => Err(e.status.as_u16()),
        };
        let cases: &[(&[u8], Result<BodyFraming, u16>)] = &[
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", Ok(BodyFraming::Length(5))),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 000\r\n\r\n", Ok(BodyFraming::None)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\n\r\n", Ok(BodyFraming::None)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", Ok(BodyFraming::Chunked)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  Chunked \r\n\r\n", Ok(BodyFraming::Chunked)),
            (b"PUT /b/k HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc", Ok(BodyFraming::Length(3))),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", Err(400)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n", Err(400)),
            (b"PUT /b/k HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", Err(400)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", Err(501)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", Err(501)),
            (
                b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                Err(501),
            ),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", Err(400)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n", Err(400)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", Err(400)),
            (b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", Err(400)),
            (b"PUT /b/k#x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", Err(400)),
        ];
        for (raw, want) in cases {
            assert_eq!(framing(raw), *want, "{:?}", String::from_utf8_lossy(raw));
        }
        // A listener that takes no body refuses what the admin listener takes.
        assert_eq!(status_of(b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello").as_u16(), 413);
        assert_eq!(status_of(b"PUT /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").as_u16(), 400);
        // The data listener takes bodies with PUT and POST only: its reads stay body-free.
        let data = |raw: &[u8]| match parse_request_head(raw, &DATA) {
            Ok(Parsed::Complete(head)) => Ok(head.body),
            Ok(Parsed::Partial) => panic!("partial"),
            Err(e) => Err(e.status.as_u16()),
        };
        assert_eq!(data(b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"), Ok(BodyFraming::Length(5)));
        assert_eq!(
            data(b"POST /b?delete HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(BodyFraming::Chunked)
        );
        for method in ["GET", "HEAD", "OPTIONS", "DELETE"] {
            let with_length = format!("{method} /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
            assert_eq!(data(with_length.as_bytes()), Err(413), "{method}");
            let chunked = format!("{method} /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
            assert_eq!(data(chunked.as_bytes()), Err(400), "{method}");
            let empty = format!("{method} /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
            assert_eq!(data(empty.as_bytes()), Ok(BodyFraming::None), "{method}");
        }
    }

    #[test]
    fn an_http2_preface_gets_a_505_that_says_so() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        for raw in [&preface[..], &preface[..14]] {
            let e = parse(raw).err().expect("refused");
            assert_eq!((e.status, e.message), (StatusCode::HTTP_VERSION_NOT_SUPPORTED, HTTP2_NOT_SUPPORTED));
        }
        let e = parse(b"GET / HTTP/2.0\r\nHost: x\r\n\r\n").err().expect("refused");
        assert_ne!(e.message, HTTP2_NOT_SUPPORTED);
    }

    #[test]
    fn enforces_size_limits() {
        let long_target = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(300));
        assert_eq!(status_of(long_target.as_bytes()), StatusCode::URI_TOO_LONG);
        let partial_long_line = format!("GET /{}", "a".repeat(400));
        assert_eq!(status_of(partial_long_line.as_bytes()), StatusCode::URI_TOO_LONG);
        let many = format!("GET / HTTP/1.1\r\nHost: x\r\n{}\r\n", "X-A: b\r\n".repeat(9));
        assert_eq!(status_of(many.as_bytes()), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let big = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n", "v".repeat(1100));
        assert_eq!(status_of(big.as_bytes()), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }

    #[test]
    fn leading_empty_lines_are_skipped() {
        let head = complete(b"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(head.len, 4 + 27);
    }

    #[test]
    fn response_heads_are_serialised_with_date_and_persistence() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        let mut out = Vec::new();
        write_response_head(
            &mut out,
            StatusCode::PARTIAL_CONTENT,
            &h,
            None,
            None,
            b"Mon, 30 Nov 2026 07:00:00 GMT",
            Persistence::Close,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 206 Partial Content\r\ncontent-length: 5\r\ndate: Mon, 30 Nov 2026 07:00:00 GMT\r\nconnection: close\r\n\r\n"
        );
    }

    #[test]
    fn shared_fields_go_first_and_the_responses_own_replace_them() {
        let mut shared = HeaderMap::new();
        shared.insert(header::ETAG, HeaderValue::from_static("\"a\""));
        shared.append(header::CACHE_CONTROL, HeaderValue::from_static("max-age=1"));
        shared.append(header::CACHE_CONTROL, HeaderValue::from_static("immutable"));
        let shared = SharedFields::new(&shared).unwrap();
        let mut own = HeaderMap::new();
        own.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        own.insert(header::CACHE_CONTROL, HeaderValue::from_static("private"));
        let mut out = Vec::new();
        write_response_head(&mut out, StatusCode::OK, &own, Some(&shared), Some(9), b"D", Persistence::KeepAlive);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\netag: \"a\"\r\ncontent-length: 5\r\ncache-control: private\r\ndate: D\r\n\r\n",
            "the response's own Content-Length stands"
        );
        // Without an overlap, the shared fields go as they were written once, and the body's length with them.
        let mut out = Vec::new();
        write_response_head(
            &mut out,
            StatusCode::OK,
            &HeaderMap::new(),
            Some(&shared),
            Some(9),
            b"D",
            Persistence::Close,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\netag: \"a\"\r\ncache-control: max-age=1\r\ncache-control: immutable\r\n\
             content-length: 9\r\ndate: D\r\nconnection: close\r\n\r\n"
        );
    }

    #[test]
    fn each_byte_is_taken_in_place_only_where_uri_takes_it() {
        for b in 0..=127u8 {
            let in_path = [b'/', b];
            let in_query = [b'/', b'?', b];
            for target in [&in_path[..], &in_query[..]] {
                let Ok(target) = std::str::from_utf8(target) else { continue };
                if origin_form(target).is_some() {
                    let uri = Uri::try_from(target).unwrap_or_else(|e| panic!("{target:?}: {e}"));
                    assert!(!uri.to_string().contains('#'), "{target:?}");
                }
            }
        }
        assert_eq!(origin_form("/b/k"), Some(None));
        assert_eq!(origin_form("/b/k?"), Some(Some(4)));
        assert_eq!(origin_form("/b/k?x=1&y=%2F"), Some(Some(4)));
        assert_eq!(origin_form("/b/k#f"), None);
        assert_eq!(origin_form("http://h/b/k"), None);
        assert_eq!(origin_form("*"), None);
        let head = complete(b"GET /b/k? HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!((head.path(), head.query()), ("/b/k", Some("")));
        let head = complete(b"GET /b/k?a?b HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!((head.path(), head.query()), ("/b/k", Some("a?b")));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Header fields a generated request may carry, including the ones that matter for framing.
        fn header_field() -> impl Strategy<Value = (String, String)> {
            prop_oneof![
                Just(("Host".to_owned(), "example".to_owned())),
                Just(("Content-Length".to_owned(), "0".to_owned())),
                "[0-9]{1,3}".prop_map(|v| ("Content-Length".to_owned(), v)),
                Just(("Transfer-Encoding".to_owned(), "chunked".to_owned())),
                Just(("Connection".to_owned(), "close".to_owned())),
                ("[A-Za-z][A-Za-z-]{0,10}", "[ -~]{0,20}").prop_map(|(n, v)| (n, v.trim().to_owned())),
            ]
        }

        proptest! {
            /// A target read in place answers path, query and `Uri` exactly as a parsed `Uri` does, and one that
            /// is not read in place is refused or parsed as before.
            #[test]
            fn targets_read_in_place_agree_with_uri(target in "/[ -~é\u{80}]{0,24}") {
                let raw = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
                let by_uri = Uri::from_maybe_shared(bytes::Bytes::from(target.clone().into_bytes()));
                if let Ok(Parsed::Complete(head)) = parse_request_head(raw.as_bytes(), &LIMITS) {
                    let uri = by_uri.expect("a target the driver took is one Uri takes");
                    prop_assert_eq!(head.path(), uri.path());
                    prop_assert_eq!(head.query(), uri.query());
                    prop_assert_eq!(head.uri(), uri);
                    if origin_form(&target).is_some() {
                        let in_place = matches!(head.target, Target::Origin { .. });
                        prop_assert!(in_place, "{:?} read in place", target);
                    }
                }
            }

            /// The parser never panics, whatever the bytes.
            #[test]
            fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
                let _ = parse_request_head(&bytes, &LIMITS);
            }

            /// The memchr scan for bare LF agrees with the obvious byte-by-byte definition.
            #[test]
            fn bare_lf_scan_matches_its_definition(bytes in proptest::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'\r'), any::<u8>()], 0..64)) {
                let naive = bytes.iter().enumerate().any(|(i, &b)| b == b'\n' && (i == 0 || bytes[i - 1] != b'\r'));
                prop_assert_eq!(has_bare_lf(&bytes), naive);
            }

            /// A complete parse consumes exactly one head: the bytes up to and including the first blank line.
            #[test]
            fn consumes_exactly_one_head(path in "/[a-z0-9/]{0,30}", fields in proptest::collection::vec(header_field(), 0..6),
                                         tail in proptest::collection::vec(any::<u8>(), 0..40)) {
                let mut raw = format!("GET {path} HTTP/1.1\r\n");
                for (n, v) in &fields {
                    raw.push_str(&format!("{n}: {v}\r\n"));
                }
                raw.push_str("\r\n");
                let head_len = raw.len();
                let mut bytes = raw.into_bytes();
                bytes.extend_from_slice(&tail);
                if let Ok(Parsed::Complete(head)) = parse_request_head(&bytes, &LIMITS) {
                    prop_assert_eq!(head.len, head_len);
                }
            }

            /// The framing decision: a head that declares a body (any Transfer-Encoding, or a non-zero
            /// Content-Length) is never accepted, so a body can never be read as the next request.
            #[test]
            fn declared_bodies_are_always_refused(fields in proptest::collection::vec(header_field(), 0..6)) {
                let mut raw = "GET /b/k HTTP/1.1\r\nHost: h\r\n".to_owned();
                for (n, v) in &fields {
                    raw.push_str(&format!("{n}: {v}\r\n"));
                }
                raw.push_str("\r\n");
                let declares_body = fields.iter().any(|(n, v)| {
                    n.eq_ignore_ascii_case("transfer-encoding")
                        || (n.eq_ignore_ascii_case("content-length") && v.bytes().any(|b| b != b'0'))
                });
                if let Ok(Parsed::Complete(_)) = parse_request_head(raw.as_bytes(), &LIMITS) {
                    prop_assert!(!declares_body, "accepted a head that declares a body: {raw:?}");
                }
            }

            /// Every proper prefix of a valid head is Partial: we never act on half a head.
            #[test]
            fn prefixes_are_partial(path in "/[a-z0-9]{1,20}", cut in 0usize..1000) {
                let raw = format!("GET {path} HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1\r\n\r\n");
                let cut = cut % raw.len();
                let got = parse_request_head(&raw.as_bytes()[..cut], &LIMITS);
                prop_assert!(matches!(got, Ok(Parsed::Partial)), "prefix {:?}", &raw[..cut]);
            }

            /// Bytes that are not allowed in a head (NUL, bare CR, other controls) are refused, never passed on.
            #[test]
            fn control_bytes_in_values_are_refused(pos in 0usize..8, bad in prop_oneof![Just(0u8), Just(b'\r'), Just(b'\n'), 1u8..9, 11u8..13, 14u8..32, Just(127u8)]) {
                let mut value = b"abcdefgh".to_vec();
                value.insert(pos, bad);
                let mut raw = b"GET / HTTP/1.1\r\nHost: h\r\nX-V: ".to_vec();
                raw.extend_from_slice(&value);
                raw.extend_from_slice(b"\r\n\r\n");
                let got = parse_request_head(&raw, &LIMITS);
                prop_assert!(got.is_err(), "accepted control byte {bad:#x}");
            }
        }
    }
}
