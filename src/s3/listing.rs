//! One page of an S3 listing (ListObjects V1 and V2) over a source that returns a bucket's objects under a prefix
//! in key order, from a start key, up to a limit: the store's keyset listing.
//!
//! The listing is the sorted sequence of *entries*: each key under the prefix, except that a key whose rest
//! (after the prefix) contains the delimiter rolls up into its common prefix (the prefix, the rest up to and with
//! the first delimiter), which is one entry however many keys it has. A page is the first `max_keys` entries
//! that sort after the marker (the start-after key, the continuation token's key, or V1's marker), and the next
//! marker is the page's last entry. Since a common prefix sorts before every key it covers, the entry order is
//! the key order, and a common prefix at or before the marker is skipped whole.
//!
//! **Cost.** A common prefix is left by seeking to its successor (the least string above everything that starts
//! with it), never by reading through its keys, so a page costs O(max-keys) rows whatever the bucket holds:
//! - every fetch after the first starts at a new entry;
//! - a fetch asks for at most twice the entries the previous one produced (at least [`MIN_BATCH`]), so the rows
//!   read inside common prefixes are bounded by the entries found.
//!
//! Together: at most `max_keys + 2` fetches and `11 × (max_keys + 1)` rows (the property tests check both).
//!
//! [`Planner`] is the pure state machine (ask [`Planner::next_fetch`], answer [`Planner::feed`], then
//! [`Planner::finish`]); [`list_page`] drives it over a [`Source`].
//!
//! Both listings run on it: ListObjects over objects, whose position is their key, and ListMultipartUploads over
//! uploads, several of which may share a key, so their position is an [`UploadMarker`] (key, upload id): a page
//! may end, and the next one resume, between two uploads of one key (`key-marker` and `upload-id-marker`).

use std::future::Future;

use crate::names::prefix_upper_bound;

/// The least rows a fetch asks for after the first (while entries are still wanted).
pub const MIN_BATCH: u32 = 8;

/// What to list: items whose keys are under `prefix`, rolled up at `delimiter`, after `after`, at most `max_keys`
/// entries. `M` is the listed items' [`Listed::Marker`]: a key for objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery<M = String> {
    pub prefix: String,
    /// `None` for no delimiter (an empty one means none, as in S3).
    pub delimiter: Option<String>,
    /// Entries must sort after this (exclusive): start-after, the continuation token's key, or the V1 marker; for
    /// uploads, the key and upload-id markers.
    pub after: Option<M>,
    /// 0 to [`super::MAX_KEYS`]. With 0 the page is empty and not truncated (nothing to continue from).
    pub max_keys: u32,
}

/// Where a fetch starts. Both bounds sort at or above the query's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start<M = String> {
    /// Items strictly after this position.
    After(M),
    /// Items whose keys are at or after this one.
    AtLeast(String),
}

/// One read from the source: up to `limit` items under the prefix, in order, from `start`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch<M = String> {
    pub start: Start<M>,
    pub limit: u32,
}

/// Anything listed by key.
pub trait Keyed {
    fn key(&self) -> &str;
}

impl Keyed for String {
    fn key(&self) -> &str {
        self
    }
}

/// What a listing lists: items under keys, in the order of their markers.
pub trait Listed: Keyed {
    /// A position in that order, which a page continues after: an object's key, an upload's [`UploadMarker`].
    type Marker: Keyed + Clone + std::fmt::Debug + Eq;
    fn marker(&self) -> Self::Marker;
}

impl Listed for String {
    type Marker = String;
    fn marker(&self) -> String {
        self.clone()
    }
}

/// A position among uploads, ordered by (key, upload id): several uploads may share a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadMarker {
    pub key: String,
    /// After this upload of `key`; `None`: after every upload of `key`.
    pub upload_id: Option<String>,
}

impl UploadMarker {
    /// S3's `key-marker` and `upload-id-marker`: an empty key marker is none, and an upload-id marker counts
    /// only with a key marker.
    pub fn of_request(key_marker: Option<&str>, upload_id_marker: Option<&str>) -> Option<Self> {
        let key = key_marker.filter(|k| !k.is_empty())?;
        Some(UploadMarker { key: key.to_owned(), upload_id: upload_id_marker.map(str::to_owned) })
    }
}

