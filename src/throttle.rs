//! Limits on principals, as values: whom a limit is on ([`Subject`]), what it allows ([`LimitSet`]), the CLI's
//! text for them (`100/s`, `50MiB/s`, `8MiB`), the group an anonymous client's address falls in, and the IETF
//! `RateLimit-Policy` / `RateLimit` fields. Pure: no IO. The counters a replica keeps per principal are in
//! `throttle::state`.

pub mod state;

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// Why a limit's text was refused: one line, for the CLI and the error document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LimitError(String);

fn refuse<T>(message: impl Into<String>) -> Result<T, LimitError> {
    Err(LimitError(message.into()))
}

/// Whom a limit is on. A request is covered by its principal's limit (its token's, its S3 key's, or for anonymous
/// clients the anonymous limit applied to each address group), else by the default applied to that principal alone,
/// and by its bucket's limit, shared by everyone reading or writing that bucket.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subject {
    Default,
    Anonymous,
    Token(String),
    S3Key(String),
    Bucket(String),
}

impl Subject {
    /// `default`, `anonymous`, `token:ID`, `s3-key:ACCESS_KEY_ID`, `bucket:NAME`.
    pub fn parse(text: &str) -> Result<Subject, LimitError> {
        let named = |kind: &str, name: &str| -> Result<String, LimitError> {
            if name.is_empty() || name.len() > 256 || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return refuse(format!("{kind}: expected a name after `{kind}:`, got {name:?}"));
            }
            Ok(name.to_owned())
        };
        match text.split_once(':') {
            None if text == "default" => Ok(Subject::Default),
            None if text == "anonymous" => Ok(Subject::Anonymous),
            Some(("token", id)) => Ok(Subject::Token(named("token", id)?)),
            Some(("s3-key", id)) => Ok(Subject::S3Key(named("s3-key", id)?)),
            Some(("bucket", name)) => Ok(Subject::Bucket(named("bucket", name)?)),
            _ => refuse(format!(
                "unknown principal {text:?}: expected default, anonymous, token:ID, s3-key:ACCESS_KEY_ID or bucket:NAME"
            )),
        }
    }

    /// The kind, as stored and as a metric label.
    pub fn scope(&self) -> &'static str {
        match self {
            Subject::Default => "default",
            Subject::Anonymous => "anonymous",
            Subject::Token(_) => "token",
            Subject::S3Key(_) => "s3-key",
            Subject::Bucket(_) => "bucket",
        }
    }

    /// The name within its scope; empty for `default` and `anonymous`.
    pub fn name(&self) -> &str {
        match self {
            Subject::Default | Subject::Anonymous => "",
            Subject::Token(n) | Subject::S3Key(n) | Subject::Bucket(n) => n,
        }
    }

    /// From its stored scope and name.
    pub fn from_parts(scope: &str, name: &str) -> Option<Subject> {
        Some(match scope {
            "default" => Subject::Default,
            "anonymous" => Subject::Anonymous,
            "token" => Subject::Token(name.to_owned()),
            "s3-key" => Subject::S3Key(name.to_owned()),
            "bucket" => Subject::Bucket(name.to_owned()),
            _ => return None,
        })
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Default | Subject::Anonymous => f.write_str(self.scope()),
            _ => write!(f, "{}:{}", self.scope(), self.name()),
        }
    }
}

/// A request rate: `count` requests per `period_secs`, kept as given (`6000/min` stays that, not 100/s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRate {
    pub count: u32,
    pub period_secs: u32,
}

impl RequestRate {
    /// `100/s`, `6000/min`, `10/h` (also `/sec`, `/second`, `/m`, `/minute`, `/hour`).
    pub fn parse(text: &str) -> Result<RequestRate, LimitError> {
        let bad = || LimitError(format!("request rate {text:?}: expected COUNT/s, COUNT/min or COUNT/h, e.g. 100/s"));
        let (count, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let period_secs = match unit.trim() {
            "s" | "sec" | "second" => 1,
            "m" | "min" | "minute" => 60,
            "h" | "hour" => 3600,
            _ => return Err(bad()),
        };
        if count == 0 {
            return refuse(format!("request rate {text:?}: must allow at least one request"));
        }
        Ok(RequestRate { count, period_secs })
    }

    /// The time between two requests at this rate, the bucket's refill interval.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(u64::from(self.period_secs)) / self.count
    }
}

