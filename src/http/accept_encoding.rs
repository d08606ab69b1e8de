//! Content-coding negotiation: which stored variant of an object answers a request (RFC 9110 §12.5.3).
//!
//! Pure: [`negotiate`] reads the `Accept-Encoding` field lines and the set of variants the object has, and
//! returns the coding to send. Decisions (RFC 9110 unless noted):
//! - Elements are `coding *( OWS ";" OWS param )`; codings and parameter names are case-insensitive (§8.4.1,
//!   §5.6.6). `q` is a qvalue (§12.4.2) held in thousandths, so no floating point is compared. Several field
//!   lines form one list. An element that does not parse (a bad qvalue, an empty coding) is ignored, as a
//!   malformed list member should cost only that member. `x-gzip` is gzip (§8.4.1.3).
//! - A coding listed more than once takes its highest q: the client said at least once that it accepts it.
//! - A coding that is not listed takes the q of `*` if there is one, else it is not acceptable. `identity` that is
//!   not listed (and not covered by `*`) is acceptable (§12.5.3: "acceptable by default unless specifically
//!   excluded") at the lowest q, 0.001: a client that lists `gzip;q=0.5` asked for gzip, and an unlisted identity
//!   outranking it at an implied 1 would be a surprise (nginx sends gzip there too).
//! - No header at all, or an empty one, gets identity. §12.5.3 says any coding is then acceptable, but a client
//!   that sent nothing (curl without `--compressed`, a script) cannot decode br, and identity is always stored.
//! - The highest q wins; at equal q the smaller stored form wins: br, then gzip, then identity.
//! - **An impossible negotiation gets identity, not 406.** When every coding we have is refused (`identity;q=0,
//!   *;q=0`, or `br` alone for an object without a br variant and `identity;q=0`), §12.5.3 lets the origin either
//!   answer 406 or disregard the header, and §15.5.7 says a 406 is a "MAY". nginx, Apache, Caddy and
//!   static-web-server disregard it. The identity bytes are the object itself, a shared cache in front of us keys
//!   the answer by `Vary: Accept-Encoding` anyway, and a 406 would turn a client's odd header into a failed asset
//!   load in the browser. So the result is always something we can send.

use crate::header_values::fields::{self, Fields};

use super::range::trim_ows;
pub use crate::header_values::content_coding::{ContentCoding, Variants};

/// A qvalue in thousandths: 0 (not acceptable) to 1000.
type Milli = u16;

/// The q of an identity the request neither lists nor covers by `*`: acceptable, but after anything listed.
const IDENTITY_BY_DEFAULT: Milli = 1;

/// What the request says about each coding we care about; `None` is "not listed".
#[derive(Default)]
struct Preferences {
    br: Option<Milli>,
    gzip: Option<Milli>,
    identity: Option<Milli>,
    any: Option<Milli>,
}

impl Preferences {
    fn parse(headers: &dyn Fields) -> Preferences {
        let mut prefs = Preferences::default();
        for line in headers.values(&fields::ACCEPT_ENCODING) {
            for element in line.split(|&b| b == b',') {
                let Some((coding, q)) = parse_element(element) else { continue };
                let slot = if coding.eq_ignore_ascii_case(b"*") {
                    &mut prefs.any
                } else {
                    match ContentCoding::from_token(coding) {
                        Some(ContentCoding::Br) => &mut prefs.br,
                        Some(ContentCoding::Gzip) => &mut prefs.gzip,
                        Some(ContentCoding::Identity) => &mut prefs.identity,
                        None => continue,
                    }
                };
                *slot = Some(slot.map_or(q, |old| old.max(q)));
            }
        }
        prefs
    }

    /// The q the request gives `coding`, applying `*` and identity's default.
    fn quality(&self, coding: ContentCoding) -> Milli {
        let listed = match coding {
            ContentCoding::Br => self.br,
            ContentCoding::Gzip => self.gzip,
            ContentCoding::Identity => self.identity,
        };
        let default = if coding == ContentCoding::Identity { IDENTITY_BY_DEFAULT } else { 0 };
        listed.or(self.any).unwrap_or(default)
    }
}

/// Picks the coding to send from the request's `Accept-Encoding` and the object's variants. Always a coding the
/// object has (identity when nothing else is acceptable; see the module doc for why not 406).
pub fn negotiate(headers: &dyn Fields, variants: Variants) -> ContentCoding {
    if !variants.any() {
        return ContentCoding::Identity;
    }
    let prefs = Preferences::parse(headers);
    let mut best = (0, ContentCoding::Identity);
    for coding in ContentCoding::PREFERENCE {
        let q = prefs.quality(coding);
        // Strictly greater: at equal q the earlier (smaller) coding stays.
        if variants.has(coding) && q > best.0 {
            best = (q, coding);
        }
    }
    best.1
}

