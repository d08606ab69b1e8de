//! The layer table of ARCHITECTURE.md, made executable: every `crate::…` path (and every `super::…` path that
//! leaves its top-level module) in every file under `src/`, tests included, must be an edge the table allows.
//! Needs no server: it reads files only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Files that only declare or start the crate (`lib.rs` names every module, `main.rs` is outside the library).
const NOT_A_MODULE: [&str; 2] = ["lib.rs", "main.rs"];

struct Layer {
    rank: u32,
    may_use: BTreeSet<String>,
}

/// The rows of the `## Layers` table: module → (layer, modules it may use).
fn layer_table(markdown: &str) -> BTreeMap<String, Layer> {
    let section = markdown.split("\n## Layers\n").nth(1).expect("ARCHITECTURE.md has a `## Layers` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let backticked = |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
    let mut table = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [rank, module, may_use] = cells[..] else { continue };
        let Ok(rank) = rank.parse::<u32>() else { continue };
        let [module] = &backticked(module)[..] else { panic!("one module per row: {line}") };
        let may_use = backticked(may_use).into_iter().collect();
        assert!(table.insert(module.clone(), Layer { rank, may_use }).is_none(), "{module} has two rows");
    }
    assert!(!table.is_empty(), "the `## Layers` section of ARCHITECTURE.md has no table rows");
    table
}

/// Replaces comments and the contents of string and char literals with spaces, keeping line breaks, so that only
/// code is searched and line numbers stay right.
fn code_only(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank =
        |out: &mut Vec<u8>, bytes: &[u8]| out.extend(bytes.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }));
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let end = if rest.starts_with(b"//") {
            i + rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, i);
            loop {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else if j + 1 >= b.len() {
                    break b.len();
                } else {
                    j += 1;
                }
            }
        } else if rest.starts_with(b"r#") || rest.starts_with(b"r\"") || rest.starts_with(b"br") {
            let start = if rest.starts_with(b"br") { i + 2 } else { i + 1 };
            let hashes = b[start..].iter().take_while(|&&c| c == b'#').count();
            if b.get(start + hashes) != Some(&b'"') || (i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
            {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = start + hashes + 1;
            body + b[body..].windows(close.len()).position(|w| w == close).map_or(b.len() - body, |p| p + close.len())
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        } else if rest[0] == b'\'' {
            // A char literal ('a', '\n', '\'', '\u{..}'), or a lifetime ('a), which is code.
            let close = if rest.get(1) == Some(&b'\\') {
                rest.iter().skip(3).position(|&c| c == b'\'').map(|p| p + 4)
            } else {
                let width = source[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + width) == Some(&b'\'')).then_some(width + 2)
            };
            match close {
                Some(len) => i + len,
                None => {
                    out.push(b[i]);
                    i += 1;
                    continue;
                }
            }
        } else {
            out.push(b[i]);
            i += 1;
            continue;
        };
        blank(&mut out, &b[i..end]);
        i = end;
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// One use of another top-level module: the line it is on and the module it names.
#[derive(Debug)]
struct Edge {
    line: usize,
    to: String,
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let n = s.bytes().take_while(|&c| is_ident(c)).count();
    &s[..n]
}

/// The first segment of every item of a `{…}` use group starting at `s` (just after the `{`).
fn group_heads(s: &str) -> Vec<String> {
    let (mut depth, mut heads, mut at_item) = (0usize, Vec::new(), true);
    for (k, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item = true,
            c if at_item && (c.is_ascii_alphabetic() || c == '_') => {
                heads.push(ident(&s[k..]).to_owned());
                at_item = false;
            }
            c if at_item && !c.is_whitespace() => at_item = false,
            _ => {}
        }
    }
    heads
}

