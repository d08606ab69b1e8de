//! Finding SigV4 on a request and every check that needs no secret. Messages are S3's where S3 has one.

use std::borrow::Cow;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::header_values::{X_AMZ_CONTENT_SHA256, X_AMZ_DATE};

use super::canonical::{AmzDate, hex_32, payload_text, query_decode, split_ascii, split_once_ascii};
use super::{
    ALGORITHM, AuthKind, MAX_CLOCK_SKEW_SECS, MAX_PRESIGN_EXPIRES_SECS, PayloadHash, RequestParts, SERVICE, SigV4Auth,
    SigV4Error, TERMINATOR, cold,
};

const QUERY_ALGORITHM: &str = "X-Amz-Algorithm";
const QUERY_CREDENTIAL: &str = "X-Amz-Credential";
const QUERY_DATE: &str = "X-Amz-Date";
const QUERY_EXPIRES: &str = "X-Amz-Expires";
const QUERY_SIGNED_HEADERS: &str = "X-Amz-SignedHeaders";
const QUERY_SIGNATURE: &str = "X-Amz-Signature";

const QUERY_INCOMPLETE: &str = "Query-string authentication version 4 requires the X-Amz-Algorithm, \
     X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters.";

pub(super) fn parse<'a>(
    request: &RequestParts<'a>,
    region: &'a str,
    now: i64,
) -> Result<Option<SigV4Auth<'a>>, SigV4Error> {
    let found = AuthHeaders::find(request.headers);
    let authorization = authorization_header(&found)?;
    let query = presign_query(request.query)?;
    match (authorization, query) {
        (Some(_), Some(_)) => Err(cold(|| {
            SigV4Error::InvalidArgument(
                "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string \
             parameter or the Authorization header should be specified"
                    .into(),
            )
        })),
        (Some(Authorization::SigV4(value)), None) => parse_header_auth(request, &found, value, region, now).map(Some),
        (Some(Authorization::Other), None) | (None, None) => Ok(None),
        (None, Some(params)) => parse_query_auth(request, &found, params, region, now).map(Some),
    }
}

enum Authorization<'a> {
    /// The value after `AWS4-HMAC-SHA256 `.
    SigV4(&'a str),
    /// Another scheme (a bearer token): not ours to judge, but it still conflicts with a presign query.
    Other,
}

/// The headers SigV4 reads, found in one scan of the request's few fields rather than by a hashed lookup each.
struct AuthHeaders<'h> {
    /// The first `Authorization` field, and whether there was another.
    authorization: Option<&'h HeaderValue>,
    authorization_repeated: bool,
    date: Option<&'h HeaderValue>,
    /// `Date`: what dates a request without `x-amz-date`.
    http_date: Option<&'h HeaderValue>,
    content_sha256: Option<&'h HeaderValue>,
}

impl<'h> AuthHeaders<'h> {
    fn find(headers: &'h HeaderMap) -> Self {
        let mut found = AuthHeaders {
            authorization: None,
            authorization_repeated: false,
            date: None,
            http_date: None,
            content_sha256: None,
        };
        for (name, value) in headers {
            let slot = if name == header::AUTHORIZATION {
                found.authorization_repeated |= found.authorization.is_some();
                &mut found.authorization
            } else if name == X_AMZ_DATE {
                &mut found.date
            } else if name == header::DATE {
                &mut found.http_date
            } else if name == X_AMZ_CONTENT_SHA256 {
                &mut found.content_sha256
            } else {
                continue;
            };
            // The first field of a name, as `HeaderMap::get` gives it.
            slot.get_or_insert(value);
        }
        found
    }
}

fn authorization_header<'h>(found: &AuthHeaders<'h>) -> Result<Option<Authorization<'h>>, SigV4Error> {
    let Some(value) = found.authorization else { return Ok(None) };
    let text = value.to_str().unwrap_or("");
    let scheme = split_ascii(text, b' ').next().unwrap_or("");
    let sigv4 = match scheme {
        ALGORITHM => Some(text[ALGORITHM.len()..].trim_start_matches(' ')),
        "AWS" => return Err(cold(sigv2_refused)),
        s if s.starts_with("AWS4-") => {
            return Err(cold(|| SigV4Error::InvalidRequest(format!("Unsupported Authorization Type: {s}"))));
        }
        _ => None,
    };
    match (sigv4, found.authorization_repeated) {
        (Some(_), true) => Err(cold(|| SigV4Error::InvalidArgument("The Authorization header is repeated.".into()))),
        (Some(value), false) => Ok(Some(Authorization::SigV4(value))),
        (None, _) => Ok(Some(Authorization::Other)),
    }
}

