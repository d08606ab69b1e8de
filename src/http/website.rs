//! Static-site answers (`bucket set --index-document/--error-document`), decided without IO: which key a native
//! GET/HEAD reads and is authorised as, and what a miss falls back to. `object.rs` authorises, looks up and
//! answers in the plan's order:
//!
//! 1. Authorise [`Plan::authorised_key`] (before any lookup, as every read): the object the path reads, so what
//!    is served is always what was authorised.
//! 2. Look up [`Plan::object`]: the key the path names, or for a directory (`/{bucket}/`, `/{bucket}/dir/`) that
//!    directory's index document. Found: the ordinary pipeline (preconditions, ranges, variants, sendfile).
//! 3. A miss, told only to a caller step 1 let through: [`Plan::redirect`] (`dir` → `./dir/` when `dir/` has an
//!    index document the caller may read), else [`Plan::error_document`] with 404 (when the caller may read it),
//!    else a plain 404.
//!
//! Without static-site settings a key plans exactly as before (itself, nothing on a miss); a directory key is
//! looked up as the key it is (an S3 "folder" object `dir/`), and the bucket's root has nothing to read: 404.

use crate::names::{IndexDocument, ObjectKey, RequestedKey, Website};

/// What a native GET/HEAD of one path reads, and what a miss falls back to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<'a> {
    /// The object to serve: the key the path names, or its directory's index document. `None`: nothing to read
    /// (the bucket's root without an index document, or an index document too long to be a key there).
    pub object: Option<ObjectKey>,
    /// The directory authorised when there is no object to read (`""`: the bucket's root).
    directory: String,
    /// The bucket's index document when the path may name a directory without its `/`: see [`Plan::redirect`].
    redirect_index: Option<&'a IndexDocument>,
    raw_path: &'a str,
    /// On a miss: the bucket's error document, served with 404.
    pub error_document: Option<&'a ObjectKey>,
}

/// A `302 Found` to the directory a path names without its trailing `/`, when that directory has an index document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// The directory's index document: the redirect is given only when it exists and the caller may read it.
    pub index: ObjectKey,
    /// `Location`: `./{last segment}/`, relative to the request, so it stays right behind a proxy that maps
    /// another path onto the bucket (`https://site/docs` → `/static/docs`); the `./` keeps a segment with a `:`
    /// from reading as a scheme. The segment is as the request sent it (still percent-encoded).
    pub location: String,
}

impl Plan<'_> {
    /// The key the request is authorised as, before any lookup: the object it reads, else the directory.
    pub fn authorised_key(&self) -> &str {
        self.object.as_ref().map_or(self.directory.as_str(), ObjectKey::as_str)
    }

    /// On a miss: the directory this path names without its `/` (`dir` → `dir/`, the bucket's name → its root),
    /// when the bucket has an index document. Made only on a miss, so a hit allocates nothing for it.
    pub fn redirect(&self) -> Option<Redirect> {
        let index = self.redirect_index?;
        let index = match &self.object {
            Some(key) => index.in_directory(&format!("{}/", key.as_str()))?,
            None => index.at_root(),
        };
        let last_segment = self.raw_path.rsplit('/').next().unwrap_or_default();
        Some(Redirect { index, location: format!("./{last_segment}/") })
    }
}

