//! CORS (the Fetch standard's CORS protocol) for one bucket's rule: which origins may read, preflight answers and
//! the headers of actual responses. Pure: the store keeps a [`CorsRule`] as JSON in the bucket row, the catalog
//! caches the bucket with its [`CorsPolicy`] (header values prepared once), and `http::cors` calls it per request
//! that carries `Origin`.
//!
//! Decisions: credentials (cookies, HTTP authentication in `credentials: "include"` mode) are not supported, so
//! `Access-Control-Allow-Credentials` is never sent; blobgate uses no cookies, and a bearer token set by a script
//! is a request header that the preflight allows (`Authorization`), not a Fetch credential. A request that carries
//! `Authorization` or `Cookie` still never gets `*`: the origin is echoed, so no cache or browser pairs a `*` with
//! a credentialed answer. An origin that is not allowed gets no CORS headers at all (its preflight is a plain
//! 204), which is all a browser needs to refuse.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

/// What an operator configures for a bucket (`blobgate bucket cors set`); stored as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorsRule {
    /// Serialized origins (`https://app.example`, `http://localhost:8080`) or `*` for any.
    pub origins: Vec<String>,
    /// Seconds a browser may cache a preflight answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<u32>,
    /// Response headers exposed to scripts beyond [`DEFAULT_EXPOSED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    /// The methods a preflight allows (`--method`, uppercase); empty: [`ALLOWED_METHODS`] (GET and HEAD).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Request headers a preflight allows beyond [`ALLOWED_REQUEST_HEADERS`] (`--allow-header`, lowercase); `*`
    /// allows any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
}

/// The methods a rule may allow: reads, and the writes a page may send to a presigned URL or with a token.
pub const RULE_METHODS: [&str; 5] = ["GET", "HEAD", "PUT", "POST", "DELETE"];

/// Exposed to scripts on every CORS response: what a ranged or revalidating reader needs.
pub const DEFAULT_EXPOSED: [&str; 5] = ["Content-Range", "Content-Length", "ETag", "Accept-Ranges", "Content-Encoding"];

/// Request headers a preflight may allow: ranges, preconditions and a bearer token.
pub const ALLOWED_REQUEST_HEADERS: [&str; 7] =
    ["range", "if-match", "if-none-match", "if-modified-since", "if-unmodified-since", "if-range", "authorization"];

/// Browsers cap a preflight cache far lower (Chromium: 2 h); a day is the most worth storing.
pub const MAX_MAX_AGE: u32 = 86_400;

/// The methods a rule allows (its preflight's `Access-Control-Allow-Methods`, GetBucketCors' `AllowedMethod`).
pub const ALLOWED_METHODS: [&str; 2] = ["GET", "HEAD"];
const ANY_ORIGIN: HeaderValue = HeaderValue::from_static("*");
const VARY_PREFLIGHT: HeaderValue =
    HeaderValue::from_static("Origin, Access-Control-Request-Method, Access-Control-Request-Headers");

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CorsRuleError {
    #[error("a CORS rule needs at least one --origin")]
    NoOrigin,
    #[error("invalid origin {0:?}: expected '*' or scheme://host[:port] (http or https, no path, lowercase)")]
    BadOrigin(String),
    #[error("invalid header name {0:?} for --expose-header")]
    BadHeaderName(String),
    #[error("--max-age {0} is above {MAX_MAX_AGE} seconds")]
    MaxAgeTooLarge(u32),
    #[error("invalid --method {0:?}: a rule allows GET, HEAD, PUT, POST or DELETE")]
    BadMethod(String),
    #[error("invalid header name {0:?} for --allow-header (lowercase, or '*')")]
    BadAllowHeader(String),
}

