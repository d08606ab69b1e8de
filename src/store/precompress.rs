//! Precompressed variants: which content types get them, and making them (brotli and gzip at their highest
//! levels: a variant is compressed once and sent many times). A variant is kept only when it is smaller.
//!
//! This reads object bytes in our process, which is fine here: it runs in `put`/`import`, never on the data path.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use anyhow::Context;

use super::{BlobStore, BlobWriter, StagedBlob, StagedVariant};
use crate::header_values::content_coding::ContentCoding;

/// brotli's highest quality and its default window (what every brotli decoder supports).
const BROTLI_QUALITY: u32 = 11;
const BROTLI_WINDOW_BITS: u32 = 22;
const CHUNK: usize = 64 * 1024;

/// True for content types worth compressing: text, and the application types that are text or compress like it
/// (scripts, JSON, XML, SVG, WebAssembly, fonts without their own compression). Parameters (`; charset=…`) and
/// case do not matter. Images, audio, video, archives and woff/woff2 are already compressed.
pub fn is_text_like(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let Some((kind, subtype)) = essence.split_once('/') else { return false };
    if kind == "text" {
        return true;
    }
    let suffix_text = subtype.ends_with("+json") || subtype.ends_with("+xml");
    match kind {
        "application" => {
            suffix_text
                || matches!(
                    subtype,
                    "javascript"
                        | "x-javascript"
                        | "ecmascript"
                        | "json"
                        | "ld+json"
                        | "manifest+json"
                        | "xml"
                        | "wasm"
                        | "x-sh"
                        | "toml"
                        | "yaml"
                        | "x-yaml"
                        | "graphql"
                        | "sql"
                        | "vnd.ms-fontobject"
                        | "x-font-ttf"
                        | "x-font-otf"
                )
        }
        "image" => matches!(subtype, "svg+xml" | "x-icon" | "vnd.microsoft.icon" | "bmp"),
        "font" => matches!(subtype, "ttf" | "otf" | "collection"),
        _ => false,
    }
}

/// Stages a br and a gzip variant of the file at `source` (`size` bytes), keeping each only if it is smaller.
pub fn compress_file(blobs: &BlobStore, source: &Path, size: u64) -> anyhow::Result<Vec<StagedVariant>> {
    let mut variants = Vec::new();
    for coding in [ContentCoding::Br, ContentCoding::Gzip] {
        let mut input = File::open(source).with_context(|| format!("cannot open {}", source.display()))?;
        let blob =
            compress(blobs, coding, &mut input).with_context(|| format!("cannot compress {}", source.display()))?;
        if blob.size < size {
            variants.push(StagedVariant { coding, blob });
        }
    }
    Ok(variants)
}

/// The coding a sidecar file's name gives it (`app.js.br`, `app.js.gz`) and the name of the file it is a variant
/// of, or `None` for any other name.
pub fn sidecar_of(name: &str) -> Option<(ContentCoding, &str)> {
    if let Some(base) = name.strip_suffix(".br") {
        return (!base.is_empty()).then_some((ContentCoding::Br, base));
    }
    let base = name.strip_suffix(".gz")?;
    (!base.is_empty()).then_some((ContentCoding::Gzip, base))
}

/// True when the file at `sidecar` decodes (as `coding`) to content whose SHA-256 is `expected_sha256`: a stale
/// or foreign sidecar must never be served as the object.
pub fn sidecar_decodes_to(sidecar: &Path, coding: ContentCoding, expected_sha256: &str) -> anyhow::Result<bool> {
    use sha2::Digest;
    let file = File::open(sidecar).with_context(|| format!("cannot open {}", sidecar.display()))?;
    let mut hasher = sha2::Sha256::new();
    let decoded = match coding {
        ContentCoding::Br => io::copy(&mut brotli::Decompressor::new(file, CHUNK), &mut hasher),
        ContentCoding::Gzip => io::copy(&mut flate2::read::GzDecoder::new(file), &mut hasher),
        ContentCoding::Identity => io::copy(&mut { file }, &mut hasher),
    };
    Ok(decoded.is_ok() && hex::encode(hasher.finalize()) == expected_sha256)
}

