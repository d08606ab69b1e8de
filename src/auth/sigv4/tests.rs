//! The public examples of the S3 SigV4 documentation ("Examples: Signature Calculations"), the refusals, and the
//! key cache. Signatures here come from the documentation, never from our own signing.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::chunked::{ChunkedDecoder, Framing};
use super::*;

pub(super) const AKID: &str = "AKIAIOSFODNN7EXAMPLE";
pub(super) const SECRET: &[u8] = b"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
pub(super) const REGION: &str = "us-east-1";
/// 20130524T000000Z, the time of every documentation example.
pub(super) const EXAMPLE_TIME: i64 = 1_369_353_600;
pub(super) const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

pub(super) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value.as_bytes()).unwrap(),
        );
    }
    map
}

fn request<'a>(method: &'a str, path: &'a str, query: Option<&'a str>, headers: &'a HeaderMap) -> RequestParts<'a> {
    RequestParts { method, path, query, headers }
}

fn verify_at(request: &RequestParts<'_>, now: i64, secret: &[u8]) -> Result<Verified, SigV4Error> {
    let auth = parse(request, REGION, now)?.expect("a SigV4 request");
    auth.verify(request, secret, &SigningKeyCache::new(8))
}

fn authorization(signed_headers: &str, signature: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential={AKID}/20130524/{REGION}/s3/aws4_request,SignedHeaders={signed_headers},Signature={signature}"
    )
}

fn get_object_headers(signature: &str) -> HeaderMap {
    headers(&[
        ("host", "examplebucket.s3.amazonaws.com"),
        ("range", "bytes=0-9"),
        ("x-amz-content-sha256", EMPTY_SHA256),
        ("x-amz-date", "20130524T000000Z"),
        ("authorization", &authorization("host;range;x-amz-content-sha256;x-amz-date", signature)),
    ])
}

const GET_OBJECT_SIGNATURE: &str = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41";

#[test]
fn aws_example_get_object_with_range() {
    let h = get_object_headers(GET_OBJECT_SIGNATURE);
    let r = request("GET", "/test.txt", None, &h);
    let auth = parse(&r, REGION, EXAMPLE_TIME).unwrap().unwrap();
    assert_eq!(auth.access_key_id, AKID);
    assert_eq!(auth.kind, AuthKind::Header);
    // The documentation's canonical request and string to sign, line by line.
    let canonical = String::from_utf8(canonical::canonical_request(&r, &auth)).unwrap();
    assert_eq!(
        canonical,
        format!(
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:{EMPTY_SHA256}\n\
             x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n{EMPTY_SHA256}"
        )
    );
    assert_eq!(
        string_to_sign("20130524T000000Z", "20130524/us-east-1/s3/aws4_request", canonical.as_bytes()),
        "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n\
         7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
    );
    let verified = auth.verify(&r, SECRET, &SigningKeyCache::new(8)).unwrap();
    assert_eq!(verified.payload, PayloadHash::Sha256(hex::decode(EMPTY_SHA256).unwrap().try_into().unwrap()));
    assert_eq!(verified.streaming, None);
    assert_eq!(verify_at(&r, EXAMPLE_TIME, b"another secret"), Err(SigV4Error::SignatureDoesNotMatch));
    for (method, path) in [("HEAD", "/test.txt"), ("GET", "/test.txt2"), ("GET", "/Test.txt")] {
        assert_eq!(
            verify_at(&request(method, path, None, &h), EXAMPLE_TIME, SECRET),
            Err(SigV4Error::SignatureDoesNotMatch)
        );
    }
    let changed = headers(&[
        ("host", "examplebucket.s3.amazonaws.com"),
        ("range", "bytes=0-10"),
        ("x-amz-content-sha256", EMPTY_SHA256),
        ("x-amz-date", "20130524T000000Z"),
        ("authorization", &authorization("host;range;x-amz-content-sha256;x-amz-date", GET_OBJECT_SIGNATURE)),
    ]);
    let r = request("GET", "/test.txt", None, &changed);
    assert_eq!(verify_at(&r, EXAMPLE_TIME, SECRET), Err(SigV4Error::SignatureDoesNotMatch));
}

