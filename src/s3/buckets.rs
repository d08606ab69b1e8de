//! Bucket-level requests beyond the listings, pure: ListBuckets' paging (`max-buckets`, `prefix`,
//! `continuation-token`) and PutBucketCors' `CORSConfiguration`, read into the one [`CorsRule`] a bucket holds
//! (what `blobgate bucket cors set` sets). What that rule cannot hold is refused naming the element, never
//! dropped.

use serde::Deserialize;

use super::request::{RequestError, continuation_token, decode_continuation_token};
use crate::header_values::cors::{ALLOWED_REQUEST_HEADERS, CorsRule, DEFAULT_EXPOSED};

/// S3's cap and default for `max-buckets` (ListBuckets answers at most this many per page).
pub const MAX_BUCKETS: usize = 10_000;

/// ListBuckets' query: which names, after which one, how many.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListBucketsParams {
    /// Only names starting with it (echoed as `Prefix` when given).
    pub prefix: Option<String>,
    /// The last name of the previous page, from its `ContinuationToken`.
    pub after: Option<String>,
    /// 1 to [`MAX_BUCKETS`].
    pub max_buckets: usize,
}

impl ListBucketsParams {
    /// Parses a ListBuckets query string (without the `?`); other parameters are ignored here.
    pub fn from_query(query: &str) -> Result<Self, RequestError> {
        let mut params = ListBucketsParams { max_buckets: MAX_BUCKETS, ..Self::default() };
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "prefix" => params.prefix = Some(value.into_owned()).filter(|p| !p.is_empty()),
                "continuation-token" if !value.is_empty() => params.after = Some(decode_continuation_token(&value)?),
                "max-buckets" => {
                    params.max_buckets = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_BUCKETS).contains(n))
                        .ok_or(RequestError::InvalidArgument(format!("max-buckets must be 1 to {MAX_BUCKETS}")))?;
                }
                _ => {}
            }
        }
        Ok(params)
    }

    /// The page of `names` (sorted, unique) these parameters ask for, and the next page's `ContinuationToken`
    /// (the page's last name) when more follow.
    pub fn page<'a, T>(&self, names: &'a [T], name: impl Fn(&T) -> &str) -> (&'a [T], Option<String>) {
        let prefix = self.prefix.as_deref().unwrap_or("");
        let mut start = names.partition_point(|n| name(n) < prefix);
        if let Some(after) = &self.after {
            start = start.max(names.partition_point(|n| name(n) <= after.as_str()));
        }
        let matching = names[start..].iter().take_while(|n| name(n).starts_with(prefix)).count();
        let taken = matching.min(self.max_buckets);
        let page = &names[start..start + taken];
        let next = (matching > taken).then(|| continuation_token(name(&page[taken - 1])));
        (page, next)
    }
}

/// Largest PutBucketCors body read: one rule's few origins and headers fit many times over.
pub const MAX_CORS_BODY: usize = 64 * 1024;

/// Why a `CORSConfiguration` cannot be stored, with S3's code for it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CorsConfigError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Valid S3, but not representable by the bucket's one rule: 501 naming the element.
    #[error("{0}")]
    NotImplemented(String),
    /// A value the rule refuses (an origin with a wildcard inside it, a method we do not allow): 400.
    #[error("{0}")]
    Invalid(String),
}

