//! Allowed directories: where the SQL of a job may make Weir read or write
//! files (`weir serve --allow-dir`).
//!
//! Every option whose kind is [`OptionKind::Path`] — a filesystem table's
//! `path`, a dead-letter directory, `execution.checkpointing.dir`,
//! `execution.state-recovery.path`, and any path option added later — is
//! resolved the way the operating system would resolve it (a `file://`
//! prefix dropped, relative to the working directory, `..` and symlinks
//! followed) and must then lie inside one of the allowed directories.
//!
//! Resolution canonicalises the longest part of the path that exists
//! (symlinks and `..` resolved by the OS) and applies the rest, which does
//! not exist and so cannot hold a symlink, component by component. A file
//! swapped for a symlink between the check and the open is not covered:
//! the allowed directories are the server's own, not writable by clients
//! except through Weir, which writes only regular files.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use weir_catalog::{OptionKind, OptionSpec};

/// The job options that name a directory of the job's own (checkpoints,
/// savepoints, a restore): `config` reads them, the policy lets them
/// under the data directory.
pub const CHECKPOINT_DIR: &str = "execution.checkpointing.dir";
/// Where `s3://` locations are served (see `config.rs`).
pub const S3_ENDPOINT: &str = "s3.endpoint";
pub const RECOVERY_PATH: &str = "execution.state-recovery.path";
pub const SAVEPOINT_DIR: &str = "execution.checkpointing.savepoint-dir";
/// The `filesystem` connector's table location.
pub const TABLE_PATH: &str = "path";

/// Where paths may point: anywhere (the embedded shell, `weir run`) or
/// inside a set of canonical directories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathPolicy {
    allowed: Option<Arc<[PathBuf]>>,
    /// Object-store locations allowed (`--allow-dir s3://bucket/prefix`),
    /// normalised by [`normalize_url`]; only with `allowed`.
    buckets: Arc<[String]>,
    /// Weir's own state inside an allowed data dir (catalog, job state,
    /// registry, checkpoints, savepoints): no path option may point into
    /// it or above it, or a client could read the catalog or have a job's
    /// fresh start delete every job's state.
    reserved: Arc<[PathBuf]>,
    /// Whether a restricted session's connector client properties may
    /// load code or run commands (`weir serve --allow-client-plugins`);
    /// never without the administrator's flag. See
    /// `connectors::kafka::client_properties`.
    client_plugins: bool,
}

/// The entries of a data dir that are Weir's own.
const DATA_DIR_ENTRIES: &[&str] = &["catalog.json", "jobs", "server", "checkpoints", "savepoints"];

/// Below `<data-dir>/checkpoints` a job's checkpoint directory and a
/// recovery path are at home.
const CHECKPOINTS: &str = "checkpoints";
const SAVEPOINTS: &str = "savepoints";

/// A path option that points outside the allowed directories (or cannot
/// be resolved to decide): the user's request is refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("option '{key}': {reason}")]
pub struct PathDenied {
    pub key: String,
    pub reason: String,
}

impl PathPolicy {
    /// No restriction.
    pub fn unrestricted() -> Self {
        Self::default()
    }

    /// Only inside `dirs` (each local one must exist; it is canonicalised
    /// now) and below the object-store URLs among them.
    pub fn allow(dirs: &[PathBuf]) -> Result<Self, String> {
        let mut allowed = Vec::with_capacity(dirs.len());
        let mut buckets = vec![];
        for d in dirs {
            let text = d.to_string_lossy();
            if is_object_url(&text) {
                buckets.push(normalize_url(&text).map_err(|e| format!("allowed location {text}: {e}"))?);
                continue;
            }
            let c = std::fs::canonicalize(d).map_err(|e| format!("allowed directory {}: {e}", d.display()))?;
            if !c.is_dir() {
                return Err(format!("allowed directory {}: not a directory", d.display()));
            }
            allowed.push(c);
        }
        Ok(Self {
            allowed: Some(allowed.into()),
            buckets: buckets.into(),
            reserved: Arc::default(),
            client_plugins: false,
        })
    }

    /// Lets client properties load code and run commands (librdkafka's
    /// `plugin.library.paths`, `sasl.kerberos.kinit.cmd`, ...): the
    /// server's administrator trusts every client with the server's
    /// process.
    pub fn allowing_client_plugins(mut self) -> Self {
        self.client_plugins = true;
        self
    }

    /// Whether client properties may load code or run commands: always
    /// when unrestricted (the local shell, `weir run`), else only when the
    /// administrator allowed it.
    pub fn client_plugins_allowed(&self) -> bool {
        !self.is_restricted() || self.client_plugins
    }

