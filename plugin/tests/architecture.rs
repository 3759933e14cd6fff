//! The crate's module graph keeps the house rules: state lives below the code that uses it, the
//! wiring in `daemon/` is imported by `main.rs` only, and there are no module cycles: between the
//! top-level modules of `src/`, nor between the sibling modules of any directory below it.
//!
//! The resize domain's state has owners ([`OWNERS`]), each reached only through its handle: the
//! owner's fields are private (so the compiler keeps every other file out of its maps), the
//! owners sit below the engine's front and call each other without a cycle, the engine holds
//! handles and context but no maps or locks of its own, and `daemon/` decides nothing of
//! pod-level resizes. The calls into each owner are printed with the graph.
//!
//! Pure: reads the crate's own sources. A dependency is a `crate::<module>` path in code (also in
//! `use crate::{a, b}` groups); comments are skipped. `cargo test --test architecture --
//! --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file at or under `path`.
fn rust_files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_owned()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).expect("read_dir").flatten() {
        let p = entry.path();
        if p.is_dir() || p.extension().is_some_and(|e| e == "rs") {
            files.extend(rust_files(&p));
        }
    }
    files
}

/// The modules of `dir` (a `foo.rs` and a `foo/` are one module), with their files; `mod.rs`,
/// `lib.rs` and `main.rs` are not modules of their own.
fn modules(dir: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut out: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = entry.path();
        let name = p.file_stem().and_then(|s| s.to_str()).expect("utf-8 name");
        let is_rs = p.extension().is_some_and(|e| e == "rs");
        if (p.is_dir() || is_rs) && !["mod", "lib", "main"].contains(&name) {
            out.entry(name.to_owned())
                .or_default()
                .extend(rust_files(&p));
        }
    }
    out
}

/// The code of a file without its comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read source");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first path segment after each `prefix` (`crate::a::b` → `a`, `crate::{a, b::c}` → `a`, `b`).
fn referenced(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.insert(ident(rest).to_owned());
            continue;
        };
        let mut depth = 0;
        let mut item_start = true;
        for (i, c) in group.char_indices() {
            if item_start && depth == 0 {
                out.insert(ident(&group[i..]).to_owned());
            }
            item_start = c == ',' && depth == 0;
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                _ => {}
            }
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Which of `modules` each module references through any of `prefixes`.
fn graph(modules: &BTreeMap<String, Vec<PathBuf>>, prefixes: &[&str]) -> Graph {
    let mut g = Graph::new();
    for (name, files) in modules {
        let refs = g.entry(name.clone()).or_default();
        for f in files {
            let code = code(f);
            for p in prefixes {
                refs.extend(referenced(&code, p));
            }
        }
        refs.retain(|r| r != name && modules.contains_key(r));
    }
    g
}

/// A cycle of `g` as a path (`a -> b -> a`), if there is one.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(n: &str, g: &Graph, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> bool {
        if let Some(i) = path.iter().position(|p| p == n) {
            path.drain(..i);
            path.push(n.to_owned());
            return true;
        }
        if done.contains(n) {
            return false;
        }
        path.push(n.to_owned());
        for next in g.get(n).into_iter().flatten() {
            if visit(next, g, path, done) {
                return true;
            }
        }
        path.pop();
        done.insert(n.to_owned());
        false
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|n| {
        let mut path = Vec::new();
        visit(n, g, &mut path, &mut done).then_some(path)
    })
}

fn print(g: &Graph) {
    for (m, refs) in g.iter().filter(|(_, r)| !r.is_empty()) {
        let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
        eprintln!("{m} -> {}", refs.join(" "));
    }
}

fn top_level() -> Graph {
    graph(&modules(&src()), &["crate::"])
}