/// Compresses `input` in `coding` into a staged blob.
pub fn compress(blobs: &BlobStore, coding: ContentCoding, input: &mut impl Read) -> io::Result<StagedBlob> {
    let sink = BlobSink(blobs.writer()?);
    let sink = match coding {
        ContentCoding::Br => {
            let mut encoder = brotli::CompressorWriter::new(sink, CHUNK, BROTLI_QUALITY, BROTLI_WINDOW_BITS);
            io::copy(input, &mut encoder)?;
            encoder.flush()?;
            encoder.into_inner()
        }
        ContentCoding::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(sink, flate2::Compression::best());
            io::copy(input, &mut encoder)?;
            encoder.finish()?
        }
        ContentCoding::Identity => {
            let mut sink = sink;
            io::copy(input, &mut sink)?;
            sink
        }
    };
    sink.0.finish()
}

/// A `Write` over a blob writer, for the encoders.
struct BlobSink(BlobWriter);

impl Write for BlobSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_names() {
        assert_eq!(sidecar_of("app.js.br"), Some((ContentCoding::Br, "app.js")));
        assert_eq!(sidecar_of("a/b.css.gz"), Some((ContentCoding::Gzip, "a/b.css")));
        assert_eq!(sidecar_of(".gz"), None);
        assert_eq!(sidecar_of("app.js"), None);
        assert_eq!(sidecar_of("app.tgz"), None);
    }

    #[test]
    fn text_like_types() {
        for t in [
            "text/html",
            "text/css; charset=utf-8",
            "TEXT/Plain",
            "application/javascript",
            "application/json",
            "application/ld+json",
            "application/vnd.api+json",
            "application/xml",
            "application/atom+xml",
            "image/svg+xml",
            "application/wasm",
            "font/ttf",
        ] {
            assert!(is_text_like(t), "{t}");
        }
        for t in
            ["image/png", "image/jpeg", "video/mp4", "application/gzip", "application/zip", "font/woff2", "", "text"]
        {
            assert!(!is_text_like(t), "{t}");
        }
    }

    #[test]
    fn variants_decode_to_the_original_and_only_smaller_ones_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = BlobStore::open(dir.path()).unwrap();
        let text = "function hello() { return 'hello, world'; }\n".repeat(200);
        let source = dir.path().join("app.js");
        std::fs::write(&source, &text).unwrap();
        let variants = compress_file(&blobs, &source, text.len() as u64).unwrap();
        let codings: Vec<_> = variants.iter().map(|v| v.coding).collect();
        assert_eq!(codings, [ContentCoding::Br, ContentCoding::Gzip]);
        for v in &variants {
            blobs.install(&v.blob).unwrap();
            let encoded = std::fs::read(blobs.path_of(&v.blob.sha256)).unwrap();
            assert_eq!(encoded.len() as u64, v.blob.size);
            assert!(v.blob.size < text.len() as u64 / 10, "{:?} is {} bytes", v.coding, v.blob.size);
            let mut decoded = String::new();
            match v.coding {
                ContentCoding::Br => brotli::Decompressor::new(&encoded[..], CHUNK).read_to_string(&mut decoded),
                _ => flate2::read::GzDecoder::new(&encoded[..]).read_to_string(&mut decoded),
            }
            .unwrap();
            assert_eq!(decoded, text, "{:?}", v.coding);
        }
        let br = &variants[0].blob;
        let sidecar = dir.path().join("app.js.br");
        std::fs::copy(blobs.path_of(&br.sha256), &sidecar).unwrap();
        let plain_sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()));
        assert!(sidecar_decodes_to(&sidecar, ContentCoding::Br, &plain_sha).unwrap());
        assert!(!sidecar_decodes_to(&sidecar, ContentCoding::Br, &"0".repeat(64)).unwrap(), "another content");
        assert!(!sidecar_decodes_to(&sidecar, ContentCoding::Gzip, &plain_sha).unwrap(), "not gzip");
        // Two bytes never compress smaller: no variant.
        std::fs::write(&source, b"ab").unwrap();
        assert!(compress_file(&blobs, &source, 2).unwrap().is_empty());
    }
}
