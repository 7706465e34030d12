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