    /// Reserves the data dir's own entries (see [`PathPolicy`]).
    pub fn reserving(mut self, data_dir: &Path) -> Self {
        let base = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
        self.reserved = DATA_DIR_ENTRIES.iter().map(|e| base.join(e)).collect();
        self
    }

    /// Also reserves `path` (a server's catalog file outside its data dir):
    /// never readable or writable through SQL.
    pub fn reserving_file(mut self, path: &Path) -> Self {
        let canonical = path
            .parent()
            .and_then(|d| std::fs::canonicalize(d).ok())
            .and_then(|d| path.file_name().map(|n| d.join(n)))
            .unwrap_or_else(|| path.to_path_buf());
        self.reserved = self
            .reserved
            .iter()
            .cloned()
            .chain(std::iter::once(canonical))
            .collect();
        self
    }

    pub fn is_restricted(&self) -> bool {
        self.allowed.is_some()
    }

    /// The allowed directories (none when unrestricted).
    pub fn dirs(&self) -> &[PathBuf] {
        self.allowed.as_deref().unwrap_or_default()
    }

    /// Narrows this policy to `dirs`, each of which must itself be allowed
    /// (a session may restrict itself further, never widen).
    pub fn narrow(&self, key: &str, dirs: &[PathBuf]) -> Result<Self, PathDenied> {
        let mut out = Vec::with_capacity(dirs.len());
        let mut buckets = vec![];
        for d in dirs {
            let text = d.to_string_lossy();
            if is_object_url(&text) {
                // Allowed only below an allowed location (checked there).
                buckets.push(self.check(CHECKPOINT_DIR, &text)?.to_string_lossy().into_owned());
                continue;
            }
            let resolved = self.check(key, &text)?;
            if !resolved.is_dir() {
                return Err(PathDenied {
                    key: key.to_string(),
                    reason: format!("'{}' is not a directory", d.display()),
                });
            }
            out.push(resolved);
        }
        Ok(Self {
            allowed: Some(out.into()),
            buckets: buckets.into(),
            reserved: self.reserved.clone(),
            client_plugins: self.client_plugins,
        })
    }

    /// Resolves `value` (the value of option `key`) and checks it is inside
    /// an allowed directory; returns the resolved path.
    pub fn check(&self, key: &str, value: &str) -> Result<PathBuf, PathDenied> {
        let denied = |reason: String| PathDenied {
            key: key.to_string(),
            reason,
        };
        if is_object_url(value) {
            if !matches!(key, CHECKPOINT_DIR | SAVEPOINT_DIR | RECOVERY_PATH | TABLE_PATH) {
                return Err(denied(format!(
                    "'{value}' is an object-store URL; only checkpoint and savepoint locations and a table's path take one"
                )));
            }
            if self.allowed.is_none() {
                return Ok(PathBuf::from(value.trim()));
            }
            // A server's client reaches a bucket with the server's
            // credentials: only below the locations it was given.
            let url = normalize_url(value).map_err(denied)?;
            let inside = self
                .buckets
                .iter()
                .any(|b| url == *b || url.strip_prefix(b.as_str()).is_some_and(|rest| rest.starts_with('/')));
            if !inside {
                return Err(denied(if self.buckets.is_empty() {
                    format!(
                        "'{value}' is an object-store URL, and this server allows no object-store location \
                         (its administrator names them with --allow-dir s3://bucket/prefix)"
                    )
                } else {
                    format!(
                        "'{value}' is not below an object-store location this server allows ({})",
                        self.buckets.join(", ")
                    )
                }));
            }
            return Ok(PathBuf::from(url));
        }
        let resolved = resolve(value).map_err(denied)?;
        for r in self.reserved.iter() {
            // Checkpoints and savepoints may go where Weir keeps them by
            // default, and be restored from there.
            let at_home = ((matches!(key, CHECKPOINT_DIR | RECOVERY_PATH) && r.ends_with(CHECKPOINTS))
                || (matches!(key, SAVEPOINT_DIR | RECOVERY_PATH) && r.ends_with(SAVEPOINTS)))
                && resolved.starts_with(r);
            if !at_home && (resolved.starts_with(r) || r.starts_with(&resolved)) {
                return Err(denied(format!(
                    "'{value}' is or holds Weir's own state ({}); name a directory of its own",
                    r.display()
                )));
            }
        }
        let Some(allowed) = &self.allowed else {
            return Ok(resolved);
        };
        if allowed.iter().any(|d| resolved.starts_with(d)) {
            return Ok(resolved);
        }
        let dirs: Vec<String> = allowed.iter().map(|d| d.display().to_string()).collect();
        Err(denied(format!(
            "'{value}' resolves to {}, outside the allowed directories ({}); \
             the server's administrator can allow more with --allow-dir",
            resolved.display(),
            if dirs.is_empty() {
                "none".to_string()
            } else {
                dirs.join(", ")
            }
        )))
    }