#[test]
fn top_level_modules_have_no_cycle() {
    let g = top_level();
    print(&g);
    if let Some(cycle) = find_cycle(&g) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn only_main_imports_the_daemon() {
    for (m, refs) in top_level() {
        assert!(
            !refs.contains("daemon"),
            "{m} imports daemon (only main.rs may)"
        );
    }
}

#[test]
fn state_imports_none_of_its_users() {
    let g = top_level();
    let refs = g.get("state").expect("src/state");
    for user in ["api", "capacity", "daemon", "nri", "resize"] {
        assert!(!refs.contains(user), "state imports {user}");
    }
}

/// Every directory below `src/` that holds modules, as a path relative to `src/`.
fn module_dirs(dir: &Path, rel: &str, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            let name = p.file_name().and_then(|n| n.to_str()).expect("utf-8 name");
            let rel = if rel.is_empty() {
                name.to_owned()
            } else {
                format!("{rel}/{name}")
            };
            module_dirs(&p, &rel, out);
            out.push(rel);
        }
    }
}

/// The graph between the sibling modules of `src/<rel>`: references through
/// `crate::<rel as a path>::` from any of their files, and through `super::` from the files
/// whose `super` is `<rel>` itself (`<rel>/x.rs` and `<rel>/x/mod.rs`).
fn sibling_graph(rel: &str) -> Graph {
    let dir = src().join(rel);
    let mods = modules(&dir);
    let absolute = format!("crate::{}::", rel.replace('/', "::"));
    let mut g = Graph::new();
    for (name, files) in &mods {
        let refs = g.entry(name.clone()).or_default();
        for f in files {
            let code = code(f);
            refs.extend(referenced(&code, &absolute));
            let parent = f.parent().expect("a parent");
            let direct = parent == dir
                || (parent == dir.join(name) && f.file_name().is_some_and(|n| n == "mod.rs"));
            if direct {
                refs.extend(referenced(&code, "super::"));
            }
        }
        refs.retain(|r| r != name && mods.contains_key(r));
    }
    g
}

#[test]
fn sibling_modules_have_no_cycle_in_any_directory() {
    let mut dirs = Vec::new();
    module_dirs(&src(), "", &mut dirs);
    assert!(dirs.iter().any(|d| d == "resize/decrease"), "{dirs:?}");
    for rel in dirs {
        let g = sibling_graph(&rel);
        if let Some(cycle) = find_cycle(&g) {
            print(&g);
            panic!(
                "cycle between the modules of src/{rel}: {}",
                cycle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_parser_sees_groups_and_skips_longer_names() {
    let refs = referenced(
        "use crate::{a::{b, c}, d};\nlet x = crate::e::f; my_crate::g();",
        "crate::",
    );
    assert_eq!(refs, BTreeSet::from(["a", "d", "e"].map(String::from)));
    let g = Graph::from([
        ("a".into(), BTreeSet::from(["b".into()])),
        ("b".into(), BTreeSet::from(["a".into()])),
    ]);
    assert_eq!(find_cycle(&g).expect("cycle"), ["a", "b", "a"]);
}

/// The owners of the resize domain's state: (name, file under `src/`, handle type).
const OWNERS: [(&str, &str, &str); 5] = [
    ("records", "resize/record_store.rs", "Records"),
    ("reclaims", "resize/reclaims.rs", "Reclaims"),
    ("pod runs", "resize/pod_runs.rs", "PodRuns"),
    ("restarts", "resize/restart.rs", "Restarts"),
    ("trimming", "trim/mod.rs", "Trimmer"),
];

/// The body (between the braces) of `struct <name>` in `code`.
fn struct_body<'a>(code: &'a str, name: &str) -> &'a str {
    let at = code
        .match_indices(&format!("struct {name} "))
        .map(|(i, _)| i)
        .chain(
            code.match_indices(&format!("struct {name}<"))
                .map(|(i, _)| i),
        )
        .next()
        .unwrap_or_else(|| panic!("no struct {name}"));
    let open = at + code[at..].find('{').expect("a struct with fields");
    let close = open + code[open..].find("\n}").expect("the struct's end");
    &code[open + 1..close]
}

/// The fields of a struct body as `(visibility, name, type)`.
fn fields(body: &str) -> Vec<(String, String, String)> {
    body.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let (left, ty) = l.split_once(':')?;
            let mut words: Vec<&str> = left.split_whitespace().collect();
            let name = words.pop()?.to_owned();
            Some((
                words.join(" "),
                name,
                ty.trim().trim_end_matches(',').to_owned(),
            ))
        })
        .collect()
}