impl fmt::Display for RequestRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period_secs {
            1 => "s",
            60 => "min",
            3600 => "h",
            other => return write!(f, "{}/{other}s", self.count),
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// A size: `8MiB`, `500KB`, `1048576` (bytes).
pub fn parse_size(text: &str, what: &str) -> Result<u64, LimitError> {
    let size: bytesize::ByteSize =
        text.trim().parse().map_err(|_| LimitError(format!("{what} {text:?}: expected a size, e.g. 8MiB")))?;
    if size.as_u64() == 0 {
        return refuse(format!("{what} {text:?}: must be more than 0"));
    }
    Ok(size.as_u64())
}

/// A byte rate: `50MiB/s`, `10MB/s`.
pub fn parse_byte_rate(text: &str, what: &str) -> Result<u64, LimitError> {
    let Some(size) = text.trim().strip_suffix("/s") else {
        return refuse(format!("{what} {text:?}: expected SIZE/s, e.g. 50MiB/s"));
    };
    parse_size(size, what)
}

/// A size as the CLI shows it: whole binary units where exact (`8MiB`), else bytes.
pub fn show_size(bytes: u64) -> String {
    for (unit, factor) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= factor && bytes % factor == 0 {
            return format!("{}{unit}", bytes / factor);
        }
    }
    format!("{bytes}B")
}

/// What a limit allows; a field not set does not limit. Each rate has a burst: by default a rate's one period's
/// worth (requests) or a tenth of a second's (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitSet {
    pub requests: Option<RequestRate>,
    pub request_burst: Option<u32>,
    /// Object bytes sent, per second.
    pub read_bytes: Option<u64>,
    pub read_burst: Option<u64>,
    /// Body bytes received, per second.
    pub write_bytes: Option<u64>,
    pub write_burst: Option<u64>,
    /// Requests in progress at once (a download until its last byte is sent).
    pub concurrent: Option<u32>,
    /// Anonymous clients only: how many leading bits of an address make one client (default 32 and 64).
    pub ipv4_prefix: Option<u8>,
    pub ipv6_prefix: Option<u8>,
    /// The principal's share of a saturated worker's sends against others' (default 1).
    pub weight: Option<u32>,
}

/// The largest weight: a thousand to one is already more than anyone can notice beside the others.
pub const MAX_WEIGHT: u32 = 1000;

/// The smallest burst of bytes a rate is given, so that a low rate still sends whole chunks.
pub const MIN_BYTE_BURST: u64 = 64 * 1024;

impl LimitSet {
    /// Whether it limits nothing (then `limits set` refuses it: `limits clear` removes a limit).
    pub fn is_empty(&self) -> bool {
        *self == LimitSet::default()
    }

    /// `self` with every field `other` sets replaced: `limits set` on a subject that has a limit changes only what
    /// it names.
    pub fn updated(self, other: &LimitSet) -> LimitSet {
        LimitSet {
            requests: other.requests.or(self.requests),
            request_burst: other.request_burst.or(self.request_burst),
            read_bytes: other.read_bytes.or(self.read_bytes),
            read_burst: other.read_burst.or(self.read_burst),
            write_bytes: other.write_bytes.or(self.write_bytes),
            write_burst: other.write_burst.or(self.write_burst),
            concurrent: other.concurrent.or(self.concurrent),
            ipv4_prefix: other.ipv4_prefix.or(self.ipv4_prefix),
            ipv6_prefix: other.ipv6_prefix.or(self.ipv6_prefix),
            weight: other.weight.or(self.weight),
        }
    }

