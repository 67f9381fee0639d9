//! The engine's top-level modules (engine/src/*.rs and the folders beside them) import each other
//! without a circle: read from the bottom up, each module needs only those below it.
//!
//! The graph is read from the source: every `crate::x` path (in `use` lines and in code, grouped
//! `crate::{x, y::z}` included), `super::x` from a top-level module's file, `super::super::x`
//! from a file one folder down, and names the crate root re-exports (`crate::Engine` is the
//! `engine` module). Comments, strings and test-only code (a `#[cfg(test)]` item, and the files
//! a `#[cfg(test)] mod x;` declares) are left out: tests may reach across.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules, and the module of each item `lib.rs` re-exports (`pub use m::{A, B}`).
struct Root {
    modules: BTreeSet<String>,
    reexports: BTreeMap<String, String>,
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// `text` without comments and the content of string and char literals (kept as `""`, `' '`).
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) {
            // A raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            let end = format!("\"{}", "#".repeat(hashes));
            let rest = &text[j + 1..];
            i = j + 1 + rest.find(&end).map_or(rest.len(), |k| k + end.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && is_char_literal(&b[i..]) {
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            let ch = text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Whether the `'` at the start of `b` opens a char literal (`'a'`, `'\n'`), not a lifetime.
fn is_char_literal(b: &[u8]) -> bool {
    match b.get(1) {
        Some(b'\\') => true,
        Some(_) => {
            let len = std::str::from_utf8(&b[1..b.len().min(5)])
                .ok()
                .or_else(|| std::str::from_utf8(&b[1..b.len().min(2)]).ok())
                .and_then(|s| s.chars().next())
                .map_or(1, char::len_utf8);
            b.get(1 + len) == Some(&b'\'')
        }
        None => false,
    }
}

/// `code` without `#[cfg(test)]` items; the names of the modules such an item declares
/// (`#[cfg(test)] mod tests;`) go to `test_mods`.
fn drop_test_items(code: &str, test_mods: &mut Vec<String>) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find(ATTR) {
        out.push_str(&rest[..at]);
        let item = &rest[at + ATTR.len()..];
        let semi = item.find(';').unwrap_or(item.len());
        let brace = item.find('{').unwrap_or(item.len());
        let end = if semi < brace {
            let decl: Vec<&str> = item[..semi].split_whitespace().collect();
            if let [.., "mod", name] = decl.as_slice() {
                test_mods.push(name.to_string());
            }
            semi + 1
        } else {
            let mut depth = 0;
            let mut end = item.len();
            for (k, c) in item.char_indices().skip(brace) {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = k + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            end
        };
        rest = &item[end.min(item.len())..];
    }
    out.push_str(rest);
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first names of the paths after each `prefix` (`crate::`): `x` of `crate::x::y`, and `x`
/// and `y` of `crate::{x::a, y}`.
fn heads_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = code[at + prefix.len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if depth == 1 && item_start && !c.is_whitespace() => {
                        out.push(ident_at(&group[k..]).to_string());
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident_at(rest).to_string());
        }
    }
    out.retain(|h| !h.is_empty() && h != "self");
    out
}

fn read_root() -> Root {
    let lib = strip(&fs::read_to_string(src().join("lib.rs")).expect("lib.rs"));
    let mut modules = BTreeSet::new();
    let mut reexports = BTreeMap::new();
    for stmt in lib.split(';') {
        let words: Vec<&str> = stmt.split_whitespace().collect();
        if let [.., "mod", name] = words.as_slice() {
            modules.insert(name.to_string());
        }
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        let path = stmt[at + "pub use ".len()..].trim();
        let module = ident_at(path).to_string();
        let tail = &path[module.len()..];
        let names: Vec<String> = match tail.find('{') {
            Some(open) => tail[open + 1..]
                .trim_end_matches('}')
                .split(',')
                .map(|n| ident_at(n.trim()).to_string())
                .collect(),
            None => vec![tail.rsplit("::").next().unwrap_or("").trim().to_string()],
        };
        for n in names.into_iter().filter(|n| !n.is_empty()) {
            reexports.insert(n, module.clone());
        }
    }
    Root { modules, reexports }
}

/// Every `.rs` file under `dir`, with its depth below `src/` (1 for `src/m/a.rs`).
fn files_under(dir: &Path, depth: usize, out: &mut Vec<(PathBuf, usize)>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_under(&p, depth + 1, out);
        } else if p.file_name().is_some_and(|n| n == "mod.rs") {
            // A folder's own file: its `super` is the folder's parent.
            out.push((p, depth - 1));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push((p, depth));
        }
    }
}