/// `coding *( OWS ";" OWS name "=" value )` → the coding and its q (1000 when absent). `None` for an empty
/// element, an empty coding, or a malformed `q`.
fn parse_element(element: &[u8]) -> Option<(&[u8], Milli)> {
    let mut parts = element.split(|&b| b == b';');
    let coding = trim_ows(parts.next()?);
    if coding.is_empty() || !coding.iter().all(|&b| is_tchar(b)) {
        return None;
    }
    let mut q = 1000;
    for param in parts {
        let param = trim_ows(param);
        let (name, value) = match param.iter().position(|&b| b == b'=') {
            Some(eq) => (trim_ows(&param[..eq]), trim_ows(&param[eq + 1..])),
            None => return None,
        };
        if name.eq_ignore_ascii_case(b"q") {
            q = parse_qvalue(value)?;
        }
    }
    Some((coding, q))
}

/// §12.4.2: `( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`, in thousandths.
fn parse_qvalue(value: &[u8]) -> Option<Milli> {
    let (whole, fraction) = match value.iter().position(|&b| b == b'.') {
        Some(dot) => (&value[..dot], &value[dot + 1..]),
        None => (value, &b""[..]),
    };
    if fraction.len() > 3 || !fraction.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let thousandths =
        fraction.iter().chain(std::iter::repeat(&b'0')).take(3).fold(0, |acc, &d| acc * 10 + Milli::from(d - b'0'));
    match whole {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// RFC 9110 §5.6.2 tchar.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::ContentCoding::{Br, Gzip, Identity};
    use super::*;
    use http::HeaderValue;
    use http::header;

    const BOTH: Variants = Variants { br: true, gzip: true };
    const GZIP_ONLY: Variants = Variants { br: false, gzip: true };
    const BR_ONLY: Variants = Variants { br: true, gzip: false };

    fn with(lines: &[&str]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        for line in lines {
            headers.append(header::ACCEPT_ENCODING, HeaderValue::from_str(line).unwrap());
        }
        headers
    }

    fn pick(lines: &[&str], variants: Variants) -> ContentCoding {
        negotiate(&with(lines), variants)
    }

    #[test]
    fn the_negotiation_table() {
        #[rustfmt::skip]
        let table: &[(&[&str], Variants, ContentCoding, &str)] = &[
            (&[], BOTH, Identity, "no header: identity (a client that sent nothing may not decode)"),
            (&[""], BOTH, Identity, "an empty header wants no coding (§12.5.3)"),
            (&["gzip, deflate, br"], BOTH, Br, "equal q: br before gzip"),
            (&["gzip, deflate, br, zstd"], GZIP_ONLY, Gzip, "only what the object has"),
            (&["br"], GZIP_ONLY, Identity, "br asked, none stored: identity is acceptable by default"),
            (&["gzip;q=0.5"], BOTH, Gzip, "an unlisted identity ranks after every listed coding"),
            (&["gzip;q=0.001"], BOTH, Gzip, "even at the lowest q, gzip first at the tie"),
            (&["gzip;q=0.5, br;q=0.4"], BOTH, Gzip, "the higher q wins over preference"),
            (&["gzip;q=1.0, br;q=0.999"], BOTH, Gzip, "thousandths count"),
            (&["br;q=0.5, identity;q=0.6"], BOTH, Identity, "identity can outrank a coding"),
            (&["br;q=0.5, identity;q=0.5"], BOTH, Br, "at equal q br is smaller than identity"),
            (&["br;q=0"], BOTH, Identity, "q=0 refuses br; gzip is not listed"),
            (&["br;q=0, gzip"], BOTH, Gzip, "q=0 refuses br only"),
            (&["*"], BOTH, Br, "* accepts every coding"),
            (&["*;q=0.1"], BOTH, Br, "* covers identity too: equal q, so br"),
            (&["*;q=0"], BOTH, Identity, "*;q=0 without identity: impossible, so identity (not 406)"),
            (&["*;q=0, gzip"], BOTH, Gzip, "a specific entry beats *"),
            (&["identity;q=0"], BOTH, Identity, "identity refused, nothing else accepted: identity anyway"),
            (&["identity;q=0, gzip"], BOTH, Gzip, "identity refused: gzip"),
            (&["identity;q=0, *"], BOTH, Br, "identity refused, * accepts br"),
            (&["identity;q=0, *;q=0"], BOTH, Identity, "impossible: identity, not 406"),
            (&["identity;q=0, br"], GZIP_ONLY, Identity, "impossible for this object: identity"),
            (&["BR", ""], BOTH, Br, "case-insensitive coding"),
            (&["GZip;Q=0.8, Br;q=0.7"], BOTH, Gzip, "case-insensitive q"),
            (&["x-gzip"], BOTH, Gzip, "x-gzip is gzip (§8.4.1.3)"),
            (&["gzip", "br"], BOTH, Br, "several field lines are one list"),
            (&["br;q=0, br"], BOTH, Br, "listed twice: the highest q"),
            (&["br;q=2, gzip"], BOTH, Gzip, "a malformed q drops its element"),
            (&["br;q=0.0001, gzip;q=0.5"], BOTH, Gzip, "four decimals are malformed"),
            (&["br;q=1.001"], BOTH, Identity, "1.001 is malformed"),
            (&["br;level=5;q=0.9, gzip;q=0.8"], BOTH, Br, "other parameters are ignored"),
            (&["br;q", "gzip"], BOTH, Gzip, "a parameter without a value drops its element"),
            (&[" , ,br ;  q=0.3 , identity ;q=0.2,"], BOTH, Br, "OWS and empty elements"),
            (&["*"], Variants { br: false, gzip: false }, Identity, "no variants: identity whatever is asked"),
            (&["br"], BR_ONLY, Br, "br only"),
        ];
        for (lines, variants, expected, why) in table {
            assert_eq!(pick(lines, *variants), *expected, "{lines:?} with {variants:?}: {why}");
        }
    }

    #[test]
    fn qvalues_parse_to_thousandths() {
        for (text, expected) in [
            ("0", Some(0)),
            ("0.", Some(0)),
            ("0.5", Some(500)),
            ("0.05", Some(50)),
            ("0.123", Some(123)),
            ("1", Some(1000)),
            ("1.000", Some(1000)),
            ("1.1", None),
            ("0.1234", None),
            ("2", None),
            ("", None),
            ("-0", None),
            (".5", None),
            ("0.a", None),
        ] {
            assert_eq!(parse_qvalue(text.as_bytes()), expected, "{text:?}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn coding() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("br".to_owned()),
                Just("gzip".to_owned()),
                Just("identity".to_owned()),
                Just("*".to_owned()),
                Just("zstd".to_owned()),
                Just("deflate".to_owned()),
            ]
        }

        fn qvalue() -> impl Strategy<Value = Option<u16>> {
            prop_oneof![Just(None), (0u16..=1000).prop_map(Some)]
        }

        fn element((coding, q): (String, Option<u16>)) -> String {
            match q {
                None => coding,
                Some(1000) => format!("{coding};q=1"),
                Some(q) => format!("{coding};q=0.{q:03}"),
            }
        }

        fn variants() -> impl Strategy<Value = Variants> {
            (any::<bool>(), any::<bool>()).prop_map(|(br, gzip)| Variants { br, gzip })
        }

        /// The q a list of distinct codings gives `coding`, written straight from §12.5.3.
        fn model_quality(list: &[(String, Option<u16>)], coding: ContentCoding) -> u16 {
            let q_of = |name: &str| list.iter().find(|(c, _)| c == name).map(|(_, q)| q.unwrap_or(1000));
            q_of(coding.token()).or_else(|| q_of("*")).unwrap_or(if coding == Identity {
                IDENTITY_BY_DEFAULT
            } else {
                0
            })
        }

        proptest! {
            /// The answer is always a representation the object has, and no acceptable coding has a higher q;
            /// when some coding has q > 0 the answer has q > 0.
            #[test]
            fn the_answer_is_stored_and_of_the_highest_quality(
                list in proptest::collection::hash_map(coding(), qvalue(), 0..6),
                variants in variants(),
            ) {
                let list: Vec<(String, Option<u16>)> = list.into_iter().collect();
                let header = list.iter().cloned().map(element).collect::<Vec<_>>().join(", ");
                let got = pick(&[&header], variants);
                prop_assert!(variants.has(got));
                if variants.any() {
                    let best = ContentCoding::PREFERENCE.iter().filter(|c| variants.has(**c))
                        .map(|c| model_quality(&list, *c)).max().unwrap();
                    let got_q = model_quality(&list, got);
                    prop_assert!(got_q == best || best == 0, "{header}: {got:?} at {got_q}, best {best}");
                }
            }

            /// Order and case of the elements never change the answer.
            #[test]
            fn order_and_case_do_not_matter(
                list in proptest::collection::hash_map(coding(), qvalue(), 0..6),
                variants in variants(),
            ) {
                let elements: Vec<String> = list.into_iter().map(element).collect();
                let forward = elements.join(",");
                let mut reversed = elements.clone();
                reversed.reverse();
                let backward = reversed.join(" , ").to_ascii_uppercase();
                prop_assert_eq!(pick(&[&forward], variants), pick(&[&backward], variants));
            }

            /// Arbitrary bytes never panic and always give something the object has.
            #[test]
            fn any_header_gives_a_stored_coding(text in "[ -~]{0,40}", variants in variants()) {
                prop_assert!(variants.has(pick(&[&text], variants)));
            }
        }
    }
}