    /// Refuses what cannot be meant: a burst without its rate, address prefixes on anything but `anonymous`, a
    /// prefix longer than the address, zero counts.
    pub fn check(&self, subject: &Subject) -> Result<(), LimitError> {
        if self.is_empty() {
            return refuse("nothing to limit: give --requests, --read, --write, --concurrent or --weight");
        }
        if self.request_burst.is_some() && self.requests.is_none() {
            return refuse("--request-burst needs --requests");
        }
        if self.read_burst.is_some() && self.read_bytes.is_none() {
            return refuse("--read-burst needs --read");
        }
        if self.write_burst.is_some() && self.write_bytes.is_none() {
            return refuse("--write-burst needs --write");
        }
        if self.request_burst == Some(0) || self.concurrent == Some(0) {
            return refuse("a burst or a concurrency of 0 would refuse every request: use a positive number");
        }
        if (self.ipv4_prefix.is_some() || self.ipv6_prefix.is_some()) && *subject != Subject::Anonymous {
            return refuse("--ipv4-prefix and --ipv6-prefix group anonymous clients only (principal `anonymous`)");
        }
        if self.weight.is_some_and(|w| !(1..=MAX_WEIGHT).contains(&w)) {
            return refuse(format!("--weight: expected 1 to {MAX_WEIGHT}"));
        }
        if self.ipv4_prefix.is_some_and(|p| !(1..=32).contains(&p)) {
            return refuse("--ipv4-prefix: expected 1 to 32 bits");
        }
        if self.ipv6_prefix.is_some_and(|p| !(1..=128).contains(&p)) {
            return refuse("--ipv6-prefix: expected 1 to 128 bits");
        }
        Ok(())
    }

    /// The request bucket's size.
    pub fn request_burst(&self) -> Option<u32> {
        self.requests.map(|rate| self.request_burst.unwrap_or(rate.count))
    }

    /// The read bucket's size in bytes: by default a tenth of a second's worth, so that a rate holds over seconds.
    pub fn read_burst(&self) -> Option<u64> {
        self.read_bytes.map(|rate| self.read_burst.unwrap_or(rate / 10).max(MIN_BYTE_BURST))
    }

    /// The write bucket's size in bytes, as [`LimitSet::read_burst`].
    pub fn write_burst(&self) -> Option<u64> {
        self.write_bytes.map(|rate| self.write_burst.unwrap_or(rate / 10).max(MIN_BYTE_BURST))
    }

    /// One line, as `limits show` and `token list` print it: `requests 100/s (burst 100), read 50MiB/s …`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let (Some(rate), Some(burst)) = (self.requests, self.request_burst()) {
            parts.push(format!("requests {rate} (burst {burst})"));
        }
        if let (Some(rate), Some(burst)) = (self.read_bytes, self.read_burst()) {
            parts.push(format!("read {}/s (burst {})", show_size(rate), show_size(burst)));
        }
        if let (Some(rate), Some(burst)) = (self.write_bytes, self.write_burst()) {
            parts.push(format!("write {}/s (burst {})", show_size(rate), show_size(burst)));
        }
        if let Some(n) = self.concurrent {
            parts.push(format!("concurrent {n}"));
        }
        if let Some(w) = self.weight {
            parts.push(format!("weight {w}"));
        }
        if self.ipv4_prefix.is_some() || self.ipv6_prefix.is_some() {
            let (v4, v6) = self.prefixes();
            parts.push(format!("per address group /{v4} (IPv4), /{v6} (IPv6)"));
        }
        parts.join(", ")
    }

    /// The prefix lengths that group anonymous clients.
    pub fn prefixes(&self) -> (u8, u8) {
        (self.ipv4_prefix.unwrap_or(32), self.ipv6_prefix.unwrap_or(64))
    }
}

/// The address group an anonymous client belongs to: its address with all but the leading `v4`/`v6` bits cleared
/// (an IPv4 address mapped into IPv6 counts as IPv4).
pub fn address_group(ip: IpAddr, (v4, v6): (u8, u8)) -> IpAddr {
    match ip {
        IpAddr::V6(v6_addr) if v6_addr.to_ipv4_mapped().is_some() => {
            address_group(IpAddr::V4(v6_addr.to_ipv4_mapped().expect("checked")), (v4, v6))
        }
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(v4.min(32))).unwrap_or(0);
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(v6.min(128))).unwrap_or(0);
            IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