/// The six presign parameters, decoded.
#[derive(Default)]
struct QueryParams {
    algorithm: Option<String>,
    credential: Option<String>,
    date: Option<String>,
    expires: Option<String>,
    signed_headers: Option<String>,
    signature: Option<String>,
}

/// SigV2, in the header (`AWS ak:sig`) or presigned (`AWSAccessKeyId=`), in S3's words.
pub fn sigv2_refused() -> SigV4Error {
    SigV4Error::InvalidRequest(
        "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256.".into(),
    )
}

fn presign_query(query: Option<&str>) -> Result<Option<QueryParams>, SigV4Error> {
    let Some(query) = query else { return Ok(None) };
    let mut params = QueryParams::default();
    let (mut any, mut sigv2) = (false, false);
    for piece in query.split('&').filter(|p| !p.is_empty()) {
        let (raw_name, raw_value) = piece.split_once('=').unwrap_or((piece, ""));
        let name = query_decode(raw_name);
        let slot = match name.as_slice() {
            b"AWSAccessKeyId" => {
                sigv2 = true;
                continue;
            }
            n if n == QUERY_ALGORITHM.as_bytes() => &mut params.algorithm,
            n if n == QUERY_CREDENTIAL.as_bytes() => &mut params.credential,
            n if n == QUERY_DATE.as_bytes() => &mut params.date,
            n if n == QUERY_EXPIRES.as_bytes() => &mut params.expires,
            n if n == QUERY_SIGNED_HEADERS.as_bytes() => &mut params.signed_headers,
            n if n == QUERY_SIGNATURE.as_bytes() => &mut params.signature,
            _ => continue,
        };
        any = true;
        let value = String::from_utf8(query_decode(raw_value))
            .map_err(|_| cold(|| SigV4Error::query(format!("{} is not UTF-8", String::from_utf8_lossy(&name)))))?;
        if slot.replace(value).is_some() {
            return Err(cold(|| SigV4Error::query(format!("{} is repeated", String::from_utf8_lossy(&name)))));
        }
    }
    // Only the parameters that say "this is a SigV4 presign" make it one; the others are ordinary names a
    // client may use (they are then simply signed query parameters).
    let presign = params.algorithm.is_some() || params.credential.is_some() || params.signature.is_some();
    if sigv2 && !presign {
        return Err(cold(sigv2_refused));
    }
    Ok((any && presign).then_some(params))
}

fn parse_header_auth<'a>(
    request: &RequestParts<'a>,
    found: &AuthHeaders<'a>,
    value: &'a str,
    region: &'a str,
    now: i64,
) -> Result<SigV4Auth<'a>, SigV4Error> {
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for part in split_ascii(value, b',').map(|p| p.trim_matches(' ')).filter(|p| !p.is_empty()) {
        let (name, field) = split_once_ascii(part, b'=').ok_or_else(|| {
            cold(|| {
                SigV4Error::header(format!("The authorization header is malformed; '{part}' is not a key=value pair."))
            })
        })?;
        let slot = match name {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed_headers,
            "Signature" => &mut signature,
            _ => {
                return Err(cold(|| {
                    SigV4Error::header(format!("The authorization header is malformed; unknown component '{name}'."))
                }));
            }
        };
        if slot.replace(field).is_some() {
            return Err(cold(|| {
                SigV4Error::header(format!("The authorization header is malformed; {name} is repeated."))
            }));
        }
    }
    let missing = |what: &str| SigV4Error::header(format!("The authorization header is malformed; missing {what}."));
    let credential = credential.ok_or_else(|| cold(|| missing("Credential")))?;
    let signed_headers = signed_headers.ok_or_else(|| cold(|| missing("SignedHeaders")))?;
    let signature = signature.ok_or_else(|| cold(|| missing("Signature")))?;

    // `x-amz-date` wins; without it, `Date` dates the request, and then it must be signed.
    let timestamp = match found.date {
        Some(date) => date.to_str().ok().and_then(AmzDate::parse),
        None => found.http_date.and_then(|v| v.to_str().ok()).and_then(AmzDate::from_http_date),
    }
    .ok_or(SigV4Error::AccessDenied("AWS authentication requires a valid Date or x-amz-date header"))?;
    let access_key_id = parse_credential(credential, &timestamp, region, SigV4Error::header)?;
    let signed = parse_signed_headers(signed_headers, SigV4Error::header)?;
    check_signed(request.headers, &signed)?;
    if found.date.is_none() && !signed.contains(&"date") {
        return Err(SigV4Error::AccessDenied("The Date header dates this request, so it must be signed"));
    }
    if (now - timestamp.unix).abs() > MAX_CLOCK_SKEW_SECS {
        return Err(SigV4Error::RequestTimeTooSkewed);
    }
    let payload_text = payload_text(found.content_sha256, AuthKind::Header)?;
    let payload = PayloadHash::parse(payload_text)?;
    Ok(SigV4Auth {
        kind: AuthKind::Header,
        access_key_id: Cow::Borrowed(access_key_id),
        region,
        timestamp,
        signed_headers: Cow::Borrowed(signed_headers),
        signature: parse_signature(signature)?,
        payload,
        payload_text,
        expires_in: None,
    })
}