impl Keyed for UploadMarker {
    fn key(&self) -> &str {
        &self.key
    }
}

/// One entry of a listing page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry<O> {
    Object(O),
    /// A common prefix: the query's prefix, then the rest of a key up to and with the first delimiter.
    CommonPrefix(String),
}

impl<O: Keyed> Entry<O> {
    /// The key or the common prefix: what the entry sorts by, and the marker to continue after it.
    pub fn name(&self) -> &str {
        match self {
            Entry::Object(o) => o.key(),
            Entry::CommonPrefix(p) => p,
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<O> {
    /// In order; objects and common prefixes interleaved as they sort.
    pub entries: Vec<Entry<O>>,
    /// More entries follow: continue after [`Page::next_marker`].
    pub is_truncated: bool,
}

impl<O: Keyed> Page<O> {
    /// The last entry's name when the page is truncated: the next page's marker (V1's `NextMarker`; the key a
    /// V2 continuation token carries; ListMultipartUploads' `NextKeyMarker`).
    pub fn next_marker(&self) -> Option<&str> {
        self.is_truncated.then(|| self.entries.last().map(Entry::name)).flatten()
    }
}

impl<O: Listed<Marker = UploadMarker>> Page<O> {
    /// ListMultipartUploads' `NextUploadIdMarker`: the last upload's id when the page is truncated after an upload
    /// (after a common prefix, the next page skips all of its uploads).
    pub fn next_upload_id_marker(&self) -> Option<String> {
        match self.entries.last().filter(|_| self.is_truncated)? {
            Entry::Object(upload) => upload.marker().upload_id,
            Entry::CommonPrefix(_) => None,
        }
    }
}

impl<O> Page<O> {
    /// The same page with each object converted (a store row into what the XML lists).
    pub fn map<T>(self, mut f: impl FnMut(O) -> T) -> Page<T> {
        let entries = self
            .entries
            .into_iter()
            .map(|e| match e {
                Entry::Object(o) => Entry::Object(f(o)),
                Entry::CommonPrefix(p) => Entry::CommonPrefix(p),
            })
            .collect();
        Page { entries, is_truncated: self.is_truncated }
    }
}

/// The listing of one page as a state machine: no IO, so the caller decides how rows are read.
#[derive(Debug)]
pub struct Planner<O: Listed> {
    query: ListQuery<O::Marker>,
    /// Entries wanted: one more than the page holds, to learn whether it is truncated.
    want: usize,
    entries: Vec<Entry<O>>,
    /// The common prefix the last row fell in, whose remaining keys are skipped.
    skipping: Option<String>,
    next: Option<Fetch<O::Marker>>,
    rows_read: u64,
    fetches: u32,
}

impl<O: Listed> Planner<O> {
    pub fn new(mut query: ListQuery<O::Marker>) -> Self {
        query.delimiter = query.delimiter.filter(|d| !d.is_empty());
        let want = query.max_keys as usize + 1;
        let start = match &query.after {
            Some(after) if after.key() >= query.prefix.as_str() => {
                // A marker past every key with the prefix leaves nothing to list.
                let past_prefix = prefix_upper_bound(&query.prefix).is_some_and(|upper| after.key() >= upper.as_str());
                (!past_prefix).then(|| Start::After(after.clone()))
            }
            _ => Some(Start::AtLeast(query.prefix.clone())),
        };
        let next = start.filter(|_| query.max_keys > 0).map(|start| Fetch { start, limit: want as u32 });
        Self { query, want, entries: Vec::new(), skipping: None, next, rows_read: 0, fetches: 0 }
    }

    /// The prefix every fetch lists under.
    pub fn prefix(&self) -> &str {
        &self.query.prefix
    }

    /// The next read the page needs, or `None` when it is complete.
    pub fn next_fetch(&self) -> Option<&Fetch<O::Marker>> {
        self.next.as_ref()
    }

    /// The rows the last [`Planner::next_fetch`] returned, in order, all under the prefix and from its start.
    /// Fewer rows than its limit means the source has no more.
    pub fn feed(&mut self, rows: Vec<O>) {
        let Some(fetch) = self.next.take() else {
            debug_assert!(rows.is_empty(), "rows fed to a complete page");
            return;
        };
        self.fetches += 1;
        self.rows_read += rows.len() as u64;
        let exhausted = rows.len() < fetch.limit as usize;
        let mut produced = 0u32;
        let mut last = None;
        for row in rows {
            let key = row.key();
            debug_assert!(key.starts_with(&self.query.prefix), "a row outside the prefix: {key:?}");
            if self.skipping.as_deref().is_some_and(|p| key.starts_with(p)) {
                continue;
            }
            self.skipping = None;
            match common_prefix(&self.query.prefix, self.query.delimiter.as_deref(), key) {
                Some(common) => {
                    // A common prefix at or before the marker was listed by an earlier page (or skipped).
                    let at_or_before_marker = self.query.after.as_ref().is_some_and(|a| common.as_str() <= a.key());
                    if !at_or_before_marker {
                        self.entries.push(Entry::CommonPrefix(common.clone()));
                        produced += 1;
                    }
                    self.skipping = Some(common);
                }
                None => {
                    last = Some(row.marker());
                    self.entries.push(Entry::Object(row));
                    produced += 1;
                }
            }
            if self.entries.len() == self.want {
                return;
            }
        }
        if exhausted {
            return;
        }
        let start = match (&self.skipping, last) {
            (Some(common), _) => match prefix_upper_bound(common) {
                Some(successor) => Start::AtLeast(successor),
                None => return,
            },
            (None, Some(marker)) => Start::After(marker),
            // Not reached: a full batch has a last row, in a common prefix or not.
            (None, None) => return,
        };
        let remaining = (self.want - self.entries.len()) as u32;
        let limit = remaining.min(MIN_BATCH.max(produced.saturating_mul(2)));
        self.next = Some(Fetch { start, limit });
    }

    /// The finished page (call once [`Planner::next_fetch`] is `None`).
    pub fn finish(mut self) -> Page<O> {
        debug_assert!(self.next.is_none(), "finish before the page is complete");
        let is_truncated = self.entries.len() > self.query.max_keys as usize;
        self.entries.truncate(self.query.max_keys as usize);
        Page { entries: self.entries, is_truncated }
    }

    /// Rows fed so far (what the page cost the source).
    pub fn rows_read(&self) -> u64 {
        self.rows_read
    }

    /// Fetches fed so far.
    pub fn fetches(&self) -> u32 {
        self.fetches
    }
}

/// The common prefix `key` rolls up into under `prefix` at `delimiter`, if any.
fn common_prefix(prefix: &str, delimiter: Option<&str>, key: &str) -> Option<String> {
    let rest = key.get(prefix.len()..)?;
    let at = rest.find(delimiter?)?;
    Some(key[..prefix.len() + at + delimiter?.len()].to_owned())
}

/// The items of one bucket in order, read a page at a time: the store's keyset listing of objects or of uploads.
pub trait Source {
    type Item: Listed + Send;
    type Error;
    /// Up to `fetch.limit` items whose keys start with `prefix`, in order, from `fetch.start`.
    fn fetch(
        &mut self,
        prefix: &str,
        fetch: &Fetch<<Self::Item as Listed>::Marker>,
    ) -> impl Future<Output = Result<Vec<Self::Item>, Self::Error>> + Send;
}

/// One page of `query`, read from `source`.
pub async fn list_page<S: Source>(
    source: &mut S,
    query: ListQuery<<S::Item as Listed>::Marker>,
) -> Result<Page<S::Item>, S::Error> {
    let mut planner = Planner::new(query);
    while let Some(fetch) = planner.next_fetch().cloned() {
        let rows = source.fetch(planner.prefix(), &fetch).await?;
        planner.feed(rows);
    }
    Ok(planner.finish())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    /// The store's listing over a sorted set, with its cost kept.
    struct Keys(BTreeSet<String>);

    impl Keys {
        fn read(&self, prefix: &str, fetch: &Fetch) -> Vec<String> {
            let from = |k: &&String| match &fetch.start {
                Start::After(a) => k.as_str() > a.as_str(),
                Start::AtLeast(a) => k.as_str() >= a.as_str(),
            };
            self.0.iter().filter(|k| k.starts_with(prefix)).filter(from).take(fetch.limit as usize).cloned().collect()
        }
    }

    impl Source for Keys {
        type Item = String;
        type Error = std::convert::Infallible;
        async fn fetch(&mut self, prefix: &str, fetch: &Fetch) -> Result<Vec<String>, Self::Error> {
            Ok(self.read(prefix, fetch))
        }
    }

    /// Drives the planner synchronously, returning the page and its cost (rows, fetches).
    fn page(keys: &Keys, query: ListQuery) -> (Page<String>, u64, u32) {
        let mut planner = Planner::new(query);
        while let Some(fetch) = planner.next_fetch().cloned() {
            planner.feed(keys.read(planner.prefix(), &fetch));
        }
        let cost = (planner.rows_read(), planner.fetches());
        (planner.finish(), cost.0, cost.1)
    }

    /// The definition, naively: every entry of the listing, in order.
    fn reference(keys: &BTreeSet<String>, prefix: &str, delimiter: Option<&str>) -> Vec<Entry<String>> {
        let mut entries: Vec<Entry<String>> = Vec::new();
        for key in keys.iter().filter(|k| k.starts_with(prefix)) {
            let rest = &key[prefix.len()..];
            let entry = match delimiter.filter(|d| !d.is_empty()).and_then(|d| rest.find(d).map(|i| i + d.len())) {
                Some(end) => Entry::CommonPrefix(key[..prefix.len() + end].to_owned()),
                None => Entry::Object(key.clone()),
            };
            if !entries.contains(&entry) {
                entries.push(entry);
            }
        }
        entries
    }

    fn query(prefix: &str, delimiter: Option<&str>, after: Option<&str>, max_keys: u32) -> ListQuery {
        ListQuery {
            prefix: prefix.to_owned(),
            delimiter: delimiter.map(str::to_owned),
            after: after.map(str::to_owned),
            max_keys,
        }
    }

    fn keys(list: &[&str]) -> Keys {
        Keys(list.iter().map(|k| (*k).to_owned()).collect())
    }

    fn names(page: &Page<String>) -> Vec<&str> {
        page.entries.iter().map(Entry::name).collect()
    }

    #[test]
    fn a_directory_listing_rolls_up_at_the_delimiter() {
        let k = keys(&["a.txt", "dir/x", "dir/y/z", "dir2/q", "photos/2024/a.jpg", "photos/2024/b.jpg", "z"]);
        let (p, _, _) = page(&k, query("", Some("/"), None, 1000));
        assert_eq!(names(&p), ["a.txt", "dir/", "dir2/", "photos/", "z"]);
        assert!(matches!(p.entries[1], Entry::CommonPrefix(_)));
        assert!(!p.is_truncated && p.next_marker().is_none());
        let (p, _, _) = page(&k, query("photos/", Some("/"), None, 1000));
        assert_eq!(names(&p), ["photos/2024/"]);
        let (p, _, _) = page(&k, query("dir/", Some("/"), None, 1000));
        assert_eq!(names(&p), ["dir/x", "dir/y/"]);
    }

    #[test]
    fn a_common_prefix_counts_once_and_continues_past_itself() {
        let k = keys(&["a/1", "a/2", "a/3", "b", "c/1"]);
        let (p, _, _) = page(&k, query("", Some("/"), None, 1));
        assert_eq!((names(&p), p.is_truncated, p.next_marker()), (vec!["a/"], true, Some("a/")));
        let (p, _, _) = page(&k, query("", Some("/"), Some("a/"), 1));
        assert_eq!((names(&p), p.next_marker()), (vec!["b"], Some("b")));
        let (p, _, _) = page(&k, query("", Some("/"), Some("b"), 1));
        assert_eq!((names(&p), p.is_truncated), (vec!["c/"], false));
    }

    #[test]
    fn a_marker_inside_a_common_prefix_skips_it_whole() {
        let k = keys(&["a/1", "a/2", "b"]);
        let (p, _, _) = page(&k, query("", Some("/"), Some("a/1"), 10));
        assert_eq!(names(&p), ["b"]);
        let (p, _, _) = page(&k, query("", None, Some("a/1"), 10));
        assert_eq!(names(&p), ["a/2", "b"]);
    }

    #[test]
    fn markers_outside_the_prefix() {
        let k = keys(&["a", "b/1", "b/2", "c"]);
        let (p, _, fetches) = page(&k, query("b/", None, Some("a"), 10));
        assert_eq!((names(&p), fetches), (vec!["b/1", "b/2"], 1), "a marker below the prefix starts at it");
        let (p, _, fetches) = page(&k, query("b/", None, Some("b0"), 10));
        assert_eq!((names(&p).len(), fetches), (0, 0), "a marker above the prefix reads nothing");
    }

    #[test]
    fn zero_max_keys_reads_nothing_and_is_not_truncated() {
        let (p, rows, fetches) = page(&keys(&["a", "b"]), query("", None, None, 0));
        assert_eq!((p.entries.len(), p.is_truncated, rows, fetches), (0, false, 0, 0));
    }

    #[test]
    fn an_empty_delimiter_is_none() {
        let (p, _, _) = page(&keys(&["a/b", "c"]), query("", Some(""), None, 10));
        assert_eq!(names(&p), ["a/b", "c"]);
    }

    #[test]
    fn multi_character_and_non_ascii_delimiters() {
        let k = keys(&["x--y--z", "x-y", "é→a→b", "é→c"]);
        assert_eq!(names(&page(&k, query("", Some("--"), None, 10)).0), ["x--", "x-y", "é→a→b", "é→c"]);
        assert_eq!(names(&page(&k, query("é", Some("→"), None, 10)).0), ["é→"]);
    }

    #[test]
    fn a_huge_common_prefix_costs_a_seek_not_a_scan() {
        let mut set: BTreeSet<String> = (0..20_000).map(|i| format!("big/{i:05}")).collect();
        set.extend((0..50).map(|i| format!("small{i:02}")));
        let k = Keys(set);
        let (p, rows, fetches) = page(&k, query("", Some("/"), None, 10));
        assert_eq!(names(&p)[..3], ["big/", "small00", "small01"]);
        assert!(p.is_truncated);
        assert!(rows <= 11 * 11 && fetches <= 12, "rows {rows}, fetches {fetches}");
        // The whole listing with one key per page never reads through big/.
        let mut after = None::<String>;
        let (mut total_rows, mut pages) = (0, 0);
        // Bounded, so that a listing that does not move on fails instead of hanging.
        while pages < 60 {
            let (p, rows, _) = page(&k, query("", Some("/"), after.as_deref(), 1));
            (total_rows, pages) = (total_rows + rows, pages + 1);
            if !p.is_truncated {
                break;
            }
            after = p.next_marker().map(str::to_owned);
        }
        assert_eq!(pages, 51, "one page per entry");
        assert!(total_rows < 51 * 22, "{total_rows} rows for 51 pages");
    }

    #[tokio::test]
    async fn the_async_driver_lists_the_same_page() {
        let mut k = keys(&["a/1", "a/2", "b", "c/1", "d"]);
        let want = page(&k, query("", Some("/"), None, 3)).0;
        assert_eq!(list_page(&mut k, query("", Some("/"), None, 3)).await.unwrap(), want);
    }

    fn key_strategy() -> impl Strategy<Value = String> {
        // A small alphabet with the delimiters in it, so that keys share prefixes and roll up often.
        proptest::string::string_regex("[ab/é-]{0,6}").unwrap()
    }

    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
    struct Up(String, String);

    impl Keyed for Up {
        fn key(&self) -> &str {
            &self.0
        }
    }

    impl Listed for Up {
        type Marker = UploadMarker;
        fn marker(&self) -> UploadMarker {
            UploadMarker { key: self.0.clone(), upload_id: Some(self.1.clone()) }
        }
    }

    /// The store's upload listing over a sorted set of (key, upload id).
    fn read_uploads(set: &BTreeSet<Up>, prefix: &str, fetch: &Fetch<UploadMarker>) -> Vec<Up> {
        let from = |u: &&Up| match &fetch.start {
            Start::After(UploadMarker { key, upload_id: None }) => u.0.as_str() > key.as_str(),
            Start::After(UploadMarker { key, upload_id: Some(id) }) => {
                (u.0.as_str(), u.1.as_str()) > (key.as_str(), id.as_str())
            }
            Start::AtLeast(k) => u.0.as_str() >= k.as_str(),
        };
        set.iter().filter(|u| u.0.starts_with(prefix)).filter(from).take(fetch.limit as usize).cloned().collect()
    }

    fn uploads_page(set: &BTreeSet<Up>, query: ListQuery<UploadMarker>) -> Page<Up> {
        let mut planner = Planner::new(query);
        let mut fetches = 0;
        while let Some(fetch) = planner.next_fetch().cloned() {
            fetches += 1;
            assert!(fetches < 1000, "the planner moves on");
            planner.feed(read_uploads(set, planner.prefix(), &fetch));
        }
        planner.finish()
    }

    fn uploads_query(
        prefix: &str,
        delimiter: Option<&str>,
        markers: Option<(&str, Option<&str>)>,
        max: u32,
    ) -> ListQuery<UploadMarker> {
        ListQuery {
            prefix: prefix.into(),
            delimiter: delimiter.map(str::to_owned),
            after: UploadMarker::of_request(markers.map(|m| m.0), markers.and_then(|m| m.1)),
            max_keys: max,
        }
    }

    /// `NextKeyMarker` and `NextUploadIdMarker`.
    fn next_markers(page: &Page<Up>) -> Option<(String, Option<String>)> {
        page.next_marker().map(|key| (key.to_owned(), page.next_upload_id_marker()))
    }

    fn ups(list: &[(&str, &str)]) -> BTreeSet<Up> {
        list.iter().map(|(k, id)| Up((*k).into(), (*id).into())).collect()
    }

    fn upload_names(page: &Page<Up>) -> Vec<String> {
        let name = |e: &Entry<Up>| match e {
            Entry::Object(u) => format!("{}#{}", u.0, u.1),
            Entry::CommonPrefix(p) => p.clone(),
        };
        page.entries.iter().map(name).collect()
    }

    #[test]
    fn uploads_of_one_key_continue_across_pages_by_upload_id() {
        let set = ups(&[("a", "1"), ("a", "2"), ("a", "3"), ("b", "1")]);
        let p = uploads_page(&set, uploads_query("", None, None, 2));
        assert_eq!(
            (upload_names(&p), next_markers(&p)),
            (vec!["a#1".into(), "a#2".into()], Some(("a".into(), Some("2".into()))))
        );
        let p = uploads_page(&set, uploads_query("", None, Some(("a", Some("2"))), 2));
        assert_eq!((upload_names(&p), p.is_truncated), (vec!["a#3".into(), "b#1".into()], false));
        let p = uploads_page(&set, uploads_query("", None, Some(("a", None)), 10));
        assert_eq!(upload_names(&p), ["b#1"], "a key marker alone skips every upload of that key");
    }

    #[test]
    fn uploads_roll_up_at_the_delimiter_and_continue_past_the_common_prefix() {
        let set = ups(&[("dir/x", "1"), ("dir/y", "1"), ("dir/y", "2"), ("file", "1"), ("z/1", "1")]);
        let p = uploads_page(&set, uploads_query("", Some("/"), None, 1));
        assert_eq!((upload_names(&p), next_markers(&p)), (vec!["dir/".into()], Some(("dir/".into(), None))));
        let p = uploads_page(&set, uploads_query("", Some("/"), Some(("dir/", None)), 5));
        assert_eq!(upload_names(&p), ["file#1", "z/"]);
        let p = uploads_page(&set, uploads_query("dir/", Some("/"), None, 5));
        assert_eq!(upload_names(&p), ["dir/x#1", "dir/y#1", "dir/y#2"]);
        let p = uploads_page(&set, uploads_query("", Some("/"), Some(("dir/x", Some("1"))), 5));
        assert_eq!(upload_names(&p), ["file#1", "z/"], "a marker inside a common prefix skips it whole");
        assert!(uploads_page(&set, uploads_query("", None, None, 0)).entries.is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Pages of uploads, each continued from the previous one's next markers, concatenate to the reference:
        /// every upload under the prefix in (key, id) order, rolled up at the delimiter.
        #[test]
        fn upload_pages_concatenate_to_the_reference(
            set in proptest::collection::btree_set(
                // Keys are never empty (1 to 1024 bytes), nor are upload ids.
                (proptest::string::string_regex("[ab/é-]{1,6}").unwrap(), proptest::sample::select(vec!["1", "2", "3"]))
                    .prop_map(|(k, id)| Up(k, id.into())),
                0..40,
            ),
            prefix in proptest::string::string_regex("[ab/]{0,2}").unwrap(),
            delimiter in proptest::option::of(proptest::sample::select(vec!["/", "a", "b/", "é", ""])),
            max in 1u32..6,
        ) {
            let mut want: Vec<String> = Vec::new();
            for u in set.iter().filter(|u| u.0.starts_with(&prefix)) {
                let name = match common_prefix(&prefix, delimiter.filter(|d| !d.is_empty()), &u.0) {
                    Some(common) => common,
                    None => format!("{}#{}", u.0, u.1),
                };
                if !want.contains(&name) {
                    want.push(name);
                }
            }
            let (mut got, mut markers) = (Vec::new(), None::<(String, Option<String>)>);
            for _ in 0..=set.len() + 1 {
                let m = markers.as_ref().map(|(k, id)| (k.as_str(), id.as_deref()));
                let p = uploads_page(&set, uploads_query(&prefix, delimiter, m, max));
                prop_assert!(p.entries.len() <= max as usize);
                got.extend(upload_names(&p));
                markers = next_markers(&p);
                if markers.is_none() {
                    break;
                }
            }
            prop_assert!(markers.is_none(), "the listing ended");
            prop_assert_eq!(got, want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Concatenated pages are the reference listing, whatever the keys, prefix, delimiter and page size; each
        /// page is within its cost bound.
        #[test]
        fn pages_concatenate_to_the_reference(
            set in proptest::collection::btree_set(key_strategy(), 0..60),
            prefix in proptest::string::string_regex("[ab/]{0,2}").unwrap(),
            delimiter in proptest::option::of(proptest::sample::select(vec!["/", "a", "b/", "é", "-", ""])),
            max_keys in 1u32..8,
            start_after in proptest::option::of(key_strategy()),
        ) {
            let k = Keys(set.clone());
            let mut want = reference(&set, &prefix, delimiter);
            if let Some(a) = &start_after {
                want.retain(|e| e.name() > a.as_str());
            }
            let mut got = Vec::new();
            let mut after = start_after.clone();
            for _ in 0..=set.len() + 1 {
                let (p, rows, fetches) = page(&k, query(&prefix, delimiter, after.as_deref(), max_keys));
                prop_assert!(p.entries.len() <= max_keys as usize);
                prop_assert!(rows <= 11 * u64::from(max_keys + 1), "rows {}", rows);
                prop_assert!(fetches <= max_keys + 2, "fetches {}", fetches);
                prop_assert_eq!(p.next_marker().is_some(), p.is_truncated);
                if p.is_truncated {
                    prop_assert_eq!(p.entries.len(), max_keys as usize, "a truncated page is full");
                }
                after = p.next_marker().map(str::to_owned);
                got.extend(p.entries);
                if after.is_none() {
                    break;
                }
            }
            prop_assert!(after.is_none(), "the listing ended");
            prop_assert_eq!(got, want);
        }
    }
}