/// Edges between top-level modules: (from, to) -> the first file that makes it.
fn edges(root: &Root) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for m in &root.modules {
        let mut files = Vec::new();
        if src().join(format!("{m}.rs")).is_file() {
            files.push((src().join(format!("{m}.rs")), 0));
        }
        if src().join(m).is_dir() {
            files_under(&src().join(m), 1, &mut files);
        }
        let mut test_files: Vec<PathBuf> = Vec::new();
        for (file, depth) in files {
            if test_files.iter().any(|t| file.starts_with(t)) {
                continue;
            }
            let mut test_mods = Vec::new();
            let code = drop_test_items(
                &strip(&fs::read_to_string(&file).expect("read")),
                &mut test_mods,
            );
            // The files a `#[cfg(test)] mod x;` here declares (x.rs and x/ beside or below).
            let own_dir = if file.file_name().is_some_and(|n| n == "mod.rs") {
                file.parent().map(Path::to_path_buf).unwrap_or_default()
            } else if depth == 0 {
                src().join(m)
            } else {
                file.with_extension("")
            };
            for t in test_mods {
                test_files.push(own_dir.join(format!("{t}.rs")));
                test_files.push(own_dir.join(&t));
            }
            let to_root = format!("{}::", vec!["super"; depth + 1].join("::"));
            let mut heads = heads_after(&code, "crate::");
            heads.extend(heads_after(&code, &to_root));
            for h in heads {
                let target = if root.modules.contains(&h) {
                    h
                } else if let Some(module) = root.reexports.get(&h) {
                    module.clone()
                } else {
                    continue;
                };
                if &target != m {
                    let rel = file.strip_prefix(src()).unwrap_or(&file);
                    out.entry((m.clone(), target))
                        .or_insert_with(|| rel.display().to_string());
                }
            }
        }
    }
    out
}

/// The cycles among the modules: each strongly connected component of more than one module
/// (Tarjan's algorithm), sorted.
fn cycles(
    nodes: &BTreeSet<String>,
    edges: &BTreeMap<(String, String), String>,
) -> Vec<Vec<String>> {
    struct State<'a> {
        next: usize,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(v: &'a str, adj: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        for &w in adj.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, adj, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.stack.contains(&w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        adj.entry(from).or_default().push(to);
    }
    let mut s = State {
        next: 0,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !s.index.contains_key(v.as_str()) {
            visit(v, &adj, &mut s);
        }
    }
    s.out.sort();
    s.out
}

#[test]
fn top_level_modules_import_each_other_without_a_circle() {
    let root = read_root();
    assert!(root.modules.len() > 10, "modules: {:?}", root.modules);
    let edges = edges(&root);
    let found = cycles(&root.modules, &edges);
    let mut report = String::new();
    for comp in &found {
        report.push_str(&format!("circle among {}:\n", comp.join(", ")));
        for ((from, to), file) in &edges {
            if comp.contains(from) && comp.contains(to) {
                report.push_str(&format!("  {from} -> {to} ({file})\n"));
            }
        }
    }
    assert!(found.is_empty(), "{report}");
}

/// The reader itself: grouped imports, `super::` from each depth, re-exported names, and what
/// is left out.
#[test]
fn the_reader_finds_imports_and_leaves_out_tests_comments_and_strings() {
    let code = strip(
        "use crate::{a::X, b, c::{d, e}};\n// crate::f\nlet s = \"crate::g\"; let c = '{';\n\
         fn h<'a>(x: &'a str) { crate::i::j(x) }\n#[cfg(test)]\nmod tests { use crate::k; }\n\
         #[cfg(test)]\nmod more;\n/* crate::l /* nested */ crate::m */ super::super::n::o",
    );
    let mut test_mods = Vec::new();
    let code = drop_test_items(&code, &mut test_mods);
    assert_eq!(heads_after(&code, "crate::"), ["a", "b", "c", "i"]);
    assert_eq!(heads_after(&code, "super::super::"), ["n"]);
    assert_eq!(test_mods, ["more"]);
    let nodes: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let e = |f: &str, t: &str| ((f.to_string(), t.to_string()), String::new());
    let circle = BTreeMap::from([e("a", "b"), e("b", "c"), e("c", "a")]);
    assert_eq!(cycles(&nodes, &circle), [["a", "b", "c"]]);
    let line = BTreeMap::from([e("a", "b"), e("b", "c")]);
    assert!(cycles(&nodes, &line).is_empty());
}