fn has_word(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        let part = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !part(before) && !part(after)
    })
}

#[test]
fn owners_keep_their_state_private() {
    for (owner, file, handle) in OWNERS {
        let code = code(&src().join(file));
        let fields = fields(struct_body(&code, handle));
        assert!(!fields.is_empty(), "{owner}: no fields of {handle} parsed");
        for (vis, name, _) in &fields {
            assert!(
                vis.is_empty(),
                "{owner}: field {handle}::{name} is `{vis}`: its state would be reachable past the handle"
            );
        }
    }
}

#[test]
fn owners_sit_below_the_engine_and_call_each_other_without_a_cycle() {
    let mut g = Graph::new();
    for (owner, file, _) in OWNERS {
        let code = code(&src().join(file));
        assert!(
            !has_word(&code, "Engine"),
            "{owner} ({file}) names the Engine: owners sit below its front"
        );
        let calls = g.entry(owner.to_owned()).or_default();
        for (other, _, handle) in OWNERS {
            if other != owner && has_word(&code, handle) {
                calls.insert(other.to_owned());
            }
        }
    }
    print(&g);
    if let Some(cycle) = find_cycle(&g) {
        panic!("owners call each other in a cycle: {}", cycle.join(" -> "));
    }
    // The records and the pod runs are leaves: they decide nothing about any other owner.
    for leaf in ["records", "pod runs"] {
        assert!(g[leaf].is_empty(), "{leaf} calls {:?}", g[leaf]);
    }
    // Who calls into each owner from the resize domain (through the engine's field).
    let mut callers = Graph::new();
    for f in rust_files(&src().join("resize")) {
        let code = code(&f);
        let rel = f
            .strip_prefix(src())
            .expect("under src")
            .display()
            .to_string();
        for (owner, field) in [
            ("records", ".records."),
            ("reclaims", ".reclaims."),
            ("pod runs", ".runs."),
            ("restarts", ".restarts."),
        ] {
            if code.contains(field) {
                callers
                    .entry(owner.to_owned())
                    .or_default()
                    .insert(rel.clone());
            }
        }
    }
    print(&callers);
    assert!(
        callers
            .get("reclaims")
            .is_some_and(|c| c.contains("resize/pod_level/mod.rs")),
        "pod-level admission reclaims through the owner: {callers:?}"
    );
}

#[test]
fn the_engine_holds_handles_and_context_but_no_state_of_its_own() {
    let code = code(&src().join("resize/mod.rs"));
    for (_, name, ty) in fields(struct_body(&code, "Engine")) {
        for state in ["Mutex", "RwLock", "HashMap", "BTreeMap", "AtomicU64"] {
            assert!(
                !ty.contains(state),
                "Engine::{name}: {ty}: state belongs to an owner, the engine holds its handle"
            );
        }
    }
}

#[test]
fn the_daemon_decides_nothing_of_pod_level_resizes() {
    for f in rust_files(&src().join("daemon")) {
        let code = code(&f);
        for decision in [
            "admit_pod_level",
            "admit_unchecked_memory",
            "reclaim_request",
            "reclaim_pod",
            "read_pod",
        ] {
            assert!(
                !has_word(&code, decision),
                "{} uses {decision}: pod-level logic lives in resize/pod_level",
                f.display()
            );
        }
    }
}

#[test]
fn the_owner_parsers_read_fields_and_words() {
    let code = "pub struct A {\n    pub x: u32,\n    /// doc\n    y: Mutex<B>,\n}\n";
    let f = fields(struct_body(code, "A"));
    assert_eq!(f.len(), 2);
    assert_eq!(f[0], ("pub".into(), "x".into(), "u32".into()));
    assert_eq!(f[1].2, "Mutex<B>");
    assert!(has_word("use Engine;", "Engine") && !has_word("EngineX", "Engine"));
}