/// Which limit refused a request: a metric label and the access log's `throttled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Requests,
    Concurrent,
}

impl LimitKind {
    pub fn label(self) -> &'static str {
        match self {
            LimitKind::Requests => "requests",
            LimitKind::Concurrent => "concurrent",
        }
    }

    /// The `qu` parameter of `RateLimit-Policy` (quota units, draft-ietf-httpapi-ratelimit-headers).
    fn quota_unit(self) -> &'static str {
        match self {
            LimitKind::Requests => "requests",
            LimitKind::Concurrent => "concurrent-requests",
        }
    }
}

/// A refusal by a limit: what the answer says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    pub kind: LimitKind,
    /// The scope of the limit that refused (`token`, `bucket`, …): the policy's name in the fields.
    pub scope: &'static str,
    /// The token id, access key id or bucket name the limit was set on; `None` for the default and anonymous
    /// limits, which cover principals no operator named.
    pub named: Option<Box<str>>,
    /// The quota of that limit per window (a rate's burst; a concurrency's count).
    pub quota: u64,
    /// The window the quota is over, in whole seconds (at least 1).
    pub window_secs: u64,
    /// When the request could pass, in whole seconds, at least 1: `Retry-After` and the `t` of `RateLimit`.
    pub retry_after_secs: u64,
}

impl Throttled {
    /// `RateLimit-Policy: "token";q=100;qu="requests";w=1`.
    pub fn policy_field(&self) -> String {
        format!("\"{}\";q={};qu=\"{}\";w={}", self.scope, self.quota, self.kind.quota_unit(), self.window_secs)
    }

    /// `RateLimit: "token";r=0;t=1`.
    pub fn limit_field(&self) -> String {
        format!("\"{}\";r=0;t={}", self.scope, self.retry_after_secs)
    }

    /// The one line an error document carries.
    pub fn message(&self) -> String {
        match self.kind {
            LimitKind::Requests => format!(
                "request rate limit of this {} reached; retry in {} s",
                self.scope_noun(),
                self.retry_after_secs
            ),
            LimitKind::Concurrent => {
                format!("{} requests of this {} in progress already, the most allowed", self.quota, self.scope_noun())
            }
        }
    }

    fn scope_noun(&self) -> &'static str {
        match self.scope {
            "token" => "token",
            "s3-key" => "access key",
            "bucket" => "bucket",
            "anonymous" => "client address",
            _ => "client",
        }
    }
}