    /// Checks every option of kind [`OptionKind::Path`] among `values`
    /// (described by `specs`; wildcard specs such as `fields.*.kind` are
    /// not paths).
    pub fn check_options(&self, values: &BTreeMap<String, String>, specs: &[OptionSpec]) -> Result<(), PathDenied> {
        if !self.is_restricted() {
            return Ok(());
        }
        for (key, value) in values {
            // An endpoint is where the server would connect, with its own
            // credentials: a client of a restricting server names none.
            if key.eq_ignore_ascii_case(S3_ENDPOINT) {
                return Err(PathDenied {
                    key: key.clone(),
                    reason: format!(
                        "'{value}': this server connects only to the object stores its administrator configured"
                    ),
                });
            }
            let is_path = specs
                .iter()
                .any(|s| s.key.eq_ignore_ascii_case(key) && matches!(s.kind, OptionKind::Path | OptionKind::Location));
            if is_path {
                self.check(key, value)?;
            }
        }
        Ok(())
    }
}

/// URL schemes of object stores (`s3://bucket/prefix`, `gs://`, `az://`,
/// `abfs://`); `file://` is a local path.
pub fn is_object_url(value: &str) -> bool {
    weir_catalog::options::foreign_scheme(value).is_some_and(weir_catalog::options::is_object_store)
}

/// `value`, an object-store URL, in the one form a location check
/// compares: the scheme in lower case (`s3a` as `s3`), no trailing `/`,
/// and no segment that is empty, `.` or `..` (a store takes those as
/// names, a reader might not), nor a query or fragment.
pub fn normalize_url(value: &str) -> Result<String, String> {
    let trimmed = value.trim().trim_end_matches('/');
    let (scheme, rest) = trimmed
        .split_once("://")
        .ok_or_else(|| format!("'{value}' is not a URL"))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "s3a" => "s3".to_string(),
        s => s.to_string(),
    };
    if rest.contains(['?', '#', '\0', '\\']) {
        return Err(format!(
            "'{value}' holds a character a location may not ('?', '#', '\\' or NUL)"
        ));
    }
    let segments: Vec<&str> = rest.split('/').collect();
    if segments.iter().any(|s| s.is_empty() || *s == "." || *s == "..") {
        return Err(format!("'{value}' has an empty, '.' or '..' segment"));
    }
    Ok(format!("{scheme}://{}", segments.join("/")))
}

/// A path option's value as the path Weir opens: trimmed, a `file://`
/// prefix (any case) dropped. Every reader of a path option goes through
/// this, so what is checked is what is opened.
pub fn local_path(value: &str) -> PathBuf {
    PathBuf::from(strip_scheme(value))
}

fn strip_scheme(value: &str) -> &str {
    let trimmed = value.trim();
    match trimmed.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("file://") => &trimmed[7..],
        _ => trimmed,
    }
}