/// Plans a native GET/HEAD of `requested`, whose path as received is `raw_path`, in a bucket with `website`.
pub fn plan<'a>(requested: RequestedKey, raw_path: &'a str, website: &'a Website) -> Plan<'a> {
    let index = website.index_document.as_ref();
    let (object, directory, redirect_index) = match requested {
        RequestedKey::Key(key) if key.as_str().ends_with('/') => match index {
            // Too long to be a key with its index document: nothing to read there.
            Some(index) => match index.in_directory(key.as_str()) {
                Some(object) => (Some(object), String::new(), None),
                None => (None, key.as_str().to_owned(), None),
            },
            // An S3 "folder" object `dir/` is served as before.
            None => (Some(key), String::new(), None),
        },
        RequestedKey::Key(key) => (Some(key), String::new(), index),
        RequestedKey::Root { slash: true } => (index.map(IndexDocument::at_root), String::new(), None),
        RequestedKey::Root { slash: false } => (None, String::new(), index),
    };
    Plan { object, directory, redirect_index, raw_path, error_document: website.error_document.as_ref() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn site(index: Option<&str>, error: Option<&str>) -> Website {
        Website {
            index_document: index.map(|i| IndexDocument::parse(i).unwrap()),
            error_document: error.map(|e| ObjectKey::parse(e).unwrap()),
        }
    }

    fn key(k: &str) -> RequestedKey {
        RequestedKey::Key(ObjectKey::parse(k).unwrap())
    }

    /// (path as requested, object read, key authorised, redirect (index, location))
    type Case = (&'static str, Option<&'static str>, &'static str, Option<(&'static str, &'static str)>);

    fn check(website: &Website, cases: &[Case]) {
        for (path, object, authorised, redirect) in cases {
            let (_, requested) = crate::names::parse_data_path(path).unwrap();
            let plan = plan(requested, path, website);
            assert_eq!(plan.object.as_ref().map(ObjectKey::as_str), *object, "{path}");
            assert_eq!(plan.authorised_key(), *authorised, "{path}");
            let made = plan.redirect();
            let got = made.as_ref().map(|r| (r.index.as_str(), r.location.as_str()));
            assert_eq!(got, *redirect, "{path}");
            assert_eq!(plan.error_document, website.error_document.as_ref(), "{path}");
        }
    }

    #[test]
    fn directories_read_their_index_document_and_directory_names_redirect() {
        check(
            &site(Some("index.html"), Some("404.html")),
            &[
                ("/static/", Some("index.html"), "index.html", None),
                ("/static/css/", Some("css/index.html"), "css/index.html", None),
                ("/static/a//", Some("a//index.html"), "a//index.html", None),
                ("/static/app.js", Some("app.js"), "app.js", Some(("app.js/index.html", "./app.js/"))),
                ("/static/docs/v1", Some("docs/v1"), "docs/v1", Some(("docs/v1/index.html", "./v1/"))),
                ("/static/a%20b", Some("a b"), "a b", Some(("a b/index.html", "./a%20b/"))),
                ("/static/a%2Fb", Some("a/b"), "a/b", Some(("a/b/index.html", "./a%2Fb/"))),
                ("/static/x:y", Some("x:y"), "x:y", Some(("x:y/index.html", "./x:y/"))),
                ("/static", None, "", Some(("index.html", "./static/"))),
            ],
        );
        check(
            &site(Some("_/home.html"), None),
            &[
                ("/static/", Some("_/home.html"), "_/home.html", None),
                ("/static/d/", Some("d/_/home.html"), "d/_/home.html", None),
            ],
        );
    }

    #[test]
    fn without_an_index_document_keys_read_as_before_and_the_root_reads_nothing() {
        for website in [site(None, None), site(None, Some("404.html"))] {
            check(
                &website,
                &[
                    ("/static/", None, "", None),
                    ("/static", None, "", None),
                    ("/static/css/", Some("css/"), "css/", None),
                    ("/static/app.js", Some("app.js"), "app.js", None),
                ],
            );
        }
    }

    #[test]
    fn a_directory_too_deep_for_its_index_document_reads_nothing_and_is_authorised_as_itself() {
        let dir = format!("{}/", "d".repeat(1015));
        let website = site(Some("index.html"), None);
        let path = format!("/static/{dir}");
        let deep = plan(key(&dir), &path, &website);
        assert_eq!((deep.object.as_ref(), deep.authorised_key()), (None, dir.as_str()));
        let name = "n".repeat(1014);
        let path = format!("/static/{name}");
        let long = plan(key(&name), &path, &website);
        assert_eq!(
            (long.object.as_ref().unwrap().as_str(), long.redirect()),
            (name.as_str(), None),
            "no redirect either"
        );
    }

    /// RFC 3986 §5.2 for the one shape of reference a redirect uses (`./segment/`) against an absolute path.
    fn resolve(base: &str, reference: &str) -> String {
        let dir = &base[..=base.rfind('/').unwrap()];
        format!("{dir}{}", reference.strip_prefix("./").unwrap())
    }

    fn website() -> impl Strategy<Value = Website> {
        let index = prop_oneof![Just(None), "[a-z]{1,8}(/[a-z.]{1,8}){0,2}".prop_map(Some)];
        let error = prop_oneof![Just(None), Just(Some("404.html"))];
        (index, error).prop_filter_map("an index document", |(index, error)| {
            let index_document = match index {
                Some(i) => Some(IndexDocument::parse(&i).ok()?),
                None => None,
            };
            Some(Website { index_document, error_document: error.map(|e| ObjectKey::parse(e).unwrap()) })
        })
    }

    proptest! {
        /// What is read is what was authorised, the error document is the bucket's, and a redirect goes to the
        /// path with a `/` added, naming that directory's index document.
        #[test]
        fn the_object_read_is_the_key_authorised(raw in "/static(/[a-z%20A-F.:]{0,6}){0,4}/?", website in website()) {
            let Ok((_, requested)) = crate::names::parse_data_path(&raw) else { return Ok(()) };
            let plan = plan(requested.clone(), &raw, &website);
            if let Some(object) = &plan.object {
                prop_assert_eq!(plan.authorised_key(), object.as_str());
            }
            prop_assert_eq!(plan.error_document, website.error_document.as_ref());
            if let Some(redirect) = plan.redirect() {
                prop_assert_eq!(resolve(&raw, &redirect.location), format!("{raw}/"));
                let (_, directory) = crate::names::parse_data_path(&format!("{raw}/")).unwrap();
                let want = plan_index(directory, &website);
                prop_assert_eq!(Some(&redirect.index), want.as_ref());
            }
            let directory = match &requested {
                RequestedKey::Key(key) => key.as_str().ends_with('/'),
                RequestedKey::Root { slash } => *slash,
            };
            match (&requested, &website.index_document) {
                // Without an index document a key reads itself, and nothing falls back but the error document.
                (RequestedKey::Key(key), None) => {
                    prop_assert_eq!(plan.object.as_ref(), Some(key));
                    prop_assert!(plan.redirect().is_none());
                }
                (RequestedKey::Root { .. }, None) => prop_assert!(plan.object.is_none() && plan.redirect().is_none()),
                // With one, a directory reads its index document, and only a path without the `/` redirects.
                (_, Some(index)) if directory => {
                    let read = plan.object.as_ref().map(ObjectKey::as_str).unwrap_or_default();
                    prop_assert!(read.ends_with(index.as_str()));
                    prop_assert!(plan.redirect().is_none());
                }
                (_, Some(_)) => prop_assert!(plan.redirect().is_some()),
            }
        }
    }

    /// The index document a directory path reads.
    fn plan_index(directory: RequestedKey, website: &Website) -> Option<ObjectKey> {
        plan(directory, "/", website).object
    }
}