#[test]
fn aws_example_put_object() {
    let h = headers(&[
        ("host", "examplebucket.s3.amazonaws.com"),
        ("date", "Fri, 24 May 2013 00:00:00 GMT"),
        ("x-amz-date", "20130524T000000Z"),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        ("x-amz-content-sha256", "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"),
        (
            "authorization",
            &authorization(
                "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
                "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd",
            ),
        ),
    ]);
    let verified = verify_at(&request("PUT", "/test%24file.text", None, &h), EXAMPLE_TIME, SECRET).unwrap();
    let PayloadHash::Sha256(digest) = verified.payload else { panic!("{:?}", verified.payload) };
    let body_digest: [u8; 32] = Sha256::digest(b"Welcome to Amazon S3.").into();
    assert_eq!(check_payload_sha256(&digest, &body_digest), Ok(()));
    let other: [u8; 32] = Sha256::digest(b"Welcome to Amazon S3!").into();
    assert_eq!(check_payload_sha256(&digest, &other), Err(SigV4Error::ContentSha256Mismatch));
    // S3 signs the path as sent: the decoded spelling is another path.
    let r = request("PUT", "/test$file.text", None, &h);
    assert_eq!(verify_at(&r, EXAMPLE_TIME, SECRET), Err(SigV4Error::SignatureDoesNotMatch));
}