fn parse_query_auth<'a>(
    request: &RequestParts<'a>,
    found: &AuthHeaders<'a>,
    params: QueryParams,
    region: &'a str,
    now: i64,
) -> Result<SigV4Auth<'a>, SigV4Error> {
    let incomplete = || SigV4Error::query(QUERY_INCOMPLETE);
    let algorithm = params.algorithm.ok_or_else(incomplete)?;
    let credential = params.credential.ok_or_else(incomplete)?;
    let date = params.date.ok_or_else(incomplete)?;
    let expires = params.expires.ok_or_else(incomplete)?;
    let signed_headers = params.signed_headers.ok_or_else(incomplete)?;
    let signature = params.signature.ok_or_else(incomplete)?;
    if algorithm != ALGORITHM {
        return Err(cold(|| SigV4Error::query("X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"")));
    }
    let timestamp = AmzDate::parse(&date).ok_or_else(|| {
        cold(|| SigV4Error::query("X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\""))
    })?;
    let expires_in: i64 = match expires.parse() {
        Ok(n) if expires.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => return Err(cold(|| SigV4Error::query("X-Amz-Expires should be a number"))),
    };
    if expires_in > MAX_PRESIGN_EXPIRES_SECS {
        return Err(cold(|| SigV4Error::query("X-Amz-Expires must be less than a week (in seconds) that is 604800")));
    }
    let access_key_id = parse_credential(&credential, &timestamp, region, SigV4Error::query)?.to_owned();
    check_signed(request.headers, &parse_signed_headers(&signed_headers, SigV4Error::query)?)?;
    if timestamp.unix > now + MAX_CLOCK_SKEW_SECS {
        return Err(SigV4Error::AccessDenied("Request is not valid yet"));
    }
    if now > timestamp.unix + expires_in {
        return Err(SigV4Error::AccessDenied("Request has expired"));
    }
    let payload_text = payload_text(found.content_sha256, AuthKind::Query)?;
    let payload = PayloadHash::parse(payload_text)?;
    if matches!(payload, PayloadHash::StreamingSigned | PayloadHash::StreamingSignedTrailer) {
        return Err(cold(|| {
            SigV4Error::InvalidRequest("a signed streaming payload needs header authentication".into())
        }));
    }
    Ok(SigV4Auth {
        kind: AuthKind::Query,
        access_key_id: Cow::Owned(access_key_id),
        region,
        timestamp,
        signed_headers: Cow::Owned(signed_headers),
        signature: parse_signature(&signature)?,
        payload,
        payload_text,
        expires_in: Some(expires_in),
    })
}

/// `AKID/YYYYMMDD/region/s3/aws4_request`, checked against the request's date and our region: the access key id.
fn parse_credential<'c>(
    credential: &'c str,
    timestamp: &AmzDate,
    region: &str,
    error: fn(String) -> SigV4Error,
) -> Result<&'c str, SigV4Error> {
    let mut parts = split_ascii(credential, b'/');
    let mut next = || parts.next();
    let (Some(access_key_id), Some(date), Some(scope_region), Some(service), Some(terminator), None) =
        (next(), next(), next(), next(), next(), next())
    else {
        return Err(cold(|| {
            error(format!(
                "The authorization header is malformed; the Credential is mal-formed; expecting \
             \"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request\"; got \"{credential}\"."
            ))
        }));
    };
    if access_key_id.is_empty() {
        return Err(cold(|| error("The authorization header is malformed; the access key id is empty.".into())));
    }
    if date != timestamp.date() {
        return Err(cold(|| {
            error(format!(
                "Invalid credential date \"{date}\". This date is not the same as X-Amz-Date: \"{}\".",
                timestamp.date()
            ))
        }));
    }
    if scope_region != region {
        return Err(cold(|| {
            error(format!(
                "The authorization header is malformed; the region '{scope_region}' is wrong; expecting '{region}'"
            ))
        }));
    }
    if service != SERVICE {
        return Err(cold(|| {
            error(format!(
                "The authorization header is malformed; incorrect service \"{service}\". This endpoint belongs to \"{SERVICE}\"."
            ))
        }));
    }
    if terminator != TERMINATOR {
        return Err(cold(|| {
            error(format!(
                "The authorization header is malformed; incorrect terminal \"{terminator}\". This endpoint uses \"{TERMINATOR}\"."
            ))
        }));
    }
    Ok(access_key_id)
}

