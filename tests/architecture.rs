//! The layer table of ARCHITECTURE.md, made executable: every `crate::…` path (and every `super::…` path that
//! leaves its top-level module) in every file under `src/`, tests included, must be an edge the table allows, and
//! every edge the table allows must be used. With it, what the docs say about the tree: every path they name
//! exists, `sqlx` stays in `src/store/metadata/`, raw fds stay in the files allowed `unsafe`, and every
//! `blobgate_` series they name is registered in `src/metrics`. And the lists in ARCHITECTURE.md's invariants,
//! against the code outside tests: the files that read blob bytes into memory are the ones listed, so are the files
//! that allow `unsafe` and the files that read the environment, and the files listed as pure do no IO. Each check
//! is also shown failing, on the real tree with one defect injected in memory. Needs no server: it reads files
//! only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Files that only declare or start the crate (`lib.rs` names every module, `main.rs` is outside the library).
const NOT_A_MODULE: [&str; 2] = ["lib.rs", "main.rs"];

struct Layer {
    rank: u32,
    may_use: BTreeSet<String>,
    /// The row's line in ARCHITECTURE.md.
    line: usize,
}

/// The rows of the `## Layers` table: module → (layer, modules it may use).
fn layer_table(markdown: &str) -> BTreeMap<String, Layer> {
    let start = markdown.lines().position(|l| l == "## Layers").expect("ARCHITECTURE.md has a `## Layers` section");
    let backticked = |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_owned).collect() };
    let mut table = BTreeMap::new();
    let section = markdown.lines().enumerate().skip(start + 1).take_while(|(_, l)| !l.starts_with("## "));
    for (index, line) in section.filter(|(_, l)| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [rank, module, may_use] = cells[..] else { continue };
        let Ok(rank) = rank.parse::<u32>() else { continue };
        let [module] = &backticked(module)[..] else { panic!("one module per row: {line}") };
        let may_use = backticked(may_use).into_iter().collect();
        let layer = Layer { rank, may_use, line: index + 1 };
        assert!(table.insert(module.clone(), layer).is_none(), "{module} has two rows");
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

fn files_under(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files_under(&path, keep, out);
        } else if keep(&path) {
            out.push(path);
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// One file under `src/`, read once; the checks work on these, so a test can inject a defect without a copy of
/// the tree.
#[derive(Clone)]
struct Source {
    /// Its path as messages show it: `src/http/mod.rs`.
    shown: String,
    /// Its path under `src/`, one component each.
    parts: Vec<String>,
    text: String,
}

impl Source {
    /// Its top-level module (`http` for `src/http/mod.rs`); `None` for `lib.rs` and `main.rs`.
    fn module(&self) -> Option<String> {
        if self.parts.len() == 1 && NOT_A_MODULE.contains(&self.parts[0].as_str()) {
            return None;
        }
        Some(self.parts[0].trim_end_matches(".rs").to_owned())
    }

    /// How many `super::` lead from this file to the crate root (1 for `src/x.rs` and `src/x/mod.rs`).
    fn depth(&self) -> usize {
        if self.parts.last().is_some_and(|p| p == "mod.rs") { self.parts.len() - 1 } else { self.parts.len() }
    }

    /// Line `n` (from 1), trimmed, for messages.
    fn line(&self, n: usize) -> &str {
        self.text.lines().nth(n - 1).map_or("", str::trim)
    }
}

fn sources(src: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    files_under(src, &|p| p.extension().is_some_and(|e| e == "rs"), &mut files);
    files.sort();
    files
        .iter()
        .map(|file| {
            let relative = file.strip_prefix(src).expect("files are under src");
            let parts = relative.iter().map(|p| p.to_str().expect("UTF-8 file names").to_owned()).collect();
            Source { shown: Path::new("src").join(relative).display().to_string(), parts, text: read(file) }
        })
        .collect()
}

/// `BLOBGATE_ARCHITECTURE_SRC` checks another `src/` against this table (an old checkout, say), without
/// rebuilding anything.
fn src_dir() -> PathBuf {
    std::env::var_os("BLOBGATE_ARCHITECTURE_SRC").map_or_else(|| Path::new(ROOT).join("src"), PathBuf::from)
}

fn architecture_md() -> String {
    read(&Path::new(ROOT).join("ARCHITECTURE.md"))
}

/// The crate's top-level modules: `src/x.rs` and `src/x/`.
fn modules_of(sources: &[Source]) -> BTreeSet<String> {
    sources.iter().filter_map(Source::module).collect()
}

/// The uses of other top-level modules in one file.
fn outgoing(source: &Source, top_level: &BTreeSet<String>) -> Vec<Edge> {
    let module = source.module().unwrap_or_default();
    let mut found = edges(&code_only(&source.text), source.depth());
    found.retain(|e| e.to != module && top_level.contains(&e.to));
    found
}

/// Every violation of `table` in the crate, one line each.
fn violations(sources: &[Source], table: &BTreeMap<String, Layer>) -> Vec<String> {
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
    let top_level = modules_of(sources);
    for source in sources {
        let Some(module) = source.module() else { continue };
        let Some(layer) = table.get(&module) else {
            problems.push(format!("{}: module {module} has no row in the layer table", source.shown));
            continue;
        };
        for edge in outgoing(source, &top_level).into_iter().filter(|e| !layer.may_use.contains(&e.to)) {
            problems.push(format!(
                "{}:{}: {module} -> {} is not in the layer table ({module} may use: {}): {}",
                source.shown,
                edge.line,
                edge.to,
                if layer.may_use.is_empty() { "nothing".to_owned() } else { join(&layer.may_use) },
                source.line(edge.line)
            ));
        }
    }
    for module in table.keys().filter(|m| !top_level.contains(*m)) {
        problems.push(format!("ARCHITECTURE.md: {module} has a row but no file under src/"));
    }
    problems
}

/// Every "may use" entry of the table that no file of the row's module uses: a table that allows more than the
/// code does hides the real shape of the crate.
fn unused_edges(sources: &[Source], table: &BTreeMap<String, Layer>) -> Vec<String> {
    let top_level = modules_of(sources);
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for source in sources {
        let Some(module) = source.module() else { continue };
        used.entry(module).or_default().extend(outgoing(source, &top_level).into_iter().map(|e| e.to));
    }
    let mut problems = Vec::new();
    for (module, layer) in table {
        for entry in layer.may_use.iter().filter(|e| !used.get(module).is_some_and(|u| u.contains(*e))) {
            problems.push(format!(
                "ARCHITECTURE.md:{}: the `{module}` row may use `{entry}`, but no file of {module} names \
                 `crate::{entry}`: remove `{entry}` from the row",
                layer.line
            ));
        }
    }
    problems
}

fn join(set: &BTreeSet<String>) -> String {
    set.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

/// Byte offsets where `word` occurs in `code` as a whole identifier.
fn words<'a>(code: &'a str, word: &'a str) -> impl Iterator<Item = usize> + 'a {
    let b = code.as_bytes();
    code.match_indices(word)
        .map(|(at, _)| at)
        .filter(move |&at| (at == 0 || !is_ident(b[at - 1])) && b.get(at + word.len()).is_none_or(|&c| !is_ident(c)))
}

fn line_at(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// The metadata seam: every query, row type and pool stays behind `store::Metadata`, so `sqlx` or `rusqlite` (a
/// path through it, a `use`, a derive) in code anywhere else is a leak. Comments and strings (a log filter's "sqlx") are
/// not code.
fn stray_sqlx(sources: &[Source]) -> Vec<String> {
    let mut problems = Vec::new();
    for source in sources.iter().filter(|s| !s.shown.starts_with("src/store/metadata/")) {
        let code = code_only(&source.text);
        for crate_name in ["sqlx", "rusqlite"] {
            for at in words(&code, crate_name) {
                let line = line_at(&code, at);
                problems.push(format!(
                    "{}:{line}: {crate_name} outside src/store/metadata/: move this behind `store::Metadata`: {}",
                    source.shown,
                    source.line(line)
                ));
            }
        }
    }
    problems
}

/// The raw-fd vocabulary: std's fd types, traits and methods. A safe wrapper given an owned handle (`nix`'s
/// `impl AsFd` functions called with a `&File`, `socket2::Socket`) is not raw-fd code: the handle keeps the fd
/// open, and no fd number is in our hands. `libc::` *calls* (a lowercase name then `(`) count too; `libc`
/// constants and types (`libc::EMFILE`) do not.
const RAW_FD_WORDS: [&str; 12] = [
    "RawFd",
    "AsRawFd",
    "as_raw_fd",
    "FromRawFd",
    "from_raw_fd",
    "IntoRawFd",
    "into_raw_fd",
    "AsFd",
    "as_fd",
    "BorrowedFd",
    "borrow_raw",
    "OwnedFd",
];

/// The files allowed `unsafe`: `src/lib.rs` denies it, and a file allows it for itself with
/// `#![allow(unsafe_code)]` at its top.
fn unsafe_files(sources: &[Source]) -> BTreeSet<String> {
    sources.iter().filter(|s| code_only(&s.text).contains("#![allow(unsafe_code)]")).map(|s| s.shown.clone()).collect()
}

/// Raw fds only in the files allowed `unsafe`, and that list kept a list of files: the crate root denies
/// `unsafe_code`, and nothing allows it for less than a whole file.
fn stray_raw_fds(sources: &[Source]) -> Vec<String> {
    let allowed = unsafe_files(sources);
    let shown_allowed = join(&allowed);
    let mut problems = Vec::new();
    let lib = sources.iter().find(|s| s.shown == "src/lib.rs").expect("src/lib.rs");
    let lib_code = code_only(&lib.text);
    if !lib_code.contains("#![deny(unsafe_code)]") && !lib_code.contains("#![forbid(unsafe_code)]") {
        problems.push("src/lib.rs: no `#![deny(unsafe_code)]`: without it every module may hold unsafe".to_owned());
    }
    for source in sources {
        let code = code_only(&source.text);
        for attribute in ["allow(unsafe_code)", "expect(unsafe_code)"] {
            for (at, _) in code.match_indices(attribute).filter(|(at, _)| !code[..*at].ends_with("#![")) {
                let line = line_at(&code, at);
                problems.push(format!(
                    "{}:{line}: `unsafe_code` allowed for one item: allow it for the whole file \
                     (`#![allow(unsafe_code)]` at its top), so that the unsafe modules are a list of files: {}",
                    source.shown,
                    source.line(line)
                ));
            }
        }
        if allowed.contains(&source.shown) {
            continue;
        }
        let mut found: Vec<(usize, String)> = Vec::new();
        for word in RAW_FD_WORDS {
            found.extend(words(&code, word).map(|at| (at, format!("`{word}`"))));
        }
        for at in words(&code, "libc") {
            let Some(rest) = code[at + "libc".len()..].strip_prefix("::") else { continue };
            let name = ident(rest);
            let called = rest[name.len()..].trim_start().starts_with('(');
            if called && name.starts_with(|c: char| c.is_ascii_lowercase()) {
                found.push((at, format!("the call `libc::{name}`")));
            }
        }
        found.sort();
        for (at, what) in found {
            let line = line_at(&code, at);
            problems.push(format!(
                "{}:{line}: {what} outside the files allowed unsafe ({shown_allowed}): keep raw fds there and \
                 pass owned handles (`&File`, `&TcpStream`) elsewhere: {}",
                source.shown,
                source.line(line)
            ));
        }
    }
    problems
}

/// A document the checks read: where it is (relative to the repository root) and its text.
#[derive(Clone)]
struct Doc {
    shown: String,
    text: String,
}

/// README.md, ARCHITECTURE.md and every `docs/**/*.md`, those that exist.
fn documents(root: &Path) -> Vec<Doc> {
    let mut paths: Vec<PathBuf> =
        ["ARCHITECTURE.md", "README.md"].iter().map(|p| root.join(p)).filter(|p| p.is_file()).collect();
    if root.join("docs").is_dir() {
        let mut docs = Vec::new();
        files_under(&root.join("docs"), &|p| p.extension().is_some_and(|e| e == "md"), &mut docs);
        docs.sort();
        paths.extend(docs);
    }
    as_docs(root, &paths)
}

fn as_docs(root: &Path, paths: &[PathBuf]) -> Vec<Doc> {
    let doc =
        |p: &PathBuf| Doc { shown: p.strip_prefix(root).expect("under the root").display().to_string(), text: read(p) };
    paths.iter().map(doc).collect()
}

/// Where a document may name a file by its path from the repository root (or, in `docs/`, by `../`).
/// `docs/` counts only for a `.md` file: `docs/index.html` and the like are object keys in examples.
const TREE_ROOTS: [&str; 8] = ["src/", "tests/", "benches/", "scripts/", "migrations/", "deploy/", "config/", "docs/"];

fn is_path_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"_./-".contains(&c)
}

/// What may follow a path: `:12` (a line) or `::Item` (a name in the file).
enum Suffix {
    None,
    Line(usize),
    Item(String),
}

fn suffix(rest: &str) -> Suffix {
    if let Some(item) = rest.strip_prefix("::") {
        let item = ident(item);
        if !item.is_empty() {
            return Suffix::Item(item.to_owned());
        }
    } else if let Some(line) = rest.strip_prefix(':') {
        let digits: String = line.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse() {
            return Suffix::Line(n);
        }
    }
    Suffix::None
}

/// One path a document names: its line, the path from the repository root it resolves to, and what it said.
struct Mention {
    line: usize,
    path: PathBuf,
    suffix: Suffix,
    written: String,
}

/// `a/../b` → `b`; `None` if it leaves the repository.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// The paths a document names:
/// - anywhere in the text, a path from the repository root (`src/…`, `tests/…`, `scripts/…`, … as in
///   `TREE_ROOTS`) not inside a longer path or URL, or one reached by `../` from the document's own folder;
/// - in backticks, a path from `src/` that starts with a module folder (`driver/body.rs`, `auth/sigv4/`);
/// - in backticks, a bare `name.rs`, which must be some file's name (see `stale_paths`).
///
/// A trailing `.` ends the sentence, not the path; `:12` and `::Item` after a path are kept as its suffix.
fn mentions(doc: &Doc, module_dirs: &BTreeSet<String>) -> (Vec<Mention>, Vec<(usize, String, Suffix)>) {
    let doc_dir = Path::new(&doc.shown).parent().unwrap_or(Path::new("")).to_owned();
    let (mut paths, mut bare) = (Vec::new(), Vec::new());
    for (index, line) in doc.text.lines().enumerate() {
        let b = line.as_bytes();
        let take = |start: usize| {
            let end = start + b[start..].iter().take_while(|&&c| is_path_byte(c)).count();
            let path = line[start..end].trim_end_matches('.');
            let rest = if path.len() == end - start { &line[end..] } else { "" };
            (path, suffix(rest))
        };
        for root in TREE_ROOTS {
            for (at, _) in line.match_indices(root) {
                let mut start = at;
                while line[..start].ends_with("../") {
                    start -= 3;
                }
                if start > 0 && is_path_byte(b[start - 1]) {
                    continue;
                }
                let (written, suffix) = take(start);
                if root == "docs/" && !written.ends_with(".md") {
                    continue;
                }
                let Some(path) = normalise(&doc_dir.join(written)) else { continue };
                // Only `../` paths resolve from the document's folder; the others are from the root.
                let path = if start == at { PathBuf::from(written) } else { path };
                paths.push(Mention { line: index + 1, path, suffix, written: written.to_owned() });
            }
        }
        for span in line.split('`').skip(1).step_by(2) {
            let (written, suffix) = {
                let n = span.bytes().take_while(|&c| is_path_byte(c)).count();
                (span[..n].trim_end_matches('.'), suffix(&span[n..]))
            };
            if TREE_ROOTS.iter().any(|r| written.starts_with(r)) {
                continue;
            }
            match written.split_once('/') {
                Some((first, _)) if module_dirs.contains(first) => paths.push(Mention {
                    line: index + 1,
                    path: Path::new("src").join(written),
                    suffix,
                    written: written.to_owned(),
                }),
                None if written.ends_with(".rs") && written.len() > 3 => {
                    bare.push((index + 1, written.to_owned(), suffix));
                }
                _ => {}
            }
        }
    }
    (paths, bare)
}

/// Every path the documents name that is not in the tree under `root`, and every `:line` past its file's end or
/// `::Item` its file does not contain. A bare `name.rs` must be the name of a file under `src/`, `tests/` or
/// `benches/` (its line checked when exactly one file has that name).
fn stale_paths(root: &Path, docs: &[Doc]) -> Vec<String> {
    let module_dirs: BTreeSet<String> = std::fs::read_dir(root.join("src"))
        .expect("src/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_dir())
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
        .collect();
    let mut by_name: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for dir in ["src", "tests", "benches"] {
        let mut files = Vec::new();
        files_under(&root.join(dir), &|p| p.extension().is_some_and(|e| e == "rs"), &mut files);
        for file in files {
            let name = file.file_name().and_then(|n| n.to_str()).expect("UTF-8 file names").to_owned();
            by_name.entry(name).or_default().push(file);
        }
    }
    let mut problems = Vec::new();
    for doc in docs {
        let (paths, bare) = mentions(doc, &module_dirs);
        let mut report = |line: usize, written: &str, what: String| {
            problems.push(format!("{}:{line}: `{written}` {what}: fix the mention or drop it", doc.shown));
        };
        for m in paths {
            let full = root.join(&m.path);
            if !full.exists() {
                report(m.line, &m.written, format!("names {}, which does not exist", m.path.display()));
            } else if let Some(what) = suffix_problem(&full, &m.suffix) {
                report(m.line, &m.written, what);
            }
        }
        for (line, name, suffix) in bare {
            match by_name.get(&name).map(Vec::as_slice) {
                None => report(line, &name, "is the name of no file under src/, tests/ or benches/".to_owned()),
                Some([file]) => {
                    if let Some(what) = suffix_problem(file, &suffix) {
                        report(line, &name, what);
                    }
                }
                Some(_) => {}
            }
        }
    }
    problems
}

/// Why `suffix` does not fit `file`, if it does not.
fn suffix_problem(file: &Path, suffix: &Suffix) -> Option<String> {
    match suffix {
        Suffix::None => None,
        _ if file.is_dir() => None,
        Suffix::Line(n) => {
            let lines = read(file).lines().count();
            (*n == 0 || *n > lines).then(|| format!("points at line {n}, but the file has {lines} lines"))
        }
        Suffix::Item(item) => {
            let code = code_only(&read(file));
            (words(&code, item).next().is_none()).then(|| format!("names `{item}`, which the file does not contain"))
        }
    }
}

/// Names in the documents that start with `blobgate_` but are not series, with what each is. Each must still be
/// a string literal under `src/`, so this list cannot go stale either.
const NOT_SERIES: [(&str, &str); 1] =
    [("blobgate_changes", "the PostgreSQL NOTIFY channel of the change feed (store/metadata/pg_feed.rs)")];

/// The series `src/metrics` registers: every `const NAME: &str = "blobgate_…"` there that a `describe_counter!`,
/// `describe_gauge!` or `describe_histogram!` names (the describe calls are what `/metrics` lists with HELP and
/// TYPE), with whether it is a histogram. Also the names defined but never described.
fn registered_series(sources: &[Source]) -> (BTreeMap<String, bool>, BTreeSet<String>) {
    let metrics: Vec<&Source> = sources.iter().filter(|s| s.parts[0] == "metrics").collect();
    let mut consts = BTreeMap::new();
    for source in &metrics {
        for line in source.text.lines() {
            let line = line.trim_start().trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            let Some(rest) = line.strip_prefix("const ") else { continue };
            let name = ident(rest);
            let Some(value) = rest.split('"').nth(1) else { continue };
            if value.starts_with("blobgate_") {
                consts.insert(name.to_owned(), value.to_owned());
            }
        }
    }
    let mut described = BTreeMap::new();
    for source in &metrics {
        let code = code_only(&source.text);
        for (kind, histogram) in
            [("describe_counter!", false), ("describe_gauge!", false), ("describe_histogram!", true)]
        {
            for (at, _) in code.match_indices(kind) {
                let args = code[at + kind.len()..].trim_start().trim_start_matches('(').trim_start();
                if let Some(value) = consts.get(ident(args)) {
                    described.insert(value.clone(), histogram);
                }
            }
        }
    }
    let undescribed = consts.into_values().filter(|v| !described.contains_key(v)).collect();
    (described, undescribed)
}

/// Every `blobgate_…` name in `docs` that is not a registered series; a histogram's `_bucket`, `_sum` and
/// `_count` are its own name. A name ending in `_` or followed by `*` is the prefix, not a series.
fn unregistered_series(docs: &[Doc], sources: &[Source]) -> Vec<String> {
    let (registered, undescribed) = registered_series(sources);
    let mut problems = Vec::new();
    for (name, what) in NOT_SERIES {
        if !sources.iter().any(|s| s.text.contains(&format!("\"{name}\""))) {
            problems.push(format!("tests/architecture.rs: NOT_SERIES lists {name} ({what}), which src/ no longer has"));
        }
    }
    for doc in docs {
        for (index, line) in doc.text.lines().enumerate() {
            let b = line.as_bytes();
            for (at, _) in line.match_indices("blobgate_").filter(|(at, _)| *at == 0 || !is_ident(b[at - 1])) {
                let name = &line[at..at + "blobgate_".len() + ident(&line[at + "blobgate_".len()..]).len()];
                if name.ends_with('_') || line[at + name.len()..].starts_with('*') {
                    continue;
                }
                let histogram_part = ["_bucket", "_sum", "_count"]
                    .iter()
                    .filter_map(|s| name.strip_suffix(s))
                    .any(|base| registered.get(base) == Some(&true));
                if registered.contains_key(name) || histogram_part || NOT_SERIES.iter().any(|(n, _)| *n == name) {
                    continue;
                }
                let fix = if undescribed.contains(name) {
                    "is defined in src/metrics but never described: add its describe_* call"
                } else {
                    "is not a series src/metrics registers: fix the name, or define and describe the series"
                };
                problems.push(format!("{}:{}: `{name}` {fix}", doc.shown, index + 1));
            }
        }
    }
    problems
}

/// The documents that name series: the Markdown ones, and the dashboards and configuration under `deploy/`.
fn series_documents(root: &Path) -> Vec<Doc> {
    let mut docs = documents(root);
    if root.join("deploy").is_dir() {
        let mut files = Vec::new();
        let text =
            |p: &Path| p.extension().is_some_and(|e| ["json", "yml", "yaml"].contains(&e.to_str().unwrap_or("")));
        files_under(&root.join("deploy"), &text, &mut files);
        files.sort();
        docs.extend(as_docs(root, &files));
    }
    docs
}

/// Byte offsets where `pattern` occurs in `code` and does not run on into an identifier: an identifier character
/// at either end of it may not have one beside it (so `fs::read` is not `fs::read_dir`, and `.read(&mut` may
/// follow a name).
fn occurrences<'a>(code: &'a str, pattern: &'a str) -> impl Iterator<Item = usize> + 'a {
    let b = code.as_bytes();
    let (first, last) = (pattern.as_bytes()[0], pattern.as_bytes()[pattern.len() - 1]);
    code.match_indices(pattern).map(|(at, _)| at).filter(move |&at| {
        (!is_ident(first) || at == 0 || !is_ident(b[at - 1]))
            && (!is_ident(last) || b.get(at + pattern.len()).is_none_or(|&c| !is_ident(c)))
    })
}

/// The end of the `{…}` block whose `{` is at `open`, in code whose comments and strings are blanked.
fn block_end(b: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    b.len()
}

/// `code` (comments and strings already blanked) with every `#[cfg(test)]` item blanked too, keeping line breaks;
/// and the modules such an item declares out of line (`#[cfg(test)] mod fake;`), whose files are test code whole.
fn without_tests(code: &str) -> (String, Vec<String>) {
    const CFG_TEST: &str = "#[cfg(test)]";
    let b = code.as_bytes();
    let mut out = b.to_vec();
    let mut declared = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find(CFG_TEST) {
        let start = from + found;
        let mut i = start + CFG_TEST.len();
        // The item's other attributes (`#[path = "…"]`), then the item: up to its `;`, or to the end of its first
        // block, whichever comes first outside brackets.
        loop {
            i += b[i..].iter().take_while(|c| c.is_ascii_whitespace()).count();
            if !b[i..].starts_with(b"#[") {
                break;
            }
            i += 1 + b[i + 1..].iter().position(|&c| c == b']').map_or(b.len() - i - 1, |p| p + 1);
        }
        let item = i;
        let mut depth = 0i32;
        let end = loop {
            match b.get(i) {
                None => break b.len(),
                Some(b'(' | b'[') => depth += 1,
                Some(b')' | b']') => depth -= 1,
                Some(b';') if depth == 0 => break i + 1,
                Some(b'{') if depth == 0 => break block_end(b, i),
                Some(_) => {}
            }
            i += 1;
        };
        let words: Vec<&str> = code[item..end]
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        if code[item..end].trim_end().ends_with(';')
            && let Some(at) = words.iter().position(|w| *w == "mod")
            && let Some(name) = words.get(at + 1)
        {
            declared.push((*name).to_owned());
        }
        for c in &mut out[start..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end;
    }
    (String::from_utf8(out).expect("only ASCII bytes were replaced"), declared)
}

/// Every file under `src/` that is built outside tests, with its code (comments, strings and `#[cfg(test)]` items
/// blanked). A file that a `#[cfg(test)] mod name;` declares is test code whole, and left out.
fn production_code(sources: &[Source]) -> Vec<(&Source, String)> {
    let mut code: Vec<(&Source, String)> = Vec::new();
    let mut test_files = BTreeSet::new();
    for source in sources {
        let (kept, declared) = without_tests(&code_only(&source.text));
        // Where `mod name;` in this file looks for `name`: beside it for `mod.rs`, `lib.rs` and `main.rs`, else in
        // the folder named after it.
        let shown = Path::new(&source.shown);
        let file_name = shown.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let dir = match file_name {
            "mod.rs" | "lib.rs" | "main.rs" => shown.parent().unwrap_or(Path::new("")).to_path_buf(),
            _ => shown.with_extension(""),
        };
        for name in declared {
            test_files.insert(dir.join(format!("{name}.rs")).display().to_string());
            test_files.insert(dir.join(&name).join("mod.rs").display().to_string());
        }
        code.push((source, kept));
    }
    code.retain(|(source, _)| !test_files.contains(&source.shown));
    code
}

/// One bullet of `## Architecture invariants` in ARCHITECTURE.md: its first line, and its text (lines joined).
fn invariant(markdown: &str, lead: &str) -> Result<(usize, String), String> {
    let lines: Vec<&str> = markdown.lines().collect();
    let start = lines.iter().position(|l| *l == "## Architecture invariants").ok_or_else(|| {
        "ARCHITECTURE.md has no `## Architecture invariants` section: the checks read their lists there".to_owned()
    })?;
    let section = lines.iter().enumerate().skip(start + 1).take_while(|(_, l)| !l.starts_with("## "));
    let mut bullet: Option<(usize, String)> = None;
    for (index, line) in section {
        match (&mut bullet, line.strip_prefix("- **")) {
            (Some(_), Some(_)) => break,
            (None, Some(rest)) if rest.starts_with(lead) => bullet = Some((index + 1, line.to_string())),
            (Some((_, text)), None) if line.starts_with("  ") => {
                text.push('\n');
                text.push_str(line);
            }
            (Some(_), None) => break,
            (None, _) => {}
        }
    }
    bullet
        .ok_or_else(|| format!("ARCHITECTURE.md: no invariant starts `- **{lead}`: the checks read their lists there"))
}

/// Where `pattern` is in `text`, a space in it matching any run of white space (a line break and indent
/// included): the start and the end.
fn find_spaced(text: &str, pattern: &str) -> Option<(usize, usize)> {
    let words: Vec<&str> = pattern.split(' ').collect();
    text.match_indices(words[0]).find_map(|(start, _)| {
        let mut end = start + words[0].len();
        for word in &words[1..] {
            let gap = text[end..].chars().take_while(|c| c.is_whitespace()).map(char::len_utf8).sum::<usize>();
            if gap == 0 || !text[end + gap..].starts_with(word) {
                return None;
            }
            end += gap + word.len();
        }
        Some((start, end))
    })
}

/// The files an invariant lists: in its bullet (see [`invariant`]), the code spans of the clause after the label
/// `*{label}:*`, up to the end of its sentence, resolved under `src/` among `sources` (`names.rs`, `store/blobs.rs`;
/// a folder, `s3/`, stands for every file in it). With the label's line, and what names no file.
fn listed_files(
    markdown: &str,
    lead: &str,
    label: &str,
    sources: &[Source],
) -> Result<(usize, BTreeSet<String>, Vec<String>), String> {
    let (first_line, text) = invariant(markdown, lead)?;
    let marker = format!("*{label}:*");
    let (at, end) = find_spaced(&text, &marker).ok_or_else(|| {
        format!("ARCHITECTURE.md:{first_line}: the invariant `{lead}…` has no `{marker}` list: the checks read it")
    })?;
    let line = first_line + text[..at].matches('\n').count();
    let clause = &text[end..];
    let (mut spans, mut in_code, mut depth, mut span_start) = (Vec::new(), false, 0usize, 0);
    for (i, c) in clause.char_indices() {
        match c {
            '`' if in_code => {
                spans.push(&clause[span_start..i]);
                in_code = false;
            }
            '`' => {
                in_code = true;
                span_start = i + 1;
            }
            _ if in_code => {}
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            '.' if depth == 0 && clause[i + 1..].chars().next().is_none_or(char::is_whitespace) => break,
            _ => {}
        }
    }
    let (mut files, mut unknown) = (BTreeSet::new(), Vec::new());
    for span in spans.into_iter().filter(|s| s.ends_with(".rs") || s.ends_with('/')) {
        let path = format!("src/{span}");
        let matching: Vec<&Source> = if span.ends_with('/') {
            sources.iter().filter(|s| s.shown.starts_with(&path)).collect()
        } else {
            sources.iter().filter(|s| s.shown == path).collect()
        };
        if matching.is_empty() {
            unknown.push(format!("ARCHITECTURE.md:{line}: `{span}` under `{marker}` names no file under src/"));
        }
        files.extend(matching.into_iter().map(|s| s.shown.clone()));
    }
    Ok((line, files, unknown))
}

/// Which files read blob bytes into memory: ARCHITECTURE.md's invariant on the object bytes of a response, and
/// the label of its list.
const BLOB_READS: (&str, &str) = ("The object bytes of a response", "Files that read blob bytes");

/// How code reads a file's bytes into memory: positioned, streaming and whole-file reads, copies through a buffer,
/// and mappings. A file that does any of these outside its tests reads blob bytes, unless [`NOT_BLOB_READS`] says
/// what else it reads there.
const READ_CALLS: [&str; 13] = [
    "read_at",
    "read_exact_at",
    "read_exact",
    "read_to_end",
    "read_to_string",
    "read_vectored",
    ".read_buf(",
    "fs::read",
    "Read::read",
    ".read(&mut",
    "io::copy",
    "memmap2",
    "mmap",
];

/// Reads (file, call) that take no blob's bytes, with what they read. Each must still be in its file, so the list
/// cannot go stale.
const NOT_BLOB_READS: [(&str, &str, &str); 8] = [
    ("src/driver/ktls.rs", "read_exact", "TLS records from the socket during the handshake"),
    (
        "src/driver/sys.rs",
        "memmap2",
        "a mapping of a blob's range that is never read: `mincore` asks which pages are resident",
    ),
    ("src/driver/tls.rs", "fs::read", "the certificate pair's PEM files"),
    (
        "src/store/blobs.rs",
        "read_to_string",
        "this host's ids and a process's start time under /proc, for staging names",
    ),
    ("src/store/metadata/generation.rs", "memmap2", "the change feed's counter file"),
    ("src/store/metadata/pool.rs", "fs::read", "PostgreSQL's `sslrootcert`"),
    ("src/store/remote.rs", "fs::read", "`blob_store.ca_bundle`"),
    ("src/store/secrets_key.rs", "read_to_string", "the secrets key file"),
];

/// Every difference between the files that read file bytes into memory (outside tests, [`NOT_BLOB_READS`] aside)
/// and the files the invariant lists as reading blob bytes.
fn unlisted_blob_reads(markdown: &str, sources: &[Source]) -> Vec<String> {
    let (lead, label) = BLOB_READS;
    let (line, listed, mut problems) = match listed_files(markdown, lead, label, sources) {
        Ok(found) => found,
        Err(problem) => return vec![problem],
    };
    let mut readers = BTreeSet::new();
    let mut excused = BTreeSet::new();
    for (source, code) in production_code(sources) {
        for call in READ_CALLS {
            for at in occurrences(&code, call) {
                if NOT_BLOB_READS.iter().any(|(file, c, _)| *file == source.shown && *c == call) {
                    excused.insert((source.shown.clone(), call));
                    continue;
                }
                readers.insert(source.shown.clone());
                if !listed.contains(&source.shown) {
                    let n = line_at(&code, at);
                    problems.push(format!(
                        "{}:{n}: `{call}` reads a file into memory, but ARCHITECTURE.md:{line} does not list {} under \
                         `*{label}:*`: list it there with what it reads, or, if these are no blob's bytes, add it to \
                         NOT_BLOB_READS: {}",
                        source.shown,
                        source.shown,
                        source.line(n)
                    ));
                }
            }
        }
    }
    for file in listed.iter().filter(|f| !readers.contains(*f)) {
        problems.push(format!(
            "ARCHITECTURE.md:{line}: {file} is listed under `*{label}:*`, but nothing in it reads a file into memory: \
             drop it from the list"
        ));
    }
    for (file, call, what) in NOT_BLOB_READS {
        if !excused.contains(&(file.to_owned(), call)) {
            problems.push(format!(
                "tests/architecture.rs: NOT_BLOB_READS says {file} reads {what} with `{call}`, which it no longer \
                 does: drop the entry"
            ));
        }
    }
    problems
}

/// Which files may hold `unsafe`: ARCHITECTURE.md's invariant on `unsafe`, and the label of its list.
const UNSAFE_FILES: (&str, &str) = ("`unsafe` and raw fds are fenced in", "Allowed `unsafe`");

/// Every difference between the files that allow `unsafe_code` for themselves and the files the invariant lists.
fn unlisted_unsafe_files(markdown: &str, sources: &[Source]) -> Vec<String> {
    let (lead, label) = UNSAFE_FILES;
    let (line, listed, mut problems) = match listed_files(markdown, lead, label, sources) {
        Ok(found) => found,
        Err(problem) => return vec![problem],
    };
    let allowed = unsafe_files(sources);
    for file in allowed.difference(&listed) {
        problems.push(format!(
            "{file}: allows `unsafe_code`, but ARCHITECTURE.md:{line} does not list it under `*{label}:*`: list it \
             there with why, or take the unsafe out"
        ));
    }
    for file in listed.difference(&allowed) {
        problems.push(format!(
            "ARCHITECTURE.md:{line}: {file} is listed under `*{label}:*`, but it has no `#![allow(unsafe_code)]`: drop \
             it from the list"
        ));
    }
    problems
}

/// Which modules are pure: ARCHITECTURE.md's invariant on pure logic, and the label of its list.
const PURE_FILES: (&str, &str) = ("Pure logic does no IO", "Pure");

/// What IO looks like in code: files, sockets, processes, the blocking pool, the database and the object store.
const IO_WORDS: [&str; 16] = [
    "std::fs",
    "tokio::fs",
    "tokio::net",
    "std::process",
    "File",
    "OpenOptions",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "UnixStream",
    "spawn_blocking",
    "sqlx",
    "rusqlite",
    "object_store",
    "reqwest",
    "libc",
];

/// Every IO word in the code (outside tests) of the files the invariant lists as pure.
fn io_in_pure_files(markdown: &str, sources: &[Source]) -> Vec<String> {
    let (lead, label) = PURE_FILES;
    let (line, listed, mut problems) = match listed_files(markdown, lead, label, sources) {
        Ok(found) => found,
        Err(problem) => return vec![problem],
    };
    for (source, code) in production_code(sources).into_iter().filter(|(s, _)| listed.contains(&s.shown)) {
        let mut found: Vec<(usize, &str)> =
            IO_WORDS.iter().flat_map(|word| occurrences(&code, word).map(move |at| (at, *word))).collect();
        found.sort();
        for (at, word) in found {
            let n = line_at(&code, at);
            problems.push(format!(
                "{}:{n}: `{word}` in a file ARCHITECTURE.md:{line} lists as pure: move the IO to a caller, or drop the \
                 file from `*{label}:*`: {}",
                source.shown,
                source.line(n)
            ));
        }
    }
    problems
}

/// Which files read the environment: ARCHITECTURE.md's invariant on it, and the label of its list.
const ENV_READS: (&str, &str) = ("Only `config.rs` reads the environment", "Reads the environment");

/// How code reads the environment: std's calls, and clap's `env = "…"` on an argument.
const ENV_CALLS: [&str; 5] = ["env::var", "env::var_os", "env::vars", "env::vars_os", "env ="];

/// Every difference between the files that read the environment (outside tests) and the files the invariant lists.
fn unlisted_env_reads(markdown: &str, sources: &[Source]) -> Vec<String> {
    let (lead, label) = ENV_READS;
    let (line, listed, mut problems) = match listed_files(markdown, lead, label, sources) {
        Ok(found) => found,
        Err(problem) => return vec![problem],
    };
    let mut readers = BTreeSet::new();
    for (source, code) in production_code(sources) {
        let mut found: Vec<(usize, &str)> =
            ENV_CALLS.iter().flat_map(|call| occurrences(&code, call).map(move |at| (at, *call))).collect();
        found.sort();
        for (at, call) in found {
            readers.insert(source.shown.clone());
            if !listed.contains(&source.shown) {
                let n = line_at(&code, at);
                problems.push(format!(
                    "{}:{n}: `{call}` reads the environment, but ARCHITECTURE.md:{line} does not list {} under \
                     `*{label}:*`: add a setting to `config.rs` instead, or list the file with why: {}",
                    source.shown,
                    source.shown,
                    source.line(n)
                ));
            }
        }
    }
    for file in listed.iter().filter(|f| !readers.contains(*f)) {
        problems.push(format!(
            "ARCHITECTURE.md:{line}: {file} is listed under `*{label}:*`, but nothing in it reads the environment: \
             drop it from the list"
        ));
    }
    problems
}

fn assert_none(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{} {what}:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn every_use_follows_the_layer_table() {
    let table = layer_table(&architecture_md());
    assert_none("layer violations", &violations(&sources(&src_dir()), &table));
}

#[test]
fn every_edge_of_the_layer_table_is_used() {
    let table = layer_table(&architecture_md());
    assert_none("unused layer edges", &unused_edges(&sources(&src_dir()), &table));
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = Path::new(ROOT);
    assert_none("stale paths in the docs", &stale_paths(root, &documents(root)));
}

#[test]
fn sqlx_stays_in_store_metadata() {
    assert_none("uses of sqlx outside src/store/metadata/", &stray_sqlx(&sources(&src_dir())));
}

#[test]
fn raw_fds_stay_in_the_files_allowed_unsafe() {
    let sources = sources(&src_dir());
    assert!(!unsafe_files(&sources).is_empty(), "no file has #![allow(unsafe_code)]: is the rule still this one?");
    assert_none("raw-fd uses outside the unsafe files", &stray_raw_fds(&sources));
}

#[test]
fn every_series_the_docs_name_is_registered() {
    let root = Path::new(ROOT);
    let sources = sources(&src_dir());
    assert!(!registered_series(&sources).0.is_empty(), "no series found in src/metrics: is the rule still this one?");
    assert_none("unregistered series in the docs", &unregistered_series(&series_documents(root), &sources));
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

// Each check, shown to fail: the real tree with one defect injected, in memory. Each asserts the new problems
// exactly, so a check that stopped seeing its defect (or started reporting more) fails here.

/// What `after` reports that `before` did not.
fn added(before: &[String], after: Vec<String>) -> Vec<String> {
    after.into_iter().filter(|p| !before.contains(p)).collect()
}

/// `src` with `text` appended to the file shown as `file`; returns the new text's first line number.
fn inject(sources: &mut [Source], file: &str, text: &str) -> usize {
    let source = sources.iter_mut().find(|s| s.shown == file).unwrap_or_else(|| panic!("{file} is in the tree"));
    if !source.text.ends_with('\n') {
        source.text.push('\n');
    }
    let line = source.text.lines().count() + 1;
    source.text.push_str(text);
    line
}

#[test]
fn a_stale_path_in_the_docs_is_reported() {
    let root = Path::new(ROOT);
    let mut docs = documents(root);
    let before = stale_paths(root, &docs);
    let architecture = docs.iter_mut().find(|d| d.shown == "ARCHITECTURE.md").expect("ARCHITECTURE.md");
    let line = architecture.text.lines().count() + 1;
    architecture.text.push_str(
        "| `src/store/catalog.rs` | gone | `store/metadata/copy.rs:100000`, `catalog.rs`, [a link](src/http/), \
         `src/http/mod.rs::DataState`, `src/http/mod.rs::NoSuchState`, src/lib.rs. |\n",
    );
    let want = [
        "`src/store/catalog.rs` names src/store/catalog.rs, which does not exist".to_owned(),
        "`src/http/mod.rs` names `NoSuchState`, which the file does not contain".to_owned(),
        format!("`store/metadata/copy.rs` points at line 100000, but the file has {} lines", {
            read(&root.join("src/store/metadata/copy.rs")).lines().count()
        }),
        "`catalog.rs` is the name of no file under src/, tests/ or benches/".to_owned(),
    ];
    let want: Vec<String> =
        want.iter().map(|w| format!("ARCHITECTURE.md:{line}: {w}: fix the mention or drop it")).collect();
    assert_eq!(added(&before, stale_paths(root, &docs)), want);
}

#[test]
fn an_unused_layer_edge_is_reported() {
    let sources = sources(&Path::new(ROOT).join("src"));
    let mut table = layer_table(&architecture_md());
    let before = unused_edges(&sources, &table);
    // `names` holds pure values: it has no settings to read.
    let names = table.get_mut("names").expect("a `names` row");
    assert!(names.may_use.insert("config".to_owned()), "`names` may not use `config` yet");
    let line = names.line;
    assert_eq!(
        added(&before, unused_edges(&sources, &table)),
        [format!(
            "ARCHITECTURE.md:{line}: the `names` row may use `config`, but no file of names names `crate::config`: \
             remove `config` from the row"
        )]
    );
}

#[test]
fn a_stray_sqlx_import_is_reported() {
    let mut sources = sources(&Path::new(ROOT).join("src"));
    let before = stray_sqlx(&sources);
    let line = inject(&mut sources, "src/http/mod.rs", "// sqlx::query in a comment is fine\nuse sqlx::Row;\n");
    assert_eq!(
        added(&before, stray_sqlx(&sources)),
        [format!(
            "src/http/mod.rs:{}: sqlx outside src/store/metadata/: move this behind `store::Metadata`: use sqlx::Row;",
            line + 1
        )]
    );
}

#[test]
fn a_raw_fd_outside_the_unsafe_files_is_reported() {
    let mut sources = sources(&Path::new(ROOT).join("src"));
    let before = stray_raw_fds(&sources);
    let allowed = join(&unsafe_files(&sources));
    let line = inject(
        &mut sources,
        "src/store/blobs.rs",
        "fn fd(f: &File) -> i32 { std::os::fd::AsRawFd::as_raw_fd(f) }\n\
         fn errno(e: &std::io::Error) -> bool { e.raw_os_error() == Some(libc::EMFILE) }\n\
         #[allow(unsafe_code)]\nfn close() { unsafe { libc::close(3) }; }\n",
    );
    let at = |n: usize, what: &str, text: &str| {
        format!(
            "src/store/blobs.rs:{n}: {what} outside the files allowed unsafe ({allowed}): keep raw fds there and \
             pass owned handles (`&File`, `&TcpStream`) elsewhere: {text}"
        )
    };
    let fd_line = "fn fd(f: &File) -> i32 { std::os::fd::AsRawFd::as_raw_fd(f) }";
    assert_eq!(
        added(&before, stray_raw_fds(&sources)),
        [
            format!(
                "src/store/blobs.rs:{}: `unsafe_code` allowed for one item: allow it for the whole file \
                 (`#![allow(unsafe_code)]` at its top), so that the unsafe modules are a list of files: \
                 #[allow(unsafe_code)]",
                line + 2
            ),
            at(line, "`AsRawFd`", fd_line),
            at(line, "`as_raw_fd`", fd_line),
            at(line + 3, "the call `libc::close`", "fn close() { unsafe { libc::close(3) }; }"),
        ]
    );
}

#[test]
fn an_unregistered_series_in_the_docs_is_reported() {
    let root = Path::new(ROOT);
    let sources = sources(&root.join("src"));
    let mut docs = series_documents(root);
    let before = unregistered_series(&docs, &sources);
    let readme = docs.iter_mut().find(|d| d.shown == "README.md").expect("README.md");
    let line = readme.text.lines().count() + 1;
    readme.text.push_str(
        "`blobgate_imaginary_total`, `blobgate_response_duration_seconds_count`, the `blobgate_` prefix, \
         `blobgate_sent_bytes_total_bucket`\n",
    );
    assert_eq!(
        added(&before, unregistered_series(&docs, &sources)),
        [
            format!(
                "README.md:{line}: `blobgate_imaginary_total` is not a series src/metrics registers: fix the name, \
                 or define and describe the series"
            ),
            format!(
                "README.md:{line}: `blobgate_sent_bytes_total_bucket` is not a series src/metrics registers: fix \
                 the name, or define and describe the series"
            ),
        ]
    );
}

#[test]
fn the_files_that_read_blob_bytes_are_the_ones_the_invariants_name() {
    assert_none(
        "differences from the invariant's list of blob readers",
        &unlisted_blob_reads(&architecture_md(), &sources(&src_dir())),
    );
}

#[test]
fn the_files_allowed_unsafe_are_the_ones_the_invariants_name() {
    assert_none(
        "differences from the invariant's list of unsafe files",
        &unlisted_unsafe_files(&architecture_md(), &sources(&src_dir())),
    );
}

#[test]
fn the_files_that_read_the_environment_are_the_ones_the_invariants_name() {
    assert_none(
        "differences from the invariant's list of environment readers",
        &unlisted_env_reads(&architecture_md(), &sources(&src_dir())),
    );
}

#[test]
fn the_files_the_invariants_call_pure_do_no_io() {
    assert_none("IO in pure files", &io_in_pure_files(&architecture_md(), &sources(&src_dir())));
}

/// The test-code filter: `#[cfg(test)]` items blanked whatever their shape, and the files they declare named.
#[test]
fn test_code_is_told_from_the_code_it_tests() {
    let code = "fn kept() {}\n\
                #[cfg(test)]\n#[path = \"../x.rs\"]\nmod cases;\n\
                #[cfg(test)]\npub(crate) mod fake;\n\
                #[cfg(test)]\nuse a::{b, c};\n\
                #[cfg(test)]\nmod tests {\n    fn f() { if x { y() } }\n}\n\
                fn also_kept() { let _ = [0u8; 2]; }\n";
    let (kept, declared) = without_tests(&code_only(code));
    let kept: Vec<&str> = kept.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    assert_eq!(kept, ["fn kept() {}", ";", "fn also_kept() { let _ = [0u8; 2]; }"]);
    assert_eq!(declared, ["cases", "fake"]);
    let sources = sources(&Path::new(ROOT).join("src"));
    let built: BTreeSet<&str> = production_code(&sources).iter().map(|(s, _)| s.shown.as_str()).collect();
    for test_only in ["src/store/remote/fake.rs", "src/auth/sigv4/tests.rs", "src/http/signed_url_tests.rs"] {
        assert!(!built.contains(test_only), "{test_only} is test code");
    }
    assert!(built.contains("src/store/remote.rs") && built.contains("src/lib.rs"));
}

#[test]
fn a_blob_read_the_invariant_does_not_name_is_reported() {
    let mut sources = sources(&Path::new(ROOT).join("src"));
    let markdown = architecture_md();
    let before = unlisted_blob_reads(&markdown, &sources);
    let line = inject(
        &mut sources,
        "src/catalog/mod.rs",
        "fn peek(blob: &File) -> u8 {\n    let mut byte = [0u8; 1];\n    \
         std::os::unix::fs::FileExt::read_exact_at(blob, &mut byte, 0).unwrap();\n    byte[0]\n}\n\
         #[cfg(test)]\nmod more_tests {\n    fn whole(path: &Path) -> Vec<u8> { std::fs::read(path).unwrap() }\n}\n",
    );
    let (lead, label) = BLOB_READS;
    let (listed_at, ..) = listed_files(&markdown, lead, label, &sources).unwrap();
    assert_eq!(
        added(&before, unlisted_blob_reads(&markdown, &sources)),
        [format!(
            "src/catalog/mod.rs:{}: `read_exact_at` reads a file into memory, but ARCHITECTURE.md:{listed_at} does \
             not list src/catalog/mod.rs under `*{label}:*`: list it there with what it reads, or, if these are no \
             blob's bytes, add it to NOT_BLOB_READS: std::os::unix::fs::FileExt::read_exact_at(blob, &mut byte, \
             0).unwrap();",
            line + 2
        )]
    );
}

#[test]
fn a_blob_reader_missing_from_the_list_or_listed_wrongly_is_reported() {
    let sources = sources(&Path::new(ROOT).join("src"));
    let markdown = architecture_md();
    let before = unlisted_blob_reads(&markdown, &sources);
    let (lead, label) = BLOB_READS;
    let (line, listed, _) = listed_files(&markdown, lead, label, &sources).unwrap();
    assert!(listed.contains("src/store/precompress.rs"), "the list names store/precompress.rs: {listed:?}");
    // One reader dropped from the list, and a file that reads nothing put in its place.
    let edited = markdown.replacen("`store/precompress.rs`", "`http/range.rs`", 1);
    let found = added(&before, unlisted_blob_reads(&edited, &sources));
    let (unlisted, rest): (Vec<&String>, Vec<&String>) =
        found.iter().partition(|p| p.starts_with("src/store/precompress.rs:"));
    assert!(!unlisted.is_empty(), "{found:#?}");
    for problem in unlisted {
        assert!(problem.contains("does not list src/store/precompress.rs under"), "{problem}");
    }
    assert_eq!(
        rest,
        [&format!(
            "ARCHITECTURE.md:{line}: src/http/range.rs is listed under `*{label}:*`, but nothing in it reads a file \
             into memory: drop it from the list"
        )]
    );
}

#[test]
fn an_unsafe_file_missing_from_the_list_or_listed_wrongly_is_reported() {
    let mut sources = sources(&Path::new(ROOT).join("src"));
    let markdown = architecture_md();
    let before = unlisted_unsafe_files(&markdown, &sources);
    inject(&mut sources, "src/store/blobs.rs", "#![allow(unsafe_code)]\n");
    let edited = markdown.replacen("`store/metadata/generation.rs`", "`store/staging.rs`", 1);
    let (lead, label) = UNSAFE_FILES;
    let (line, ..) = listed_files(&edited, lead, label, &sources).unwrap();
    assert_eq!(
        added(&before, unlisted_unsafe_files(&edited, &sources)),
        [
            format!(
                "src/store/blobs.rs: allows `unsafe_code`, but ARCHITECTURE.md:{line} does not list it under \
                 `*{label}:*`: list it there with why, or take the unsafe out"
            ),
            format!(
                "src/store/metadata/generation.rs: allows `unsafe_code`, but ARCHITECTURE.md:{line} does not list it \
                 under `*{label}:*`: list it there with why, or take the unsafe out"
            ),
            format!(
                "ARCHITECTURE.md:{line}: src/store/staging.rs is listed under `*{label}:*`, but it has no \
                 `#![allow(unsafe_code)]`: drop it from the list"
            ),
        ]
    );
}

#[test]
fn io_in_a_pure_file_is_reported() {
    let mut sources = sources(&Path::new(ROOT).join("src"));
    let markdown = architecture_md();
    let before = io_in_pure_files(&markdown, &sources);
    let line = inject(
        &mut sources,
        "src/s3/listing.rs",
        "// std::fs in a comment is fine\nfn load(path: &str) -> String { std::fs::read_to_string(path).unwrap() }\n",
    );
    let (lead, label) = PURE_FILES;
    let (listed_at, ..) = listed_files(&markdown, lead, label, &sources).unwrap();
    assert_eq!(
        added(&before, io_in_pure_files(&markdown, &sources)),
        [format!(
            "src/s3/listing.rs:{}: `std::fs` in a file ARCHITECTURE.md:{listed_at} lists as pure: move the IO to a \
             caller, or drop the file from `*{label}:*`: fn load(path: &str) -> String {{ \
             std::fs::read_to_string(path).unwrap() }}",
            line + 1
        )]
    );
    // A path in the list that names no file is reported too.
    let edited = markdown.replacen("`s3/`", "`s4/`", 1);
    assert!(
        io_in_pure_files(&edited, &sources)
            .iter()
            .any(|p| p.ends_with("`s4/` under `*Pure:*` names no file under src/")),
        "{:#?}",
        io_in_pure_files(&edited, &sources)
    );
}

#[test]
fn an_environment_read_the_invariant_does_not_name_is_reported() {
    let mut sources = sources(&Path::new(ROOT).join("src"));
    let markdown = architecture_md();
    let before = unlisted_env_reads(&markdown, &sources);
    let line = inject(
        &mut sources,
        "src/driver/send.rs",
        "fn chunk() -> Option<String> { std::env::var(\"BLOBGATE_CHUNK\").ok() }\n\
         #[cfg(test)]\nfn in_a_test() -> bool { std::env::var_os(\"CI\").is_some() }\n",
    );
    // And a file listed that reads nothing of it.
    let edited = markdown.replacen("`cli/mod.rs`", "`cli/db.rs`", 1);
    let (lead, label) = ENV_READS;
    let (listed_at, ..) = listed_files(&edited, lead, label, &sources).unwrap();
    // Where the real read in cli/mod.rs is (clap's `env =` of `--config`), wherever edits move it.
    let cli = sources.iter().find(|s| s.shown == "src/cli/mod.rs").expect("src/cli/mod.rs");
    let clap_env = 1 + cli.text.lines().position(|l| l.contains("env = \"BLOBGATE_CONFIG\"")).expect("--config's env");
    let mut found = added(&before, unlisted_env_reads(&edited, &sources));
    found.sort();
    assert_eq!(
        found,
        [
            format!(
                "ARCHITECTURE.md:{listed_at}: src/cli/db.rs is listed under `*{label}:*`, but nothing in it reads the \
                 environment: drop it from the list"
            ),
            format!(
                "src/cli/mod.rs:{clap_env}: `env =` reads the environment, but ARCHITECTURE.md:{listed_at} does not list \
                 src/cli/mod.rs under `*{label}:*`: add a setting to `config.rs` instead, or list the file with why: \
                 #[arg(long, global = true, value_name = \"FILE\", env = \"BLOBGATE_CONFIG\", hide_env = true)]"
            ),
            format!(
                "src/driver/send.rs:{line}: `env::var` reads the environment, but ARCHITECTURE.md:{listed_at} does not \
                 list src/driver/send.rs under `*{label}:*`: add a setting to `config.rs` instead, or list the file \
                 with why: fn chunk() -> Option<String> {{ std::env::var(\"BLOBGATE_CHUNK\").ok() }}"
            ),
        ]
    );
}
