//! The crates follow the pipeline and the dependency graph points down
//! (docs/architecture.md): weir → weir-sql → weir-engine → weir-catalog.
//! An edge not listed here fails the test.

use std::collections::BTreeSet;

const ALLOWED: &[(&str, &str)] = &[
    ("weir", "weir-sql"),
    ("weir", "weir-engine"),
    ("weir", "weir-catalog"),
    ("weir-sql", "weir-engine"),
    ("weir-sql", "weir-catalog"),
    ("weir-engine", "weir-catalog"),
];

/// The workspace crates a manifest's `[dependencies]` name.
fn internal_deps(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_deps = t == "[dependencies]";
            continue;
        }
        if in_deps && t.starts_with("weir-") {
            out.extend(t.split(['.', ' ', '=']).next().map(str::to_string));
        }
    }
    out
}

#[test]
fn dependencies_point_down_the_pipeline() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (krate, path) in [
        ("weir", "Cargo.toml"),
        ("weir-sql", "sql/Cargo.toml"),
        ("weir-engine", "engine/Cargo.toml"),
        ("weir-catalog", "catalog/Cargo.toml"),
    ] {
        let manifest = std::fs::read_to_string(root.join(path)).expect("manifest");
        for dep in internal_deps(&manifest) {
            assert!(
                ALLOWED.contains(&(krate, dep.as_str())),
                "{krate} depends on {dep}: not an edge of the pipeline (see docs/architecture.md)"
            );
        }
    }
    assert!(
        internal_deps("[dependencies]\nweir-engine.workspace = true\n[dev-dependencies]\nweir-sql = 1")
            .contains("weir-engine")
    );
}

/// Each dependency with its enabled features, as `cargo tree` lists them
/// (a crate built for the host, for a build script or a macro, may be
/// listed again with other features).
fn features(args: &[&str]) -> BTreeSet<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--locked",
            "--offline",
            // The host's crates only: `--target all` needs every
            // platform's crates downloaded, and a fresh machine's build
            // fetched only its own.
            "--prefix",
            "none",
            "-f",
            "{p}|{f}",
        ])
        .args(args)
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(p, f)| {
            let p = p.split(" (").next().unwrap_or(p).trim().to_string();
            let f = f.split(" (").next().unwrap_or(f).trim().to_string();
            (p, f)
        })
        .collect()
}

/// The README's two commands share one build: every crate the binary
/// needs is built with the features the test build gives it. A feature
/// only a dev-dependency turns on (tokio's `test-util` did) made
/// `cargo run` after `cargo test` rebuild tokio and all above it.
#[test]
fn the_binary_and_the_tests_build_the_same_dependencies() {
    let tests = features(&["--workspace", "-e", "normal,build,dev"]);
    let binary = features(&["-p", "weir", "-e", "normal,build"]);
    let differ: Vec<String> = binary
        .difference(&tests)
        .map(|(p, f)| {
            let t: Vec<&str> = tests.iter().filter(|(q, _)| q == p).map(|(_, f)| f.as_str()).collect();
            format!("{p}: binary [{f}], tests {t:?}")
        })
        .collect();
    assert!(
        differ.is_empty(),
        "features differ between `cargo run --bin weir` and `cargo test --workspace` (turn them on in \
         the workspace's [dependencies] too):\n{}",
        differ.join("\n")
    );
}

/// A crate's modules (by path, `a::b`) and the modules each one names
/// through `crate::` or `super::` paths, outside comments and test
/// modules. A module naming its own ancestor or descendant is no edge
/// (a `mod.rs` holds what its children share).
fn module_graph(src: &std::path::Path) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = vec![];
    walk(src, &mut files);
    let mut modules = std::collections::BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).expect("under src").with_extension("");
        let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        if parts.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
            parts.pop();
        }
        modules.insert(parts.join("::"), f.clone());
    }
    let related = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"));
    // The longest module prefix of a path.
    let module_of = |segs: &[String]| -> Option<String> {
        (1..=segs.len())
            .rev()
            .map(|k| segs[..k].join("::"))
            .find(|c| modules.contains_key(c))
    };
    let mut graph = std::collections::BTreeMap::new();
    for (m, f) in &modules {
        let text = std::fs::read_to_string(f).expect("source");
        let text = match text.find("#[cfg(test)]\nmod ") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut edges = BTreeSet::new();
        // `super` of `a::x` (a/x.rs) and of `a::x` (a/x/mod.rs) is `a`.
        let mut parent: Vec<String> = m.split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
        parent.pop();
        for (anchor, base) in [("crate::", vec![]), ("super::", parent)] {
            let mut rest = code.as_str();
            while let Some(i) = rest.find(anchor) {
                let before = rest[..i].chars().last();
                rest = &rest[i + anchor.len()..];
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let mut base = base.clone();
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
                // One path, or each path of a `prefix::{a, b::c}` group.
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                let prefix = &rest[..end];
                let paths: Vec<String> = match rest[end..].strip_prefix('{') {
                    Some(group) if prefix.is_empty() || prefix.ends_with("::") => {
                        let close = group.find('}').unwrap_or(group.len());
                        group[..close]
                            .split(',')
                            .map(|p| format!("{prefix}{}", p.trim()))
                            .collect()
                    }
                    _ => vec![prefix.to_string()],
                };
                for p in paths {
                    let mut segs = base.clone();
                    segs.extend(p.split("::").filter(|s| !s.is_empty()).map(str::to_string));
                    if let Some(target) = module_of(&segs).filter(|t| !t.is_empty() && !related(m, t)) {
                        edges.insert(target);
                    }
                }
            }
        }
        graph.insert(m.clone(), edges);
    }
    graph
}

/// The cycles of a graph: its strongly connected components of more
/// than one module (Tarjan's, iteratively small enough to recurse).
fn cycles(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a std::collections::BTreeMap<String, BTreeSet<String>>,
        index: std::collections::HashMap<&'a str, usize>,
        low: std::collections::HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut c = vec![];
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                c.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                t.out.push(c);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: Default::default(),
        low: Default::default(),
        stack: vec![],
        on: BTreeSet::new(),
        out: vec![],
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// No import circles between the modules of a crate: each cycle found is
/// listed with the edges that make it.
#[test]
fn no_module_imports_another_that_imports_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = vec![];
    for src in ["src", "sql/src", "engine/src", "catalog/src"] {
        let graph = module_graph(&root.join(src));
        for c in cycles(&graph) {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|w| c.contains(w))
                        .map(move |w| format!("{m} -> {w}"))
                })
                .collect();
            found.push(format!("{src}: {}", edges.join(", ")));
        }
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).expect("dir");
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").expect("write");
    std::fs::write(src.join("a/mod.rs"), "mod x; pub use x::X;").expect("write");
    std::fs::write(
        src.join("a/x.rs"),
        "use super::super::c::{C, D};\nuse crate::b::Y; // crate::c::Z in a comment",
    )
    .expect("write");
    std::fs::write(src.join("b.rs"), "use crate::a::x::X;").expect("write");
    std::fs::write(
        src.join("c.rs"),
        "pub struct C;\n#[cfg(test)]\nmod tests { use crate::a::A; }",
    )
    .expect("write");
    let g = module_graph(src);
    assert_eq!(g["a::x"], BTreeSet::from(["b".to_string(), "c".to_string()]));
    assert!(g["c"].is_empty(), "test modules are not edges");
    assert!(g["a"].is_empty(), "a parent naming its child is not an edge");
    assert_eq!(cycles(&g), vec![vec!["a::x".to_string(), "b".to_string()]]);
}