/// Every top-level module that `code` (one file, comments and strings blanked) names by a path. `depth` is how many
/// `super::` lead from this file to the crate root (1 for `src/x.rs` and `src/x/mod.rs`, 2 for `src/x/y.rs`).
fn edges(code: &str, depth: usize) -> Vec<Edge> {
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut push = |at: usize, after: &str| {
        let targets = match after.strip_prefix('{') {
            Some(group) => group_heads(group),
            None => vec![ident(after).to_owned()],
        };
        for to in targets.into_iter().filter(|t| !t.is_empty() && t != "self") {
            found.push(Edge { line: line_of(at), to });
        }
    };
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b'$') {
            continue;
        }
        push(at, code[at + "crate::".len()..].trim_start());
    }
    // `super::super::x` from `src/a/b.rs` is the crate root's `x`; a `super` inside an inline `mod tests` counts
    // one level too many here, which can only make a path look like it leaves the module when it does not: it is
    // then checked like any other (a test naming another module must be allowed to).
    let chain = "super::".repeat(depth);
    for (at, _) in code.match_indices(&chain) {
        if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
            continue;
        }
        let after = &code[at + chain.len()..];
        if after.starts_with("super::") {
            continue;
        }
        push(at, after.trim_start());
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every violation of `table` in the crate under `src`, one line each.
fn violations(src: &Path, table: &BTreeMap<String, Layer>) -> Vec<String> {
    let mut problems = Vec::new();
    // The table itself must point one way.
    for (module, layer) in table {
        for used in &layer.may_use {
            match table.get(used) {
                None => problems.push(format!("ARCHITECTURE.md: {module} may use {used}, which has no row")),
                Some(u) if u.rank >= layer.rank => problems.push(format!(
                    "ARCHITECTURE.md: {module} (layer {}) may use {used} (layer {}), which is not below it",
                    layer.rank, u.rank
                )),
                Some(_) => {}
            }
        }
    }
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let top_level = modules_in(src);
    let mut modules = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(src).expect("files are under src");
        let parts: Vec<&str> = relative.iter().map(|p| p.to_str().expect("UTF-8 file names")).collect();
        if parts.len() == 1 && NOT_A_MODULE.contains(&parts[0]) {
            continue;
        }
        let module = parts[0].trim_end_matches(".rs").to_owned();
        modules.insert(module.clone());
        let shown = Path::new("src").join(relative);
        let Some(layer) = table.get(&module) else {
            problems.push(format!("{}: module {module} has no row in the layer table", shown.display()));
            continue;
        };
        let depth = if parts.last() == Some(&"mod.rs") { parts.len() - 1 } else { parts.len() };
        let source = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let lines: Vec<&str> = source.lines().collect();
        for edge in edges(&code_only(&source), depth) {
            if edge.to == module || !top_level.contains(&edge.to) || layer.may_use.contains(&edge.to) {
                continue;
            }
            problems.push(format!(
                "{}:{}: {module} -> {} is not in the layer table ({module} may use: {}): {}",
                shown.display(),
                edge.line,
                edge.to,
                if layer.may_use.is_empty() { "nothing".to_owned() } else { join(&layer.may_use) },
                lines.get(edge.line - 1).map_or("", |l| l.trim())
            ));
        }
    }
    for module in table.keys().filter(|m| !modules.contains(*m)) {
        problems.push(format!("ARCHITECTURE.md: {module} has a row but no file under src/"));
    }
    problems
}

fn join(set: &BTreeSet<String>) -> String {
    set.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

/// The crate's top-level modules: `src/x.rs` and `src/x/`.
fn modules_in(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .expect("src/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
        .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(str::to_owned))
        .filter(|m| m != "lib" && m != "main")
        .collect()
}

/// `BLOBGATE_ARCHITECTURE_SRC` checks another `src/` against this table (an old checkout, say), without
/// rebuilding anything.
#[test]
fn every_use_follows_the_layer_table() {
    let markdown = std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let table = layer_table(&markdown);
    let src = std::env::var_os("BLOBGATE_ARCHITECTURE_SRC").map_or_else(|| Path::new(ROOT).join("src"), PathBuf::from);
    let problems = violations(&src, &table);
    assert!(problems.is_empty(), "{} layer violations:\n{}", problems.len(), problems.join("\n"));
}

/// The checker itself: paths in groups, `super` chains, and paths only in comments or strings.
#[test]
fn the_checker_finds_paths_and_ignores_comments_and_strings() {
    let code = code_only(
        "use crate::{names::BucketName, store::{self, Store}};\n\
         // use crate::http::x;\n\
         let s = \"crate::driver\"; let c = '\"'; let r = r#\"crate::cli\"#;\n\
         fn f<'a>(x: &'a str) { crate::metrics::auth_failure(\"x\"); }\n\
         /* crate::catalog /* nested */ crate::auth */ use super::super::config::Settings;\n\
         use super::sibling;\n",
    );
    let found: Vec<(usize, String)> = edges(&code, 2).into_iter().map(|e| (e.line, e.to)).collect();
    let want = [(1, "names"), (1, "store"), (4, "metrics"), (5, "config")].map(|(l, m)| (l, m.to_owned()));
    assert_eq!(found, want);
}