impl CorsRule {
    /// Checks every field, so that a stored rule always compiles into a policy.
    pub fn validate(&self) -> Result<(), CorsRuleError> {
        if self.origins.is_empty() {
            return Err(CorsRuleError::NoOrigin);
        }
        if let Some(bad) = self.origins.iter().find(|o| !is_valid_origin(o)) {
            return Err(CorsRuleError::BadOrigin(bad.clone()));
        }
        if let Some(bad) = self.expose_headers.iter().find(|h| HeaderName::from_bytes(h.as_bytes()).is_err()) {
            return Err(CorsRuleError::BadHeaderName(bad.clone()));
        }
        if let Some(bad) = self.methods.iter().find(|m| !RULE_METHODS.contains(&m.as_str())) {
            return Err(CorsRuleError::BadMethod(bad.clone()));
        }
        // Stored lowercase, as the requested list is compared lowercased.
        let header_ok = |h: &String| {
            h == "*" || (HeaderName::from_bytes(h.as_bytes()).is_ok() && !h.bytes().any(|b| b.is_ascii_uppercase()))
        };
        if let Some(bad) = self.allow_headers.iter().find(|h| !header_ok(h)) {
            return Err(CorsRuleError::BadAllowHeader(bad.clone()));
        }
        match self.max_age {
            Some(secs) if secs > MAX_MAX_AGE => Err(CorsRuleError::MaxAgeTooLarge(secs)),
            _ => Ok(()),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a CORS rule always serializes")
    }
}

/// `*`, or an origin as browsers serialize it: `http(s)://host[:port]`, lowercase, without a path or a slash.
fn is_valid_origin(origin: &str) -> bool {
    if origin == "*" {
        return true;
    }
    let Some(rest) = origin.strip_prefix("https://").or_else(|| origin.strip_prefix("http://")) else {
        return false;
    };
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, Some(p)),
        _ => (rest, None),
    };
    let host_ok =
        !host.is_empty() && host.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.[]:".contains(&b));
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

/// A rule with its header values prepared, as the catalog caches it with its bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsPolicy {
    pub rule: CorsRule,
    any_origin: bool,
    expose: HeaderValue,
    max_age: Option<HeaderValue>,
    /// `Access-Control-Allow-Methods`: the rule's methods (GET, HEAD by default).
    allow_methods: HeaderValue,
}

impl CorsPolicy {
    pub fn new(rule: CorsRule) -> Result<Self, CorsRuleError> {
        rule.validate()?;
        let mut exposed: Vec<&str> = DEFAULT_EXPOSED.to_vec();
        for h in &rule.expose_headers {
            if !exposed.iter().any(|e| e.eq_ignore_ascii_case(h)) {
                exposed.push(h);
            }
        }
        let expose = HeaderValue::from_str(&exposed.join(", "))
            .map_err(|_| CorsRuleError::BadHeaderName(rule.expose_headers.join(", ")))?;
        let allow_methods = HeaderValue::from_str(&Self::methods_of(&rule).join(", "))
            .map_err(|_| CorsRuleError::BadMethod(rule.methods.join(", ")))?;
        Ok(CorsPolicy {
            any_origin: rule.origins.iter().any(|o| o == "*"),
            max_age: rule.max_age.map(HeaderValue::from),
            expose,
            allow_methods,
            rule,
        })
    }

    /// The methods the rule allows: its own, or GET and HEAD.
    fn methods_of(rule: &CorsRule) -> Vec<&str> {
        if rule.methods.is_empty() {
            ALLOWED_METHODS.to_vec()
        } else {
            rule.methods.iter().map(String::as_str).collect()
        }
    }

    /// The methods the rule allows (GetBucketCors' `AllowedMethod`).
    pub fn methods(&self) -> Vec<&str> {
        Self::methods_of(&self.rule)
    }

    /// The request headers the rule allows (GetBucketCors' `AllowedHeader`): the built-in ones, then its own.
    pub fn allowed_headers(&self) -> Vec<&str> {
        let mut headers = ALLOWED_REQUEST_HEADERS.to_vec();
        headers.extend(self.rule.allow_headers.iter().map(String::as_str));
        headers
    }

    /// A rule as stored in the bucket row; `None` if it does not parse or validate (written by hand with sqlite3).
    pub fn from_json(json: &str) -> Option<Self> {
        serde_json::from_str(json).ok().and_then(|rule| Self::new(rule).ok())
    }

    /// Whether `origin` (the request's `Origin` value) may read. Exact match: browsers send origins serialized.
    pub fn allows(&self, origin: &HeaderValue) -> bool {
        self.any_origin || self.rule.origins.iter().any(|o| o.as_bytes() == origin.as_bytes())
    }

