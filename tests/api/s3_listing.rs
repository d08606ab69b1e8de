//! The S3 listing planner over the real store (SQLite's and PostgreSQL's key order, `list_objects_page` and
//! `list_objects_page_from`): pages followed by their continuation tokens concatenate to the naive listing, for
//! keys with non-ASCII characters and the characters `encoding-type=url` exists for, and a page never reads
//! through a large common prefix. No server: the store is opened in this process.

use std::collections::BTreeSet;
use std::time::Duration;

use blobgate::config::DatabaseUrl;
use blobgate::names::{BucketName, ObjectAttrs, ObjectKey};
use blobgate::s3::listing::{Entry, Fetch, ListQuery, Listed, Page, Source, Start, list_page};
use blobgate::s3::request::{ListParams, ListVersion, continuation_token, decode_continuation_token};
use blobgate::store::{Metadata, MetadataError, ObjectRecord, Store};

use crate::helpers::both_backends;

/// The store's keyset listing as the planner's source, counting the rows it returns.
struct StoreSource {
    meta: Metadata,
    bucket_id: i64,
    rows: u64,
}

impl blobgate::s3::listing::Keyed for Row {
    fn key(&self) -> &str {
        &self.0.key
    }
}

impl Listed for Row {
    type Marker = String;
    fn marker(&self) -> String {
        self.0.key.clone()
    }
}

struct Row(ObjectRecord);

impl Source for StoreSource {
    type Item = Row;
    type Error = MetadataError;
    async fn fetch(&mut self, prefix: &str, fetch: &Fetch) -> Result<Vec<Row>, MetadataError> {
        let rows = match &fetch.start {
            Start::After(key) => self.meta.list_objects_page(self.bucket_id, prefix, Some(key), fetch.limit).await?,
            Start::AtLeast(key) => self.meta.list_objects_page_from(self.bucket_id, prefix, key, fetch.limit).await?,
        };
        self.rows += rows.len() as u64;
        Ok(rows.into_iter().map(Row).collect())
    }
}

fn reference(keys: &BTreeSet<String>, prefix: &str, delimiter: Option<&str>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for key in keys.iter().filter(|k| k.starts_with(prefix)) {
        let rest = &key[prefix.len()..];
        let name = match delimiter.and_then(|d| rest.find(d).map(|i| i + d.len())) {
            Some(end) => key[..prefix.len() + end].to_owned(),
            None => key.clone(),
        };
        if names.last() != Some(&name) {
            names.push(name);
        }
    }
    names
}

fn names(page: &Page<Row>) -> Vec<String> {
    page.entries.iter().map(|e| e.name().to_owned()).collect()
}

// On PostgreSQL keys are `COLLATE "C"`: the same byte order as SQLite's, so the same pages.
both_backends!(continuation_tokens_walk_the_store_in_s3_order, |env| {
    let url = match &env.database_url {
        Some(url) => DatabaseUrl::parse(url).unwrap(),
        None => DatabaseUrl::in_data_dir(env.dir.path()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(walk_in_s3_order(env.dir.path(), url));
});

async fn walk_in_s3_order(data_dir: &std::path::Path, url: DatabaseUrl) {
    let store = Store::open(data_dir, &url, Duration::from_secs(5)).await.unwrap();
    let bucket = store.meta.create_bucket(&BucketName::parse("bkt").unwrap(), false, 0).await.unwrap();
    let mut keys: BTreeSet<String> = (0..3000).map(|i| format!("logs/2024/{i:05}.txt")).collect();
    for k in [
        "a b+c%d.txt",
        "a/é/1",
        "a/é/2",
        "a/ê",
        "a/z",
        "a0",
        "b/日本/x",
        "b/日本語",
        "b/🎉/y",
        "b/\u{10FFFF}",
        "logs/2023/x",
        "logs/2025",
        "z",
    ] {
        keys.insert(k.to_owned());
    }
    let mut tx = store.meta.begin_write().await.unwrap();
    for key in &keys {
        let key = ObjectKey::parse(key).unwrap();
        tx.upsert_object(bucket.id, &key, &"0".repeat(64), 1, &ObjectAttrs::default(), 0).await.unwrap();
    }
    tx.commit().await.unwrap();

    for (prefix, delimiter, max_keys) in [
        ("", Some("/"), 1u32),
        ("", Some("/"), 2),
        ("", None, 1000),
        ("a/", Some("/"), 1),
        ("b/", Some("/"), 2),
        ("b/", Some("本"), 1),
        ("logs/", Some("/"), 1),
        ("logs/2024/", Some("/"), 700),
        ("", Some("."), 3),
    ] {
        let want = reference(&keys, prefix, delimiter);
        let mut got = Vec::new();
        let mut token = None::<String>;
        for _ in 0..=keys.len() {
            let mut query = format!("list-type=2&max-keys={max_keys}&prefix={}", blobgate::s3::url_encode(prefix));
            if let Some(d) = delimiter {
                query.push_str(&format!("&delimiter={}", blobgate::s3::url_encode(d)));
            }
            if let Some(t) = &token {
                query.push_str(&format!("&continuation-token={t}"));
            }
            let params = ListParams::from_query(ListVersion::V2, &query).unwrap();
            let mut source = StoreSource { meta: store.meta.clone(), bucket_id: bucket.id, rows: 0 };
            let page = list_page(&mut source, params.query()).await.unwrap();
            assert!(
                source.rows <= 11 * (u64::from(max_keys) + 1),
                "{prefix:?} {delimiter:?}: a page of {max_keys} read {} rows",
                source.rows
            );
            got.extend(names(&page));
            token = page.next_marker().map(continuation_token);
            if let Some(t) = &token {
                assert_eq!(Some(decode_continuation_token(t).unwrap().as_str()), page.next_marker());
            } else {
                break;
            }
        }
        assert!(token.is_none(), "{prefix:?} {delimiter:?}: the listing ended");
        assert_eq!(got, want, "{prefix:?} {delimiter:?} by {max_keys}");
    }

    // The first page of the root with "/" lists logs/ once and reads about a page of rows, not its 3000 keys.
    let mut source = StoreSource { meta: store.meta.clone(), bucket_id: bucket.id, rows: 0 };
    let query = ListQuery { prefix: String::new(), delimiter: Some("/".into()), after: None, max_keys: 1000 };
    let page = list_page(&mut source, query).await.unwrap();
    assert_eq!(names(&page), ["a b+c%d.txt", "a/", "a0", "b/", "logs/", "z"]);
    assert!(matches!(page.entries[4], Entry::CommonPrefix(_)));
    assert!(source.rows < 1100, "read {} rows", source.rows);
}