/// The path `value` names, as the OS would open it.
pub fn resolve(value: &str) -> Result<PathBuf, String> {
    let raw = strip_scheme(value);
    if raw.contains("://") {
        return Err(format!(
            "'{value}' is not a local path (only file:// and plain paths are supported)"
        ));
    }
    if raw.is_empty() {
        return Err("the path is empty".to_string());
    }
    if raw.contains('\0') {
        return Err("the path contains a NUL character".to_string());
    }
    let path = Path::new(raw);
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("cannot resolve the relative path '{value}': {e}"))?
            .join(path)
    };
    // The longest existing ancestor, canonicalised by the OS (symlinks and
    // `..` inside it resolved); the rest does not exist.
    let mut existing = absolute.as_path();
    let mut rest: Vec<Component> = vec![];
    let base = loop {
        match std::fs::canonicalize(existing) {
            Ok(c) => break c,
            // A symlink whose target is missing: following it later could
            // create the target anywhere.
            Err(_) if std::fs::symlink_metadata(existing).is_ok_and(|m| m.file_type().is_symlink()) => {
                return Err(format!(
                    "'{value}' goes through a symlink whose target does not exist ({})",
                    existing.display()
                ));
            }
            Err(_) => {
                let Some(parent) = existing.parent() else {
                    return Err(format!("cannot resolve '{value}'"));
                };
                if let Some(last) = existing.components().next_back() {
                    rest.push(last);
                }
                existing = parent;
            }
        }
    };
    let mut out = base;
    for c in rest.into_iter().rev() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checkpoint and savepoint locations take object-store URLs; where
    /// paths are restricted, only below a location the server was given:
    /// a server's client cannot reach a bucket with the server's
    /// credentials.
    #[test]
    fn object_store_urls_are_checkpoint_and_savepoint_locations_below_allowed_ones() {
        let url = "s3://bucket/checkpoints";
        assert_eq!(
            PathPolicy::unrestricted().check(CHECKPOINT_DIR, url).expect("allowed"),
            PathBuf::from(url)
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let restricted = PathPolicy::allow(&[dir.path().to_path_buf()]).expect("policy");
        let e = restricted.check(CHECKPOINT_DIR, url).expect_err("a bucket");
        assert!(
            e.to_string().contains(CHECKPOINT_DIR) && e.to_string().contains("--allow-dir"),
            "{e}"
        );
        // Allowed locations: at or below them, in any spelling of the
        // same location; never beside, above, or through `..`.
        let given = PathPolicy::allow(&[dir.path().to_path_buf(), PathBuf::from("s3://bucket/jobs/")]).expect("policy");
        for ok in [
            "s3://bucket/jobs",
            "s3://bucket/jobs/q5",
            "S3://bucket/jobs/q5/",
            "s3a://bucket/jobs/q5",
        ] {
            assert!(given.check(CHECKPOINT_DIR, ok).is_ok(), "{ok}");
            assert!(given.check(SAVEPOINT_DIR, ok).is_ok(), "{ok}");
            assert!(given.check(RECOVERY_PATH, ok).is_ok(), "{ok}");
        }
        for bad in [
            "s3://bucket",
            "s3://bucket/jobs2",
            "s3://bucket/jobs/../other",
            "s3://bucket/jobs//x",
            "s3://bucket/jobs/./x",
            "s3://other/jobs",
            "gs://bucket/jobs",
            "s3://bucket/jobs/x?versionId=1",
        ] {
            let e = given.check(CHECKPOINT_DIR, bad).expect_err(bad);
            assert!(e.to_string().contains(CHECKPOINT_DIR), "{e}");
        }
        // A table's path too, and as narrowly.
        assert!(given.check(TABLE_PATH, "s3://bucket/jobs/t").is_ok());
        assert!(given.check(TABLE_PATH, "s3://bucket/t").is_err());
        assert!(
            given.check("scan.dead-letter.path", "s3://bucket/jobs/t").is_err(),
            "dead letters are local"
        );
        let narrowed = given
            .narrow("weir.allowed-dirs", &[PathBuf::from("s3://bucket/jobs/team-a")])
            .expect("narrow");
        assert!(narrowed.check(CHECKPOINT_DIR, "s3://bucket/jobs/team-a/q1").is_ok());
        assert!(narrowed.check(CHECKPOINT_DIR, "s3://bucket/jobs/team-b").is_err());
        assert!(
            given
                .narrow("weir.allowed-dirs", &[PathBuf::from("s3://bucket/other")])
                .is_err(),
            "a session cannot widen"
        );
        let endpoint: BTreeMap<String, String> =
            [(S3_ENDPOINT.to_string(), "http://169.254.169.254".to_string())].into();
        let e = restricted.check_options(&endpoint, &[]).expect_err("an endpoint");
        assert!(e.to_string().contains(S3_ENDPOINT), "{e}");
        assert!(PathPolicy::unrestricted().check_options(&endpoint, &[]).is_ok());
        assert!(
            PathPolicy::unrestricted()
                .check(SAVEPOINT_DIR, "gs://bucket/sp")
                .is_ok()
        );
        let e = PathPolicy::unrestricted()
            .check("sink.dead-letter.path", "gs://bucket/t")
            .expect_err("local only");
        assert!(e.to_string().contains("only"), "{e}");
    }

    #[test]
    fn resolves_traversal_through_missing_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        let p = format!("{}/missing/../../x", root.display());
        assert_eq!(resolve(&p), Ok(root.parent().expect("parent").join("x")));
        let policy = PathPolicy::allow(std::slice::from_ref(&root)).expect("policy");
        assert!(policy.check("path", &p).is_err());
        assert!(policy.check("path", &format!("{}/a/b/../c", root.display())).is_ok());
        assert!(policy.check("path", &format!("FILE://{}/in", root.display())).is_ok());
        // No object-store location allowed.
        assert!(policy.check("path", "s3://bucket/x").is_err());
    }

    #[test]
    fn follows_symlinks_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        let inside = root.join("allowed");
        std::fs::create_dir(&inside).expect("mkdir");
        std::os::unix::fs::symlink("/etc", inside.join("link")).expect("symlink");
        let policy = PathPolicy::allow(std::slice::from_ref(&inside)).expect("policy");
        let e = policy
            .check("path", &format!("{}/link/passwd", inside.display()))
            .expect_err("symlink out");
        assert!(e.reason.contains("/etc/passwd"), "{e}");
        // A sibling whose name starts with the allowed one is not inside.
        std::fs::create_dir(root.join("allowed2")).expect("mkdir");
        assert!(policy.check("path", &format!("{}/allowed2/x", root.display())).is_err());
    }
}
