//! Buckets and objects: `bucket set`/`list` output, `ls`, `put` and `import` helpers.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::rfc3339;
use crate::header_values::content_coding::ContentCoding;
use crate::names::{BucketName, IndexDocument, ObjectKey, parse_attrs};
use crate::store::{
    Bucket, BucketChanges, ObjectRecord, PutReport, PutStatus, StagedBlob, StagedVariant, Store,
    effective_content_type, precompress, unix_now,
};

/// `bucket create NAME [--public]`: the new bucket.
pub async fn create_bucket(store: &Store, name: &str, public: bool) -> anyhow::Result<Bucket> {
    Ok(store.meta.create_bucket(&BucketName::parse(name)?, public, unix_now()).await?)
}

/// `put`: stages the file (with its variants under `--precompress`) and stores it as the object; what it did.
pub async fn put(store: &Store, args: super::PutArgs) -> anyhow::Result<PutReport> {
    let super::PutArgs { bucket, key, file, content_type, cache_control, content_disposition, precompress } = args;
    let bucket = BucketName::parse(&bucket)?;
    let key = ObjectKey::parse(&key)?;
    let attrs = parse_attrs(content_type, cache_control, content_disposition)?;
    require_regular_file(&file)?;
    require_bucket(store, &bucket).await?;
    warn_if_shared_caching_in_private_bucket(store, &bucket, attrs.cache_control.as_deref()).await?;
    let blobs = store.blobs.clone();
    let source = file.clone();
    let staged = tokio::task::spawn_blocking(move || blobs.stage_file(&source, |_| {})).await??;
    let content_type = effective_content_type(attrs.content_type.as_deref(), key.as_str());
    let variants = stage_variants(store, &file, &staged, &content_type, precompress, Vec::new()).await?;
    Ok(store.put_with_variants(&bucket, &key, staged, attrs, variants).await?)
}

/// A bucket as `bucket list` and `bucket set` print it.
pub(super) fn bucket_json(b: &crate::store::Bucket) -> serde_json::Value {
    serde_json::json!({
        "bucket": b.name, "public": b.public, "cache_control": b.default_cache_control,
        "created_at": rfc3339(b.created_at), "cors": b.cors.as_ref().map(|c| &c.rule),
        "index_document": b.website.index_document.as_ref().map(IndexDocument::as_str),
        "error_document": b.website.error_document.as_ref().map(ObjectKey::as_str),
    })
}

/// `bucket cors set` (`Some`) and `bucket cors clear` (`None`).
pub(super) async fn set_bucket_cors(
    store: &Store,
    name: &str,
    rule: Option<crate::header_values::cors::CorsRule>,
) -> anyhow::Result<()> {
    let name = BucketName::parse(name)?;
    if let Some(rule) = &rule {
        rule.validate()?;
    }
    let bucket = store.meta.set_bucket_cors(&name, rule.as_ref()).await?;
    let bucket = crate::store::require_bucket(bucket, &name)?;
    println!("{}", bucket_json(&bucket));
    Ok(())
}

pub(super) async fn set_bucket(
    store: &Store,
    name: &str,
    public: bool,
    private: bool,
    cache_control: Option<String>,
    (index_document, error_document): super::WebsiteChanges,
) -> anyhow::Result<()> {
    let name = BucketName::parse(name)?;
    let public = match (public, private) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    // `Some(None)`: remove the default; the value is held to the same rules as `put --cache-control`.
    let cache_control = match cache_control {
        None => None,
        Some(v) if v.is_empty() => Some(None),
        Some(v) => Some(parse_attrs(None, Some(v), None)?.cache_control),
    };
    let changes = BucketChanges {
        public,
        default_cache_control: cache_control.as_ref().map(Option::as_deref),
        index_document: index_document.as_ref().map(Option::as_ref),
        error_document: error_document.as_ref().map(Option::as_ref),
    };
    let bucket = store.meta.update_bucket(&name, changes).await?;
    let bucket = crate::store::require_bucket(bucket, &name)?;
    warn_if_shared_caching_in_private_bucket(store, &name, bucket.default_cache_control.as_deref()).await?;
    println!("{}", bucket_json(&bucket));
    Ok(())
}