/// `host;range;x-amz-date`: lowercase header names, sorted, unique, including `host`. The names, in order.
fn parse_signed_headers(text: &str, error: fn(String) -> SigV4Error) -> Result<SignedNames<'_>, SigV4Error> {
    // One pass over the bytes; a malformed name is reported before an unsorted list, and that before a missing
    // host.
    let (mut malformed, mut unsorted, mut host) = (false, false, false);
    let mut names = SignedNames::new();
    let bytes = text.as_bytes();
    let mut start = 0;
    while start <= bytes.len() {
        let mut end = start;
        while end < bytes.len() && bytes[end] != b';' {
            malformed |= !LOWERCASE_TOKEN[usize::from(bytes[end])];
            end += 1;
        }
        let name = &text[start..end];
        malformed |= name.is_empty();
        unsorted |= names.last().is_some_and(|p| *p >= name);
        host |= name == "host";
        names.push(name);
        start = end + 1;
    }
    if malformed {
        return Err(cold(|| {
            error(format!("SignedHeaders must be lowercase header names separated by ';', got \"{text}\"."))
        }));
    }
    if unsorted {
        return Err(cold(|| error(format!("SignedHeaders must be sorted and unique, got \"{text}\"."))));
    }
    if !host {
        return Err(cold(|| error("SignedHeaders must include host.".into())));
    }
    Ok(names)
}

/// The signed header names of one request: a handful, so they stay on the stack.
type SignedNames<'t> = smallvec::SmallVec<[&'t str; 12]>;

/// RFC 9110's token bytes without `A-Z`: what a signed header name may be made of.
static LOWERCASE_TOKEN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = byte.is_ascii_lowercase()
            || byte.is_ascii_digit()
            || matches!(
                byte,
                b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~'
            );
        b += 1;
    }
    table
};

/// Every `x-amz-*` header that was sent must be signed, so that none can be added or changed on the way.
fn check_signed(headers: &HeaderMap, signed: &[&str]) -> Result<(), SigV4Error> {
    let unsigned =
        headers.keys().map(HeaderName::as_str).any(|name| name.starts_with("x-amz-") && !signed.contains(&name));
    if unsigned {
        return Err(SigV4Error::AccessDenied("There were headers present in the request which were not signed"));
    }
    Ok(())
}

/// A signature exactly as SigV4 prints it: 64 lowercase hex digits. Any other spelling (uppercase included) does
/// not match, so no two texts verify as one signature.
fn parse_signature(text: &str) -> Result<[u8; 32], SigV4Error> {
    hex_32(text, true).ok_or(SigV4Error::SignatureDoesNotMatch)
}

#[cfg(test)]
mod tests {
    use super::LOWERCASE_TOKEN;

    #[test]
    fn signed_header_name_bytes_are_the_lowercase_token_bytes() {
        for b in 0..=255u8 {
            let token = b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b);
            assert_eq!(LOWERCASE_TOKEN[usize::from(b)], token, "byte {b:#04x}");
        }
    }
}