    /// Adds the CORS headers of an actual (non-preflight) response to `headers`, whatever its status. `credentialed`:
    /// the request carries `Authorization` or `Cookie`, so `*` is never the answer.
    pub fn add_actual_headers(&self, origin: &HeaderValue, credentialed: bool, headers: &mut HeaderMap) {
        // The answer depends on Origin whenever there is a rule, allowed or not (the handler may have said so).
        super::add_vary(headers, "Origin");
        if !self.allows(origin) {
            return;
        }
        let allow = if self.any_origin && !credentialed { ANY_ORIGIN } else { origin.clone() };
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, self.expose.clone());
    }

    /// Evaluates a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) and adds its headers.
    /// Returns whether it was allowed: the origin, the method and every requested header; when not, only `Vary`
    /// is added.
    pub fn add_preflight_headers(
        &self,
        origin: &HeaderValue,
        request_method: Option<&HeaderValue>,
        request_headers: Option<&HeaderValue>,
        headers: &mut HeaderMap,
    ) -> bool {
        headers.insert(header::VARY, VARY_PREFLIGHT);
        let method_ok =
            request_method.is_some_and(|m| self.methods().iter().any(|allowed| allowed.as_bytes() == m.as_bytes()));
        if !method_ok || !self.allows(origin) {
            return false;
        }
        let allowed_headers = match request_headers {
            None => None,
            Some(requested) => match self.request_headers(requested) {
                Some(allowed) => allowed,
                None => return false,
            },
        };
        // Preflights carry no credentials, and blobgate supports none (module doc), so `*` is a valid answer.
        let allow = if self.any_origin { ANY_ORIGIN } else { origin.clone() };
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, self.allow_methods.clone());
        if let Some(allowed) = allowed_headers {
            headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allowed);
        }
        if let Some(max_age) = &self.max_age {
            headers.insert(header::ACCESS_CONTROL_MAX_AGE, max_age.clone());
        }
        true
    }
}

impl CorsPolicy {
    /// The requested headers (a comma-separated list), lowercased in the order asked, when the rule allows every
    /// one of them (the built-in [`ALLOWED_REQUEST_HEADERS`], the rule's own, or any with `*`): `Some(None)` for an
    /// empty list; `None` when one is not allowed, which refuses the preflight.
    fn request_headers(&self, requested: &HeaderValue) -> Option<Option<HeaderValue>> {
        let requested = requested.to_str().ok()?;
        let any = self.rule.allow_headers.iter().any(|h| h == "*");
        let mut allowed = Vec::new();
        for name in requested.split(',').map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()) {
            let known = ALLOWED_REQUEST_HEADERS.contains(&name.as_str()) || self.rule.allow_headers.contains(&name);
            if !(known || any) {
                return None;
            }
            allowed.push(name);
        }
        if allowed.is_empty() {
            return Some(None);
        }
        HeaderValue::from_str(&allowed.join(", ")).ok().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(origins: &[&str]) -> CorsPolicy {
        let rule = CorsRule {
            origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            max_age: Some(600),
            expose_headers: vec!["X-Custom".into()],
            methods: vec![],
            allow_headers: vec![],
        };
        CorsPolicy::new(rule).unwrap()
    }

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn origins_are_validated() {
        for ok in ["*", "https://app.example", "http://localhost:8080", "http://127.0.0.1:9", "http://[::1]:80"] {
            assert!(is_valid_origin(ok), "{ok}");
        }
        for bad in ["", "app.example", "https://", "https://app.example/", "https://App.example", "ftp://x", "null"] {
            assert!(!is_valid_origin(bad), "{bad}");
        }
        for bad in ["https://a.example:", "https://a.example:123456", "https://a b", "*.example"] {
            assert!(!is_valid_origin(bad), "{bad}");
        }
    }