/// Prints a bucket's objects page by page (keyset pagination in SQL), so memory stays at one page.
pub(super) async fn list_objects(
    store: &Store,
    bucket: &str,
    prefix: &str,
    json: bool,
    page_size: u32,
) -> anyhow::Result<()> {
    let bucket = BucketName::parse(bucket)?;
    let bucket_id = crate::store::require_bucket(store.meta.bucket(&bucket).await?, &bucket)?.id;
    let mut after: Option<String> = None;
    loop {
        let page = store.meta.list_objects_page(bucket_id, prefix, after.as_deref(), page_size).await?;
        // The page's variants in one query (JSON lines name them; the text columns stay as they were).
        let mut codings = match (json, page.first(), page.last()) {
            (true, Some(first), Some(last)) => {
                store.meta.variant_codings_between(bucket_id, &first.key, &last.key).await?.into_iter().peekable()
            }
            _ => Vec::new().into_iter().peekable(),
        };
        let mut text = String::new();
        for object in &page {
            let mut variants = Vec::new();
            while let Some((_, coding)) = codings.next_if(|(key, _)| *key <= object.key) {
                variants.push(coding);
            }
            text.push_str(&object_line(object, json, &variants));
            text.push('\n');
        }
        match std::io::stdout().write_all(text.as_bytes()) {
            // `blobgate ls … | head`: the reader has all it wants.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            other => other?,
        }
        if page.len() < page_size as usize {
            return Ok(());
        }
        after = page.last().map(|o| o.key.clone());
    }
}

/// One `ls` line: tab-separated (keys hold no control characters), or a JSON object naming the codings of its
/// precompressed variants too.
pub(super) fn object_line(o: &ObjectRecord, json: bool, variants: &[String]) -> String {
    let etag = crate::header_values::etag_from_sha256(&o.sha256);
    let content_type = effective_content_type(o.attrs.content_type.as_deref(), &o.key);
    if !json {
        return format!("{}\t{}\t{etag}\t{content_type}\t{}", o.key, o.size, rfc3339(o.updated_at));
    }
    serde_json::json!({
        "key": o.key, "size": o.size, "etag": etag, "sha256": o.sha256, "content_type": content_type,
        "cache_control": o.attrs.cache_control, "content_disposition": o.attrs.content_disposition,
        "created_at": rfc3339(o.created_at), "updated_at": rfc3339(o.updated_at), "variants": variants,
    })
    .to_string()
}

pub(super) fn require_regular_file(path: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    Ok(())
}

pub(super) async fn require_bucket(store: &Store, bucket: &BucketName) -> anyhow::Result<()> {
    crate::store::require_bucket(store.meta.bucket(bucket).await?, bucket)?;
    Ok(())
}

/// A private bucket's responses never let shared caches store them, whatever the stored Cache-Control says: say
/// so (one line on stderr) when the uploader asked for `public` or `s-maxage`, and what will be sent instead.
pub(super) async fn warn_if_shared_caching_in_private_bucket(
    store: &Store,
    bucket: &BucketName,
    cache_control: Option<&str>,
) -> anyhow::Result<()> {
    use crate::catalog::representation::{allows_shared_caching, private_cache_control};
    let Some(value) = cache_control.filter(|v| allows_shared_caching(v)) else { return Ok(()) };
    if store.meta.bucket(bucket).await?.is_some_and(|b| !b.public) {
        let sent = private_cache_control(Some(value));
        eprintln!(
            "blobgate: warning: bucket {bucket} is private, so its objects are served with Cache-Control: {} \
             (shared caches must not keep private objects)",
            sent.to_str().unwrap_or("private")
        );
    }
    Ok(())
}