impl CorsConfigError {
    pub fn code(&self) -> &'static str {
        match self {
            CorsConfigError::Request(e) => e.code(),
            CorsConfigError::NotImplemented(_) => "NotImplemented",
            CorsConfigError::Invalid(_) => "InvalidRequest",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CorsConfigurationXml {
    #[serde(rename = "@xmlns", default)]
    _xmlns: Option<String>,
    #[serde(rename = "CORSRule", default)]
    rules: Vec<CorsRuleXml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CorsRuleXml {
    #[serde(rename = "ID", default)]
    id: Option<String>,
    #[serde(rename = "AllowedOrigin", default)]
    origins: Vec<String>,
    #[serde(rename = "AllowedMethod", default)]
    methods: Vec<String>,
    #[serde(rename = "AllowedHeader", default)]
    allowed_headers: Vec<String>,
    #[serde(rename = "ExposeHeader", default)]
    expose_headers: Vec<String>,
    #[serde(rename = "MaxAgeSeconds", default)]
    max_age: Option<String>,
}

/// A PutBucketCors body as the bucket's rule. One `CORSRule` without `ID` (the bucket holds one rule, unnamed);
/// origins `*` or exact; the headers and methods GetBucketCors shows by default may be listed again (as a client
/// that puts back what it read does) and are not stored twice.
pub fn parse_cors_configuration(body: &[u8]) -> Result<CorsRule, CorsConfigError> {
    if body.len() > MAX_CORS_BODY {
        return Err(RequestError::TooLarge { limit: MAX_CORS_BODY }.into());
    }
    let text = std::str::from_utf8(body).map_err(|_| RequestError::MalformedXml("the body is not UTF-8".into()))?;
    let config: CorsConfigurationXml =
        quick_xml::de::from_str(text).map_err(|e| RequestError::MalformedXml(e.to_string()))?;
    let config_was_empty = config.rules.is_empty();
    let mut rules = config.rules.into_iter();
    let (Some(rule), None) = (rules.next(), rules.next()) else {
        if config_was_empty {
            return Err(RequestError::MalformedXml("CORSConfiguration needs a CORSRule".into()).into());
        }
        return Err(CorsConfigError::NotImplemented(
            "CORSRule: a bucket holds exactly one CORS rule (blobgate bucket cors set)".into(),
        ));
    };
    if rule.id.is_some() {
        return Err(CorsConfigError::NotImplemented("ID: a bucket's one CORS rule has no ID".into()));
    }
    if rule.origins.is_empty() {
        return Err(RequestError::MalformedXml("CORSRule needs an AllowedOrigin".into()).into());
    }
    if rule.methods.is_empty() {
        return Err(RequestError::MalformedXml("CORSRule needs an AllowedMethod".into()).into());
    }
    let max_age = match rule.max_age {
        None => None,
        Some(text) => Some(
            text.trim()
                .parse::<u32>()
                .map_err(|_| CorsConfigError::Invalid(format!("MaxAgeSeconds {text:?} is not a number of seconds")))?,
        ),
    };
    let mut allow_headers: Vec<String> = Vec::new();
    for header in rule.allowed_headers.iter().map(|h| h.trim().to_ascii_lowercase()) {
        if !ALLOWED_REQUEST_HEADERS.contains(&header.as_str()) && !allow_headers.contains(&header) {
            allow_headers.push(header);
        }
    }
    let mut expose_headers: Vec<String> = Vec::new();
    for header in rule.expose_headers.iter().map(|h| h.trim()) {
        let listed = |e: &String| e.eq_ignore_ascii_case(header);
        if !DEFAULT_EXPOSED.iter().any(|d| d.eq_ignore_ascii_case(header)) && !expose_headers.iter().any(listed) {
            expose_headers.push(header.to_owned());
        }
    }
    let mut methods: Vec<String> = Vec::new();
    for method in rule.methods.iter().map(|m| m.trim().to_owned()) {
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    let origins = rule.origins.iter().map(|o| o.trim().to_owned()).collect();
    let cors = CorsRule { origins, max_age, expose_headers, methods, allow_headers };
    cors.validate().map_err(|e| CorsConfigError::Invalid(s3_words(&e)))?;
    Ok(cors)
}

/// A rule's refusal in the words of the XML element it came from (the CLI's flags otherwise).
fn s3_words(e: &crate::header_values::cors::CorsRuleError) -> String {
    use crate::header_values::cors::CorsRuleError as E;
    match e {
        E::NoOrigin => "CORSRule needs an AllowedOrigin".into(),
        E::BadOrigin(o) => format!(
            "AllowedOrigin {o:?} is not supported: '*' or one exact origin (scheme://host[:port], lowercase), \
             no wildcard inside"
        ),
        E::BadHeaderName(h) => format!("ExposeHeader {h:?} is not a header name"),
        E::MaxAgeTooLarge(s) => format!("MaxAgeSeconds {s} is above {}", crate::header_values::cors::MAX_MAX_AGE),
        E::BadMethod(m) => format!("AllowedMethod {m:?} is not one of GET, HEAD, PUT, POST, DELETE"),
        E::BadAllowHeader(h) => format!("AllowedHeader {h:?} is not supported: a header name, or '*' alone"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn bucket_pages_follow_their_tokens_to_the_end() {
        let all = names(&["a1", "a2", "b1", "b2", "b3", "c"]);
        let mut params = ListBucketsParams::from_query("max-buckets=2&prefix=b").unwrap();
        assert_eq!(params.prefix.as_deref(), Some("b"));
        let mut seen = Vec::new();
        loop {
            let (page, next) = params.page(&all, String::as_str);
            seen.extend(page.iter().cloned());
            let Some(token) = next else { break };
            params =
                ListBucketsParams::from_query(&format!("max-buckets=2&prefix=b&continuation-token={token}")).unwrap();
        }
        assert_eq!(seen, names(&["b1", "b2", "b3"]));
        let every = ListBucketsParams::from_query("").unwrap();
        assert_eq!(every.page(&all, String::as_str), (&all[..], None), "one page when nothing limits it");
        let exact = ListBucketsParams::from_query("max-buckets=6").unwrap();
        assert_eq!(exact.page(&all, String::as_str).1, None, "no token when nothing follows");
        for bad in ["max-buckets=0", "max-buckets=10001", "max-buckets=x", "continuation-token=%%%"] {
            assert!(ListBucketsParams::from_query(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cors_configuration_reads_into_the_one_rule() {
        let body = br#"<CORSConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><CORSRule>
            <AllowedOrigin>https://app.example</AllowedOrigin><AllowedMethod>GET</AllowedMethod>
            <AllowedMethod>PUT</AllowedMethod><AllowedHeader>X-Custom</AllowedHeader><AllowedHeader>Range</AllowedHeader>
            <ExposeHeader>ETag</ExposeHeader><ExposeHeader>x-amz-meta-a</ExposeHeader>
            <MaxAgeSeconds>600</MaxAgeSeconds></CORSRule></CORSConfiguration>"#;
        let rule = parse_cors_configuration(body).unwrap();
        assert_eq!(rule.origins, ["https://app.example"]);
        assert_eq!(rule.methods, ["GET", "PUT"]);
        assert_eq!(rule.allow_headers, ["x-custom"], "range is allowed by default");
        assert_eq!(rule.expose_headers, ["x-amz-meta-a"], "ETag is exposed by default");
        assert_eq!(rule.max_age, Some(600));
    }

    #[test]
    fn what_the_rule_cannot_hold_is_refused_naming_the_element() {
        let rule = |inner: &str| format!("<CORSConfiguration><CORSRule>{inner}</CORSRule></CORSConfiguration>");
        let ok = "<AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>";
        let cases = [
            (
                format!("<CORSConfiguration><CORSRule>{ok}</CORSRule><CORSRule>{ok}</CORSRule></CORSConfiguration>"),
                "NotImplemented",
                "CORSRule",
            ),
            (rule(&format!("<ID>r1</ID>{ok}")), "NotImplemented", "ID"),
            (
                rule("<AllowedOrigin>https://*.example</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"),
                "InvalidRequest",
                "AllowedOrigin",
            ),
            (
                rule("<AllowedOrigin>*</AllowedOrigin><AllowedMethod>PATCH</AllowedMethod>"),
                "InvalidRequest",
                "AllowedMethod",
            ),
            (rule(&format!("{ok}<MaxAgeSeconds>999999</MaxAgeSeconds>")), "InvalidRequest", "MaxAgeSeconds"),
            (rule(&format!("{ok}<Unknown>1</Unknown>")), "MalformedXML", "Unknown"),
            (rule("<AllowedMethod>GET</AllowedMethod>"), "MalformedXML", "AllowedOrigin"),
            ("<CORSConfiguration></CORSConfiguration>".into(), "MalformedXML", "CORSRule"),
        ];
        for (body, code, element) in cases {
            let e = parse_cors_configuration(body.as_bytes()).unwrap_err();
            assert_eq!(e.code(), code, "{body}: {e}");
            assert!(e.to_string().contains(element), "{body}: {e}");
        }
    }
}