#[test]
fn aws_examples_with_query_parameters() {
    let cases = [
        ("lifecycle", "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
        ("max-keys=2&prefix=J", "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
        // Order on the wire does not matter: the canonical query is sorted.
        ("prefix=J&max-keys=2", "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
    ];
    for (query, signature) in cases {
        let h = headers(&[
            ("host", "examplebucket.s3.amazonaws.com"),
            ("x-amz-date", "20130524T000000Z"),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("authorization", &authorization("host;x-amz-content-sha256;x-amz-date", signature)),
        ]);
        assert!(verify_at(&request("GET", "/", Some(query), &h), EXAMPLE_TIME, SECRET).is_ok(), "{query}");
        let tampered = format!("{query}&x=1");
        let r = request("GET", "/", Some(&tampered), &h);
        assert_eq!(verify_at(&r, EXAMPLE_TIME, SECRET), Err(SigV4Error::SignatureDoesNotMatch), "{query}");
    }
}

const PRESIGNED_QUERY: &str = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";

#[test]
fn aws_example_presigned_url() {
    let h = headers(&[("host", "examplebucket.s3.amazonaws.com")]);
    let r = request("GET", "/test.txt", Some(PRESIGNED_QUERY), &h);
    let auth = parse(&r, REGION, EXAMPLE_TIME + 60).unwrap().unwrap();
    assert_eq!((auth.kind, &*auth.access_key_id, auth.expires_in), (AuthKind::Query, AKID, Some(86_400)));
    let verified = auth.verify(&r, SECRET, &SigningKeyCache::new(8)).unwrap();
    assert_eq!(verified.payload, PayloadHash::Unsigned);
    // Valid through the whole day, expired after it.
    assert!(verify_at(&r, EXAMPLE_TIME + 86_400, SECRET).is_ok());
    assert_eq!(verify_at(&r, EXAMPLE_TIME + 86_401, SECRET), Err(SigV4Error::AccessDenied("Request has expired")));
    assert_eq!(verify_at(&r, EXAMPLE_TIME - 901, SECRET), Err(SigV4Error::AccessDenied("Request is not valid yet")));
    // Every parameter is signed but the signature itself.
    for (from, to) in [("86400", "86401"), ("%2Fs3%2F", "%2Fs4%2F"), ("=host", "=host%3Bx"), ("000000Z", "000001Z")] {
        let tampered = PRESIGNED_QUERY.replace(from, to);
        let r = request("GET", "/test.txt", Some(&tampered), &h);
        assert!(verify_at(&r, EXAMPLE_TIME + 60, SECRET).is_err(), "{tampered}");
    }
    let added = format!("{PRESIGNED_QUERY}&response-content-type=text%2Fhtml");
    let r = request("GET", "/test.txt", Some(&added), &h);
    assert_eq!(verify_at(&r, EXAMPLE_TIME + 60, SECRET), Err(SigV4Error::SignatureDoesNotMatch));
}

/// The headers of the documentation's chunked PUT (seed signature `4f232c…`).
fn chunked_put_headers() -> HeaderMap {
    headers(&[
        ("host", "s3.amazonaws.com"),
        ("x-amz-date", "20130524T000000Z"),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        ("x-amz-content-sha256", STREAMING_SIGNED),
        ("content-encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "66560"),
        ("content-length", "66824"),
        (
            "authorization",
            &authorization(
                "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class",
                "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
            ),
        ),
    ])
}

/// The documentation's chunked body: 64 KiB and 1 KiB of `a`, then the final chunk; `trailer` follows it.
pub(super) fn example_chunked_body(signatures: [&str; 3], trailer: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(format!("10000;chunk-signature={}\r\n", signatures[0]).as_bytes());
    body.extend_from_slice(&[b'a'; 65_536]);
    body.extend_from_slice(format!("\r\n400;chunk-signature={}\r\n", signatures[1]).as_bytes());
    body.extend_from_slice(&[b'a'; 1024]);
    body.extend_from_slice(format!("\r\n0;chunk-signature={}\r\n", signatures[2]).as_bytes());
    body.extend_from_slice(trailer.as_bytes());
    body
}

pub(super) const CHUNK_SIGNATURES: [&str; 3] = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
];

pub(super) fn decode_all(decoder: &mut ChunkedDecoder, body: &[u8]) -> Result<(Vec<u8>, chunked::Verdict), SigV4Error> {
    let mut out = Vec::new();
    decoder.feed_all(body, |data| out.extend_from_slice(data))?;
    Ok((out, decoder.finish()?))
}

#[test]
fn aws_example_chunked_upload_seed_and_chunk_signatures() {
    let h = chunked_put_headers();
    let r = request("PUT", "/examplebucket/chunkObject.txt", None, &h);
    let verified = verify_at(&r, EXAMPLE_TIME, SECRET).unwrap();
    assert_eq!(verified.payload, PayloadHash::StreamingSigned);
    let body = example_chunked_body(CHUNK_SIGNATURES, "\r\n");
    assert_eq!(body.len(), 66_824, "the documentation's Content-Length");
    let mut decoder = ChunkedDecoder::for_request(&verified, &h).unwrap().unwrap();
    let (data, verdict) = decode_all(&mut decoder, &body).unwrap();
    assert_eq!(data, vec![b'a'; 66_560]);
    assert_eq!(verdict, chunked::Verdict { decoded_length: 66_560, checksum: None });

    // Each chunk signature chains from the one before: any change to any of them, or to the data, is refused.
    for i in 0..3 {
        let mut signatures = CHUNK_SIGNATURES;
        let flipped = flip_hex(CHUNK_SIGNATURES[i], 10);
        signatures[i] = &flipped;
        let mut decoder = ChunkedDecoder::for_request(&verified, &h).unwrap().unwrap();
        let body = example_chunked_body(signatures, "\r\n");
        assert_eq!(decode_all(&mut decoder, &body).unwrap_err(), SigV4Error::SignatureDoesNotMatch, "chunk {i}");
    }
    let mut tampered = example_chunked_body(CHUNK_SIGNATURES, "\r\n");
    tampered[100] = b'b';
    let mut decoder = ChunkedDecoder::for_request(&verified, &h).unwrap().unwrap();
    assert_eq!(decode_all(&mut decoder, &tampered).unwrap_err(), SigV4Error::SignatureDoesNotMatch);
    // Chunks in another order do not verify either.
    let seed = verified.streaming.clone().unwrap();
    let mut swapped = ChunkedDecoder::new(Framing::Signed(seed), 66_560, None).unwrap();
    let reordered = format!("400;chunk-signature={}\r\n", CHUNK_SIGNATURES[1]);
    assert_eq!(swapped.feed_all(reordered.as_bytes(), |_| {}), Ok(()));
    assert_eq!(swapped.feed_all(&[b'a'; 1024], |_| {}), Err(SigV4Error::SignatureDoesNotMatch));
}

pub(super) const TRAILER_CHUNK_SIGNATURES: [&str; 3] = [
    "b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
    "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
    "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
];
pub(super) const TRAILER_SEED: &str = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e";
const TRAILER_SIGNATURE: &str = "d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435";

pub(super) fn trailer_seed() -> StreamingSeed {
    StreamingSeed {
        seed_signature: hex::decode(TRAILER_SEED).unwrap().try_into().unwrap(),
        signing_key: SigningKey::derive(SECRET, "20130524", REGION),
        scope: "20130524/us-east-1/s3/aws4_request".into(),
        timestamp: "20130524T000000Z".into(),
    }
}

#[test]
fn aws_example_signed_trailer() {
    use checksum::ChecksumAlgorithm::Crc32c;
    let trailer = format!("\r\nx-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:{TRAILER_SIGNATURE}\r\n\r\n");
    let body = example_chunked_body(TRAILER_CHUNK_SIGNATURES, &trailer);
    let decoder = || ChunkedDecoder::new(Framing::SignedTrailer(trailer_seed()), 66_560, Some(Crc32c)).unwrap();
    let (data, verdict) = decode_all(&mut decoder(), &body).unwrap();
    assert_eq!(data, vec![b'a'; 66_560]);
    let checksum = checksum::Checksum { algorithm: Crc32c, base64: "sOO8/Q==".into() };
    assert_eq!(verdict.checksum, Some(checksum));

    // Without the blank line after the final chunk, and without the closing one: both seen from SDKs.
    for trailer in [
        format!("x-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:{TRAILER_SIGNATURE}\r\n\r\n"),
        format!("\r\nx-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:{TRAILER_SIGNATURE}\r\n"),
        format!("\r\nx-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:{TRAILER_SIGNATURE}"),
    ] {
        let body = example_chunked_body(TRAILER_CHUNK_SIGNATURES, &trailer);
        assert!(decode_all(&mut decoder(), &body).is_ok(), "{trailer:?}");
    }
    let refusals = [
        // Another checksum value, signed or not.
        (
            format!("\r\nx-amz-checksum-crc32c:AAAAAA==\r\nx-amz-trailer-signature:{TRAILER_SIGNATURE}\r\n\r\n"),
            SigV4Error::SignatureDoesNotMatch,
        ),
        (
            format!(
                "\r\nx-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:{}\r\n\r\n",
                flip_hex(TRAILER_SIGNATURE, 0)
            ),
            SigV4Error::SignatureDoesNotMatch,
        ),
        (
            "\r\nx-amz-checksum-crc32c:sOO8/Q==\r\n\r\n".to_owned(),
            SigV4Error::InvalidRequest("the trailer has no x-amz-trailer-signature".into()),
        ),
        (
            format!("\r\nx-amz-checksum-crc32:sOO8/Q==\r\nx-amz-trailer-signature:{TRAILER_SIGNATURE}\r\n\r\n"),
            SigV4Error::InvalidRequest(
                "the trailer carries x-amz-checksum-crc32, which x-amz-trailer did not announce".into(),
            ),
        ),
        ("\r\n\r\n".to_owned(), SigV4Error::InvalidRequest("the trailer has no x-amz-trailer-signature".into())),
    ];
    for (trailer, want) in refusals {
        let body = example_chunked_body(TRAILER_CHUNK_SIGNATURES, &trailer);
        assert_eq!(decode_all(&mut decoder(), &body).unwrap_err(), want, "{trailer:?}");
    }
}

/// `s` with the hex digit at `at` changed.
pub(super) fn flip_hex(s: &str, at: usize) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    chars[at] = if chars[at] == '0' { '1' } else { '0' };
    chars.into_iter().collect()
}

#[test]
fn clock_skew_is_fifteen_minutes_either_way() {
    let h = get_object_headers(GET_OBJECT_SIGNATURE);
    let r = request("GET", "/test.txt", None, &h);
    for now in [EXAMPLE_TIME - 900, EXAMPLE_TIME + 900] {
        assert!(verify_at(&r, now, SECRET).is_ok(), "{now}");
    }
    for now in [EXAMPLE_TIME - 901, EXAMPLE_TIME + 901, 0] {
        assert_eq!(parse(&r, REGION, now).unwrap_err(), SigV4Error::RequestTimeTooSkewed, "{now}");
    }
    assert_eq!(SigV4Error::RequestTimeTooSkewed.status(), StatusCode::FORBIDDEN);
}

#[test]
fn presign_lifetime_is_at_most_seven_days() {
    let h = headers(&[("host", "examplebucket.s3.amazonaws.com")]);
    let week = PRESIGNED_QUERY.replace("X-Amz-Expires=86400", "X-Amz-Expires=604800");
    let r = request("GET", "/test.txt", Some(&week), &h);
    // A week is allowed (the signature no longer matches, which comes after the lifetime check).
    assert_eq!(verify_at(&r, EXAMPLE_TIME, SECRET), Err(SigV4Error::SignatureDoesNotMatch));
    for expires in ["604801", "9999999999", "-1", "1e3", ""] {
        let query = PRESIGNED_QUERY.replace("X-Amz-Expires=86400", &format!("X-Amz-Expires={expires}"));
        let r = request("GET", "/test.txt", Some(&query), &h);
        let err = parse(&r, REGION, EXAMPLE_TIME).unwrap_err();
        assert_eq!(
            (err.code(), err.status()),
            ("AuthorizationQueryParametersError", StatusCode::BAD_REQUEST),
            "{expires}"
        );
    }
}

#[test]
fn the_scope_must_be_ours() {
    let cases = [
        ("20130524/eu-west-1/s3/aws4_request", "the region 'eu-west-1' is wrong; expecting 'us-east-1'"),
        ("20130524/us-east-1/ec2/aws4_request", "incorrect service \"ec2\""),
        ("20130524/us-east-1/s3/aws5_request", "incorrect terminal \"aws5_request\""),
        ("20130525/us-east-1/s3/aws4_request", "This date is not the same as X-Amz-Date"),
        ("20130524/us-east-1/s3", "the Credential is mal-formed"),
        ("20130524/us-east-1/s3/aws4_request/x", "the Credential is mal-formed"),
    ];
    for (scope, message) in cases {
        let value = format!(
            "AWS4-HMAC-SHA256 Credential={AKID}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={GET_OBJECT_SIGNATURE}"
        );
        let h = headers(&[
            ("host", "h"),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("x-amz-date", "20130524T000000Z"),
            ("authorization", &value),
        ]);
        let err = parse(&request("GET", "/", None, &h), REGION, EXAMPLE_TIME).unwrap_err();
        assert_eq!((err.code(), err.status()), ("AuthorizationHeaderMalformed", StatusCode::BAD_REQUEST), "{scope}");
        assert!(err.to_string().contains(message), "{scope}: {err}");

        let credential = scope.replace('/', "%2F");
        let query = PRESIGNED_QUERY.replace("20130524%2Fus-east-1%2Fs3%2Faws4_request", &credential);
        let h = headers(&[("host", "h")]);
        let err = parse(&request("GET", "/", Some(&query), &h), REGION, EXAMPLE_TIME).unwrap_err();
        assert_eq!(err.code(), "AuthorizationQueryParametersError", "{scope}");
        assert!(err.to_string().contains(message), "{scope}: {err}");
    }
}

#[test]
fn signed_headers_must_cover_host_and_every_x_amz_header() {
    let base = [("host", "h"), ("x-amz-content-sha256", EMPTY_SHA256), ("x-amz-date", "20130524T000000Z")];
    let with = |signed: &str, extra: &[(&str, &str)]| {
        let value = authorization(signed, GET_OBJECT_SIGNATURE);
        let mut pairs: Vec<(&str, &str)> = base.to_vec();
        pairs.extend_from_slice(extra);
        let mut h = headers(&pairs);
        h.insert("authorization", HeaderValue::from_str(&value).unwrap());
        parse(&request("GET", "/", None, &h), REGION, EXAMPLE_TIME).map(|a| a.map(|a| a.signed_headers.into_owned()))
    };
    assert!(with("host;x-amz-content-sha256;x-amz-date", &[]).is_ok());
    let unsigned = Err(SigV4Error::AccessDenied("There were headers present in the request which were not signed"));
    assert_eq!(with("host;x-amz-content-sha256;x-amz-date", &[("x-amz-meta-a", "1")]), unsigned);
    assert_eq!(with("host;x-amz-date", &[]), unsigned);
    for malformed in [
        "x-amz-content-sha256;x-amz-date",
        "host;x-amz-date;x-amz-content-sha256",
        "Host;x-amz-content-sha256;x-amz-date",
        "host;;x-amz-date",
        "host;host;x-amz-content-sha256;x-amz-date",
    ] {
        let err = with(malformed, &[]).unwrap_err();
        assert_eq!(err.code(), "AuthorizationHeaderMalformed", "{malformed}");
    }
    // Other headers need not be signed.
    assert!(with("host;x-amz-content-sha256;x-amz-date", &[("user-agent", "x"), ("content-type", "a/b")]).is_ok());
}

#[test]
fn what_is_not_sigv4_and_what_is_refused() {
    // Whether SigV4 was found (the parsed value borrows from the request, which lives inside the closure).
    let none = |h: &HeaderMap, q: Option<&str>| {
        parse(&request("GET", "/b/k", q, h), REGION, EXAMPLE_TIME).map(|found| found.map(|_| ()))
    };
    assert_eq!(none(&HeaderMap::new(), None), Ok(None));
    assert_eq!(none(&headers(&[("authorization", "Bearer abc")]), Some("bg-expires=1&bg-key=k&bg-sig=s")), Ok(None));
    // Parameters that only look like a presign are ordinary query parameters.
    assert_eq!(none(&HeaderMap::new(), Some("X-Amz-Date=1&X-Amz-Expires=2")), Ok(None));
    let code = |h: &HeaderMap, q: Option<&str>| none(h, q).unwrap_err().code();
    assert_eq!(code(&headers(&[("authorization", "AWS AKID:c2ln")]), None), "InvalidRequest");
    // A SigV2 presign gets SigV2's answer too, whatever the order of its parameters.
    for sigv2 in ["AWSAccessKeyId=AKID&Expires=9&Signature=c2ln", "Signature=c2ln&Expires=9&AWSAccessKeyId=AKID"] {
        assert_eq!(code(&HeaderMap::new(), Some(sigv2)), "InvalidRequest", "{sigv2}");
    }
    assert_eq!(code(&headers(&[("authorization", "AWS4-ECDSA-P256-SHA256 Credential=x")]), None), "InvalidRequest");
    let h = get_object_headers(GET_OBJECT_SIGNATURE);
    assert_eq!(code(&h, Some(PRESIGNED_QUERY)), "InvalidArgument");
    assert_eq!(code(&headers(&[("authorization", "Bearer abc")]), Some(PRESIGNED_QUERY)), "InvalidArgument");
    let mut twice = h.clone();
    twice.append("authorization", HeaderValue::from_static("Bearer abc"));
    assert_eq!(code(&twice, None), "InvalidArgument");
    for incomplete in ["X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Credential=a%2Fb", "X-Amz-Signature=00"] {
        assert_eq!(code(&HeaderMap::new(), Some(incomplete)), "AuthorizationQueryParametersError", "{incomplete}");
    }
    let repeated = format!("{PRESIGNED_QUERY}&X-Amz-Date=20130524T000000Z");
    assert_eq!(code(&HeaderMap::new(), Some(&repeated)), "AuthorizationQueryParametersError");
    let algorithm = PRESIGNED_QUERY.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA512");
    assert_eq!(code(&HeaderMap::new(), Some(&algorithm)), "AuthorizationQueryParametersError");

    // Missing or malformed dates and payload hashes.
    let value = authorization("host;x-amz-content-sha256;x-amz-date", GET_OBJECT_SIGNATURE);
    let no_date = headers(&[("host", "h"), ("x-amz-content-sha256", EMPTY_SHA256), ("authorization", &value)]);
    assert_eq!(code(&no_date, None), "AccessDenied");
    for date in ["20130524T000000", "20130532T000000Z", "20130229T000000Z", "2013-05-24T00:00:00Z", "20130524T240000Z"]
    {
        let h = headers(&[
            ("host", "h"),
            ("x-amz-content-sha256", EMPTY_SHA256),
            ("x-amz-date", date),
            ("authorization", &value),
        ]);
        assert_eq!(code(&h, None), "AccessDenied", "{date}");
    }
    let no_payload = headers(&[("host", "h"), ("x-amz-date", "20130524T000000Z"), ("authorization", &value)]);
    assert_eq!(code(&no_payload, None), "InvalidRequest");
    for payload in ["abc", "UNSIGNED", "STREAMING-AWS4-HMAC-SHA256-EVENTS", &EMPTY_SHA256[1..]] {
        let h = headers(&[
            ("host", "h"),
            ("x-amz-content-sha256", payload),
            ("x-amz-date", "20130524T000000Z"),
            ("authorization", &value),
        ]);
        assert_eq!(code(&h, None), "InvalidArgument", "{payload}");
    }
    // Signatures have one spelling: 64 lowercase hex digits.
    for signature in [
        GET_OBJECT_SIGNATURE.to_uppercase(),
        GET_OBJECT_SIGNATURE[1..].to_owned(),
        format!("{GET_OBJECT_SIGNATURE}0"),
        String::new(),
    ] {
        let h = get_object_headers(&signature);
        assert_eq!(code(&h, None), "SignatureDoesNotMatch", "{signature}");
    }
}

#[test]
fn error_codes_and_statuses_are_s3s() {
    let cases = [
        (SigV4Error::SignatureDoesNotMatch, "SignatureDoesNotMatch", 403),
        (SigV4Error::AuthorizationHeaderMalformed(String::new()), "AuthorizationHeaderMalformed", 400),
        (SigV4Error::AuthorizationQueryParametersError(String::new()), "AuthorizationQueryParametersError", 400),
        (SigV4Error::RequestTimeTooSkewed, "RequestTimeTooSkewed", 403),
        (SigV4Error::AccessDenied("Request has expired"), "AccessDenied", 403),
        (SigV4Error::InvalidArgument(String::new()), "InvalidArgument", 400),
        (SigV4Error::InvalidRequest(String::new()), "InvalidRequest", 400),
        (SigV4Error::MissingSecurityHeader(String::new()), "MissingSecurityHeader", 400),
        (SigV4Error::ContentSha256Mismatch, "XAmzContentSHA256Mismatch", 400),
        (SigV4Error::BadDigest("CRC32"), "BadDigest", 400),
        (SigV4Error::IncompleteBody, "IncompleteBody", 400),
    ];
    for (error, code, status) in cases {
        assert_eq!((error.code(), error.status().as_u16()), (code, status), "{error:?}");
    }
    assert_eq!(SigV4Error::AccessDenied("Request has expired").to_string(), "Request has expired");
}

#[test]
fn the_key_cache_derives_once_per_day_and_never_serves_another_secret() {
    let cache = SigningKeyCache::new(2);
    let key = cache.signing_key(AKID, SECRET, "20130524", REGION);
    assert_eq!(key, SigningKey::derive(SECRET, "20130524", REGION));
    assert_eq!(cache.signing_key(AKID, SECRET, "20130524", REGION), key);
    assert_ne!(cache.signing_key(AKID, SECRET, "20130525", REGION), key);
    assert_ne!(cache.signing_key(AKID, b"rotated", "20130524", REGION), key);
    assert_eq!(cache.signing_key(AKID, SECRET, "20130524", REGION), key);
    // Bounded: many keys never grow it past its capacity.
    for i in 0..100 {
        cache.signing_key(&format!("K{i}"), SECRET, "20130524", REGION);
    }
    assert!(cache.keys.len() <= 2, "{}", cache.keys.len());
    // A hit is served from the cache (found by its borrowed form): a planted entry comes back, for its secret only.
    let planted = SigningKey::from_bytes([9; 32]);
    let id = (AKID.to_owned(), "20130601".to_owned(), REGION.to_owned());
    cache.keys.insert(id, std::sync::Arc::new(CachedKey { secret: SECRET.into(), key: planted.clone() }));
    assert_eq!(cache.signing_key(AKID, SECRET, "20130601", REGION), planted);
    assert_ne!(cache.signing_key(AKID, b"other", "20130601", REGION), planted);
    assert_eq!(format!("{key:?}"), "SigningKey(..)");
    // The documentation's example signature verifies through a warm cache too.
    let h = get_object_headers(GET_OBJECT_SIGNATURE);
    let r = request("GET", "/test.txt", None, &h);
    let auth = parse(&r, REGION, EXAMPLE_TIME).unwrap().unwrap();
    assert!(auth.verify(&r, SECRET, &cache).is_ok());
    assert!(auth.verify(&r, SECRET, &cache).is_ok());
    assert_eq!(auth.verify(&r, b"rotated", &cache), Err(SigV4Error::SignatureDoesNotMatch));
}

mod robustness {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Any Authorization value, query and date parse to an answer (SigV4 or not, or a refusal), never a panic;
        /// and what parses never verifies under a wrong secret.
        #[test]
        fn parsing_never_panics(
            value in "(AWS4-HMAC-SHA256 )?(Credential=[A-Z0-9/a-z_]{0,40}|SignedHeaders=[a-z;-]{0,30}|Signature=[0-9a-f]{0,70}|[ ,=]{0,3}|\\PC{0,10}){0,6}",
            query in "((X-Amz-[A-Za-z]{0,15}|[a-z]{1,5})(=[A-Za-z0-9%/+;_-]{0,20})?&?){0,8}",
            date in "[0-9T Z]{0,18}",
        ) {
            let h = headers(&[("host", "h"), ("x-amz-content-sha256", EMPTY_SHA256), ("x-amz-date", &date), ("authorization", &value)]);
            let r = request("GET", "/b/k", Some(&query), &h);
            if let Ok(Some(auth)) = parse(&r, REGION, EXAMPLE_TIME) {
                prop_assert!(auth.verify(&r, b"not the secret", &SigningKeyCache::new(2)).is_err());
            }
            let none = HeaderMap::new();
            let _ = parse(&request("GET", "/b/k", Some(&query), &none), REGION, EXAMPLE_TIME);
        }

        /// The word-wise constant-time comparison answers what `==` answers, at every length and position of a
        /// difference.
        #[test]
        fn constant_time_comparison_is_equality(a in proptest::collection::vec(any::<u8>(), 0..70),
                                                flip in any::<proptest::sample::Index>(), bit in 0u8..8,
                                                cut in any::<proptest::sample::Index>()) {
            prop_assert!(crate::auth::ct_eq(&a, &a.clone()));
            if !a.is_empty() {
                let mut b = a.clone();
                b[flip.index(a.len())] ^= 1 << bit;
                prop_assert!(!crate::auth::ct_eq(&a, &b));
                prop_assert!(!crate::auth::ct_eq(&a, &a[..cut.index(a.len())]));
            }
        }

        /// Any bytes, in any framing, fed in any split: an answer, never a panic, and never more data than
        /// `x-amz-decoded-content-length`.
        #[test]
        fn decoding_never_panics(
            body in proptest::collection::vec(prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'0'), Just(b';'), Just(b':'), any::<u8>()], 0..300),
            len in 0u64..64,
            cut in any::<usize>(),
            framing in 0..3,
        ) {
            let framing = match framing {
                0 => Framing::UnsignedTrailer,
                1 => Framing::Signed(trailer_seed()),
                _ => Framing::SignedTrailer(trailer_seed()),
            };
            let trailer = (!matches!(framing, Framing::Signed(_))).then_some(checksum::ChecksumAlgorithm::Crc32);
            let mut decoder = ChunkedDecoder::new(framing, len, trailer).unwrap();
            let at = cut % (body.len() + 1);
            let mut out = 0;
            let fed = decoder.feed_all(&body[..at], |d| out += d.len()).and_then(|()| decoder.feed_all(&body[at..], |d| out += d.len()));
            if fed.is_ok() {
                let _ = decoder.finish();
            }
            prop_assert!(out as u64 <= len);
        }
    }
}