/// The variants to store with the object staged from `path`: its sidecar files (each only if it decodes to the
/// object's content; otherwise a warning and it is left out) and, with `precompress`, compressed variants of a
/// text-like type for the codings no sidecar gave.
pub(super) async fn stage_variants(
    store: &Store,
    path: &Path,
    staged: &StagedBlob,
    content_type: &str,
    precompress: bool,
    sidecars: Vec<(ContentCoding, PathBuf)>,
) -> anyhow::Result<Vec<StagedVariant>> {
    let (blobs, path, sha, size) = (store.blobs.clone(), path.to_owned(), staged.sha256.clone(), staged.size);
    let text_like = precompress && precompress::is_text_like(content_type);
    tokio::task::spawn_blocking(move || {
        let mut variants = Vec::new();
        for (coding, sidecar) in sidecars {
            if precompress::sidecar_decodes_to(&sidecar, coding, &sha)? {
                variants.push(StagedVariant { coding, blob: blobs.stage_file(&sidecar, |_| {})? });
            } else {
                eprintln!(
                    "blobgate: warning: {} is not {} of {}; not stored",
                    sidecar.display(),
                    coding.token(),
                    path.display()
                );
            }
        }
        if text_like {
            let have: Vec<ContentCoding> = variants.iter().map(|v| v.coding).collect();
            let made = precompress::compress_file(&blobs, &path, size)?;
            variants.extend(made.into_iter().filter(|v| !have.contains(&v.coding)));
        }
        anyhow::Ok(variants)
    })
    .await?
}

/// Imports a directory tree. Every key is checked before anything is stored, so a bad name stores nothing.
/// `x.br`/`x.gz` beside `x` are stored as `x`'s variants, not as objects of their own.
pub(super) async fn import(
    store: &Store,
    bucket: &str,
    dir: &Path,
    prefix: &str,
    precompress: bool,
) -> anyhow::Result<()> {
    let bucket = BucketName::parse(bucket)?;
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    require_bucket(store, &bucket).await?;
    let mut files: Vec<(PathBuf, ObjectKey, u64)> = Vec::new();
    for entry in walkdir::WalkDir::new(dir).follow_links(false).sort_by_file_name() {
        let entry = entry.with_context(|| format!("cannot walk {}", dir.display()))?;
        // Symlinks and special files are skipped: only regular files become objects.
        if !entry.file_type().is_file() {
            continue;
        }
        let relative = entry.path().strip_prefix(dir).expect("walkdir yields paths under its root");
        let relative = relative.to_str().with_context(|| format!("{} is not valid UTF-8", entry.path().display()))?;
        let key = ObjectKey::parse(&format!("{prefix}{}", relative.replace(std::path::MAIN_SEPARATOR, "/")))
            .with_context(|| format!("cannot import {}", entry.path().display()))?;
        let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
        files.push((entry.into_path(), key, size));
    }
    // Sidecars of a file that is imported too are its variants; any other `.br`/`.gz` is an object of its own.
    let names: std::collections::HashSet<String> = files.iter().map(|f| f.1.to_string()).collect();
    let mut sidecars: std::collections::HashMap<String, Vec<(ContentCoding, PathBuf)>> = Default::default();
    files.retain(|(path, key, _)| match precompress::sidecar_of(key.as_str()) {
        Some((coding, base)) if names.contains(base) => {
            sidecars.entry(base.to_owned()).or_default().push((coding, path.clone()));
            false
        }
        _ => true,
    });
    let total: u64 = files.iter().map(|f| f.2).sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let (mut created, mut replaced, mut unchanged) = (0u64, 0u64, 0u64);
    for (path, key, _) in files.iter() {
        bar.set_message(key.to_string());
        let blobs = store.blobs.clone();
        let progress = bar.clone();
        let staged = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || blobs.stage_file(&path, |n| progress.inc(n))).await??
        };
        let content_type = effective_content_type(None, key.as_str());
        let own = sidecars.remove(key.as_str()).unwrap_or_default();
        let variants = stage_variants(store, path, &staged, &content_type, precompress, own).await?;
        match store.put_with_variants(&bucket, key, staged, Default::default(), variants).await?.status {
            PutStatus::Created => created += 1,
            PutStatus::Replaced => replaced += 1,
            PutStatus::Unchanged => unchanged += 1,
        }
    }
    bar.finish_and_clear();
    let summary = serde_json::json!({
        "bucket": bucket.as_str(), "files": files.len(), "bytes": total,
        "created": created, "replaced": replaced, "unchanged": unchanged,
    });
    writeln!(std::io::stdout(), "{summary}")?;
    Ok(())
}