    #[test]
    fn rules_are_validated() {
        let any = CorsRule {
            origins: vec!["*".into()],
            max_age: None,
            expose_headers: vec![],
            methods: vec![],
            allow_headers: vec![],
        };
        assert_eq!(CorsRule { origins: vec![], ..any.clone() }.validate(), Err(CorsRuleError::NoOrigin));
        let bad_header = CorsRule { expose_headers: vec!["a b".into()], ..any.clone() };
        assert_eq!(bad_header.validate(), Err(CorsRuleError::BadHeaderName("a b".into())));
        let long = CorsRule { max_age: Some(MAX_MAX_AGE + 1), ..any.clone() };
        assert_eq!(long.validate(), Err(CorsRuleError::MaxAgeTooLarge(MAX_MAX_AGE + 1)));
        for bad in ["get", "PATCH", "OPTIONS", ""] {
            let rule = CorsRule { methods: vec![bad.into()], ..any.clone() };
            assert_eq!(rule.validate(), Err(CorsRuleError::BadMethod(bad.into())));
        }
        for bad in ["Content-Type", "a b", ""] {
            let rule = CorsRule { allow_headers: vec![bad.into()], ..any.clone() };
            assert_eq!(rule.validate(), Err(CorsRuleError::BadAllowHeader(bad.into())));
        }
        let writes =
            CorsRule { methods: vec!["PUT".into()], allow_headers: vec!["content-type".into(), "*".into()], ..any };
        assert_eq!(writes.validate(), Ok(()));
    }

    #[test]
    fn json_round_trips_and_bad_json_is_no_rule() {
        let p = policy(&["https://a.example"]);
        assert_eq!(CorsPolicy::from_json(&p.rule.to_json()), Some(p));
        assert_eq!(CorsPolicy::from_json("{"), None);
        assert_eq!(CorsPolicy::from_json(r#"{"origins":[]}"#), None);
    }

    #[test]
    fn an_allowed_origin_gets_the_actual_headers() {
        let p = policy(&["https://a.example"]);
        let mut h = HeaderMap::new();
        p.add_actual_headers(&hv("https://a.example"), false, &mut h);
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://a.example");
        assert_eq!(
            h[header::ACCESS_CONTROL_EXPOSE_HEADERS],
            "Content-Range, Content-Length, ETag, Accept-Ranges, Content-Encoding, X-Custom"
        );
        assert_eq!(h[header::VARY], "Origin");
        assert!(!h.contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS));
    }

    #[test]
    fn vary_origin_is_not_repeated_and_joins_the_one_vary_line() {
        let p = policy(&["https://a.example"]);
        let mut h = HeaderMap::new();
        h.append(header::VARY, hv("Origin"));
        p.add_actual_headers(&hv("https://a.example"), false, &mut h);
        assert_eq!(h.get_all(header::VARY).iter().count(), 1);
        let mut h = HeaderMap::new();
        h.append(header::VARY, hv("Accept-Encoding"));
        p.add_actual_headers(&hv("https://a.example"), false, &mut h);
        assert_eq!(h.get_all(header::VARY).iter().collect::<Vec<_>>(), ["Accept-Encoding, Origin"]);
    }

    #[test]
    fn another_origin_gets_only_vary() {
        let p = policy(&["https://a.example"]);
        let mut h = HeaderMap::new();
        p.add_actual_headers(&hv("https://b.example"), false, &mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h[header::VARY], "Origin");
    }

    #[test]
    fn any_origin_is_star_without_credentials_and_echoed_with_them() {
        let p = policy(&["*"]);
        let mut h = HeaderMap::new();
        p.add_actual_headers(&hv("https://b.example"), false, &mut h);
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        let mut h = HeaderMap::new();
        p.add_actual_headers(&hv("https://b.example"), true, &mut h);
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://b.example");
        assert!(!h.contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS));
    }

