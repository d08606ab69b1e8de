//! The S3 wire format, pure: the XML documents S3 answers with (`xml`), what requests carry (`request`: list
//! parameters and the XML bodies S3 accepts), and the listing planner that turns the store's keyset pages into one
//! S3 list page (`listing`). No IO: the routes (in `http`) read the request, drive the planner over the store and
//! send what these functions write.
//!
//! - [`xml`]: ListAllMyBucketsResult, ListBucketResult (V1 and V2), LocationConstraint, Error, the multipart
//!   and copy results, DeleteResult, Tagging.
//! - [`request`]: the parameters of ListObjects V1 and V2, ListParts and ListMultipartUploads, parsed once
//!   (`max-keys` capped, `encoding-type`, continuation tokens); the request bodies CompleteMultipartUpload,
//!   Delete and Tagging, bounded, with S3's error codes; the copy headers and tag sets.
//! - [`buckets`]: ListBuckets' paging, and PutBucketCors' document read into the bucket's one CORS rule.
//! - [`listing`]: prefix, delimiter and pagination over any source of keys in order; a page costs O(max-keys)
//!   rows, since a common prefix is skipped by seeking past it.

pub mod buckets;
pub mod listing;
pub mod operation;
pub mod request;
pub mod xml;

use percent_encoding::utf8_percent_encode;

use crate::header_values::{calendar, uri};

/// The namespace of every S3 response document.
pub const XMLNS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

/// The one storage class we have, as listings name it.
pub const STORAGE_CLASS: &str = "STANDARD";

/// Most keys one list page returns (S3's own cap and default for `max-keys`).
pub const MAX_KEYS: u32 = 1000;

/// `value` as `encoding-type=url` writes it: everything but RFC 3986 unreserved characters and `/` escaped
/// (`uri::PATH`). Clients decode with a full URL decoder (botocore: `unquote_plus`), so escaping more than S3 does
/// is safe, and `+` must be escaped (it would decode to a space).
#[must_use]
pub fn url_encode(value: &str) -> String {
    utf8_percent_encode(value, uri::PATH).to_string()
}

/// Unix seconds as S3's timestamps in XML: ISO 8601 in UTC with milliseconds (`2024-05-01T12:00:00.000Z`).
/// Times before 1970 are clamped to the epoch (we store none).
#[must_use]
pub fn iso8601_millis(unix_secs: i64) -> String {
    let secs = unix_secs.max(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = calendar::civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.000Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps_are_iso8601_with_millis() {
        assert_eq!(iso8601_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_millis(951_782_400), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601_millis(1_714_564_800), "2024-05-01T12:00:00.000Z");
        assert_eq!(iso8601_millis(253_402_300_799), "9999-12-31T23:59:59.000Z");
        assert_eq!(iso8601_millis(-5), "1970-01-01T00:00:00.000Z");
    }

    proptest! {
        /// The date agrees with httpdate's (an independent calendar) on every second it can format (to 9999).
        #[test]
        fn timestamps_agree_with_httpdate(secs in 0u64..=253_402_300_799u64) {
            let ours = iso8601_millis(secs as i64);
            let theirs = httpdate::HttpDate::from(UNIX_EPOCH + Duration::from_secs(secs));
            let back = httpdate::parse_http_date(&theirs.to_string()).unwrap();
            prop_assert_eq!(back, UNIX_EPOCH + Duration::from_secs(secs));
            // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
            let imf = theirs.to_string();
            let parts: Vec<&str> = imf.split(' ').collect();
            let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
                .iter().position(|m| *m == parts[2]).unwrap() + 1;
            let want = format!("{}-{month:02}-{}T{}.000Z", parts[3], parts[1], parts[4]);
            prop_assert_eq!(ours, want);
        }

        /// Every encoded value decodes back, and holds nothing a URL or XML would read specially.
        #[test]
        fn url_encoding_round_trips(value in "\\PC{0,40}") {
            let encoded = url_encode(&value);
            prop_assert!(encoded.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~/%".contains(&b)));
            let decoded: String = form_urlencoded::parse(format!("v={encoded}").as_bytes()).next().unwrap().1.into();
            prop_assert_eq!(decoded, value);
        }
    }

    #[test]
    fn url_encoding_escapes_what_clients_decode() {
        assert_eq!(url_encode("a b+c%d/é(1).txt"), "a%20b%2Bc%25d/%C3%A9%281%29.txt");
    }
}
