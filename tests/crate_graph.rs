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
        .args(["tree", "--locked", "--offline", "--target", "all", "--prefix", "none", "-f", "{p}|{f}"])
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