    #[test]
    fn a_preflight_allows_get_and_head_and_the_known_headers() {
        let p = policy(&["https://a.example"]);
        let mut h = HeaderMap::new();
        let asked = hv("Range, if-none-match, authorization");
        assert!(p.add_preflight_headers(&hv("https://a.example"), Some(&hv("GET")), Some(&asked), &mut h));
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://a.example");
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_METHODS], "GET, HEAD");
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_HEADERS], "range, if-none-match, authorization");
        assert_eq!(h[header::ACCESS_CONTROL_MAX_AGE], "600");
        assert_eq!(h[header::VARY], "Origin, Access-Control-Request-Method, Access-Control-Request-Headers");
    }

    #[test]
    fn a_preflight_for_another_method_or_origin_is_refused() {
        let p = policy(&["https://a.example"]);
        for (origin, method) in [("https://a.example", Some("PUT")), ("https://b.example", Some("GET"))] {
            let mut h = HeaderMap::new();
            let method = method.map(hv);
            assert!(!p.add_preflight_headers(&hv(origin), method.as_ref(), None, &mut h));
            assert_eq!(h.len(), 1, "only Vary: {h:?}");
        }
        let mut h = HeaderMap::new();
        assert!(!p.add_preflight_headers(&hv("https://a.example"), None, None, &mut h));
        // A header the rule does not allow refuses the whole preflight.
        let mut h = HeaderMap::new();
        let asked = hv("range, x-unknown");
        assert!(!p.add_preflight_headers(&hv("https://a.example"), Some(&hv("GET")), Some(&asked), &mut h));
        assert_eq!(h.len(), 1, "only Vary: {h:?}");
    }

    #[test]
    fn a_rule_with_write_methods_and_its_own_headers_allows_a_presigned_put() {
        let rule = CorsRule {
            methods: vec!["GET".into(), "PUT".into()],
            allow_headers: vec!["content-type".into(), "x-amz-meta-owner".into()],
            ..policy(&["https://a.example"]).rule
        };
        let p = CorsPolicy::new(rule).unwrap();
        let mut h = HeaderMap::new();
        let asked = hv("Content-Type, x-amz-meta-owner");
        assert!(p.add_preflight_headers(&hv("https://a.example"), Some(&hv("PUT")), Some(&asked), &mut h));
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_METHODS], "GET, PUT");
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_HEADERS], "content-type, x-amz-meta-owner");
        let mut h = HeaderMap::new();
        assert!(!p.add_preflight_headers(&hv("https://a.example"), Some(&hv("HEAD")), None, &mut h), "not listed");
        let mut h = HeaderMap::new();
        assert!(!p.add_preflight_headers(&hv("https://a.example"), Some(&hv("DELETE")), None, &mut h));
        // `*` allows any request header.
        let any = CorsPolicy::new(CorsRule { allow_headers: vec!["*".into()], ..p.rule.clone() }).unwrap();
        let mut h = HeaderMap::new();
        assert!(any.add_preflight_headers(&hv("https://a.example"), Some(&hv("PUT")), Some(&hv("X-Whatever")), &mut h));
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_HEADERS], "x-whatever");
        assert_eq!(any.methods(), ["GET", "PUT"]);
        assert_eq!(p.allowed_headers().last(), Some(&"x-amz-meta-owner"));
    }

    proptest! {
        #[test]
        fn only_listed_origins_are_allowed(host in "[a-z]{1,12}", other in "[a-z]{1,12}") {
            let listed = format!("https://{host}.example");
            let p = policy(&[listed.as_str()]);
            prop_assert!(p.allows(&hv(&listed)));
            prop_assert_eq!(p.allows(&hv(&format!("https://{other}.example"))), host == other);
            let plain_http = format!("http://{host}.example");
            prop_assert!(!p.allows(&hv(&plain_http)));
        }

        #[test]
        fn star_is_never_sent_with_credentials(origin in "https://[a-z]{1,12}\\.example", credentialed: bool) {
            let p = policy(&["*", "https://a.example"]);
            let mut h = HeaderMap::new();
            p.add_actual_headers(&hv(&origin), credentialed, &mut h);
            let allow = h[header::ACCESS_CONTROL_ALLOW_ORIGIN].to_str().unwrap();
            prop_assert_eq!(allow == "*", !credentialed);
        }

        #[test]
        fn a_preflight_is_allowed_exactly_when_every_requested_header_is(asked in proptest::collection::vec(
            proptest::sample::select(vec!["Range", "If-Match", "X-A", "authorization", "If-Range", "Cookie"]), 0..6)) {
            let p = policy(&["*"]);
            let mut h = HeaderMap::new();
            let list = asked.join(", ");
            let allowed_all = asked.iter().all(|a| ALLOWED_REQUEST_HEADERS.contains(&a.to_ascii_lowercase().as_str()));
            let answered = p.add_preflight_headers(&hv("https://a.example"), Some(&hv("GET")), Some(&hv(&list)), &mut h);
            prop_assert_eq!(answered, allowed_all);
            let allowed = h.get(header::ACCESS_CONTROL_ALLOW_HEADERS).map(|v| v.to_str().unwrap().to_owned());
            for name in allowed.iter().flat_map(|a| a.split(", ")) {
                prop_assert!(ALLOWED_REQUEST_HEADERS.contains(&name));
                prop_assert!(asked.iter().any(|a| a.eq_ignore_ascii_case(name)));
            }
        }
    }
}