/// Whole seconds, at least 1, of a wait: what `Retry-After` can say.
pub fn whole_secs_at_least_one(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0).max(u64::from(wait.is_zero()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn subjects_parse_and_show_as_given() {
        for text in ["default", "anonymous", "token:ab12", "s3-key:AKIAEXAMPLE", "bucket:releases"] {
            let s = Subject::parse(text).unwrap();
            assert_eq!(s.to_string(), text);
            assert_eq!(Subject::from_parts(s.scope(), s.name()), Some(s));
        }
        for bad in ["", "tokens:x", "token:", "bucket: x", "Default", "user:bob"] {
            assert!(Subject::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn request_rates() {
        assert_eq!(RequestRate::parse("100/s").unwrap(), RequestRate { count: 100, period_secs: 1 });
        assert_eq!(RequestRate::parse("6000/min").unwrap().to_string(), "6000/min");
        assert_eq!(RequestRate::parse("5/s").unwrap().interval(), Duration::from_millis(200));
        assert_eq!(RequestRate::parse("10/h").unwrap().interval(), Duration::from_secs(360));
        for bad in ["100", "0/s", "-1/s", "1.5/s", "100/day", "/s", "ten/s"] {
            let e = RequestRate::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn sizes_and_byte_rates() {
        assert_eq!(parse_byte_rate("50MiB/s", "--read").unwrap(), 50 << 20);
        assert_eq!(parse_byte_rate("10MB/s", "--read").unwrap(), 10_000_000);
        assert_eq!(parse_size("8MiB", "--read-burst").unwrap(), 8 << 20);
        assert_eq!(parse_size("4096", "--read-burst").unwrap(), 4096);
        assert!(parse_byte_rate("50MiB", "--read").unwrap_err().to_string().starts_with("--read \"50MiB\""));
        assert!(parse_byte_rate("fast/s", "--read").is_err());
        assert!(parse_byte_rate("0MiB/s", "--read").is_err());
        assert_eq!(show_size(50 << 20), "50MiB");
        assert_eq!(show_size(10_000_000), "10000000B");
    }

    #[test]
    fn checks_refuse_what_cannot_be_meant() {
        let token = Subject::Token("t".into());
        let rate = Some(RequestRate { count: 5, period_secs: 1 });
        assert!(LimitSet::default().check(&token).is_err());
        assert!(LimitSet { request_burst: Some(3), ..Default::default() }.check(&token).is_err());
        assert!(LimitSet { requests: rate, ipv4_prefix: Some(24), ..Default::default() }.check(&token).is_err());
        let anon = LimitSet { requests: rate, ipv4_prefix: Some(24), ..Default::default() };
        assert!(anon.check(&Subject::Anonymous).is_ok());
        assert!(LimitSet { ipv4_prefix: Some(33), ..anon }.check(&Subject::Anonymous).is_err());
        assert!(LimitSet { concurrent: Some(0), ..Default::default() }.check(&token).is_err());
        assert_eq!(
            LimitSet { requests: rate, read_bytes: Some(10 << 20), concurrent: Some(2), ..Default::default() }
                .describe(),
            "requests 5/s (burst 5), read 10MiB/s (burst 1MiB), concurrent 2"
        );
    }

    #[test]
    fn an_update_changes_only_what_it_names() {
        let old = LimitSet {
            requests: Some(RequestRate { count: 5, period_secs: 1 }),
            concurrent: Some(2),
            ..Default::default()
        };
        let new = old.updated(&LimitSet { concurrent: Some(8), ..Default::default() });
        assert_eq!((new.requests, new.concurrent), (old.requests, Some(8)));
    }

    #[test]
    fn address_groups() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(address_group(ip("192.0.2.77"), (24, 64)), ip("192.0.2.0"));
        assert_eq!(address_group(ip("192.0.2.77"), (32, 64)), ip("192.0.2.77"));
        assert_eq!(address_group(ip("::ffff:192.0.2.77"), (24, 64)), ip("192.0.2.0"));
        assert_eq!(address_group(ip("2001:db8:1:2:3:4:5:6"), (24, 48)), ip("2001:db8:1::"));
        assert_eq!(address_group(ip("2001:db8::1"), (24, 128)), ip("2001:db8::1"));
    }

    #[test]
    fn rate_limit_fields() {
        let t = Throttled {
            kind: LimitKind::Requests,
            scope: "token",
            named: None,
            quota: 5,
            window_secs: 1,
            retry_after_secs: 1,
        };
        assert_eq!(t.policy_field(), "\"token\";q=5;qu=\"requests\";w=1");
        assert_eq!(t.limit_field(), "\"token\";r=0;t=1");
        assert_eq!(whole_secs_at_least_one(Duration::ZERO), 1);
        assert_eq!(whole_secs_at_least_one(Duration::from_millis(1200)), 2);
        assert_eq!(whole_secs_at_least_one(Duration::from_secs(3)), 3);
    }

    proptest! {
        #[test]
        fn a_group_contains_its_address_and_is_its_own_group(a: u32, b: u128, v4 in 1u8..=32, v6 in 1u8..=128) {
            for ip in [IpAddr::V4(a.into()), IpAddr::V6(b.into())] {
                let group = address_group(ip, (v4, v6));
                prop_assert_eq!(address_group(group, (v4, v6)), group);
                prop_assert_eq!(address_group(ip, (v4, v6)), group);
            }
        }

        #[test]
        fn shown_sizes_parse_back(bytes in 1u64..(1 << 50)) {
            prop_assert_eq!(parse_size(&show_size(bytes), "x").unwrap(), bytes);
        }
    }
}
