//! What a table's `properties.*` may hand to librdkafka when the session
//! is restricted (`weir serve`): the client library runs inside the
//! server, so a property that loads code, runs a command or opens a file
//! is the client's request to do that in the server's process.
//!
//! - Properties that load code or run commands are refused for every
//!   client unless the server's administrator allowed them
//!   (`weir serve --allow-client-plugins`).
//! - Properties that name files are paths like every `OptionKind::Path`
//!   option: they must resolve inside the allowed directories.
//! - Every other property passes (librdkafka has hundreds, none of which
//!   touches code or files): the rule is a denylist plus a list of paths,
//!   read from librdkafka's CONFIGURATION.md (2.12), aliases included
//!   (none of these has one).
//!
//! Checked when a table is created and again when a job is built, so a
//! table from an older catalog or a job resumed under a stricter server
//! is checked too. librdkafka matches names exactly; the check ignores
//! case and surrounding blanks, so it refuses more than librdkafka would
//! take, never less.

use crate::paths::{PathDenied, PathPolicy};

/// Properties that make librdkafka load a shared library or start a
/// process (any property ending in `.cmd` too).
const CODE: &[&str] = &[
    // dlopen()s each library listed.
    "plugin.library.paths",
    // OpenSSL engines and providers are shared libraries loaded by path
    // or by name.
    "ssl.engine.location",
    "ssl.engine.id",
    "ssl.providers",
];

/// Properties whose value is a file or directory the client opens.
const PATHS: &[&str] = &[
    "ssl.key.location",
    "ssl.certificate.location",
    "ssl.ca.location",
    "ssl.crl.location",
    "ssl.keystore.location",
    "https.ca.location",
    "sasl.kerberos.keytab",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.file",
    "sasl.oauthbearer.assertion.jwt.template.file",
    "offset.store.path",
];

/// A CA location that is not a path: librdkafka probes the system's
/// standard certificate locations.
const PROBE: &str = "probe";

/// Whether client property `name` (without `properties.`) loads code or
/// runs a command.
pub fn loads_code(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    CODE.contains(&name.as_str()) || name.ends_with(".cmd")
}

/// Whether client property `name` names a file.
pub fn names_file(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    PATHS.contains(&name.as_str())
}

/// Checks every `properties.*` option among `options` (table option keys
/// and values) against `policy`.
pub fn check<'a>(
    options: impl IntoIterator<Item = (&'a String, &'a String)>,
    policy: &PathPolicy,
) -> Result<(), PathDenied> {
    if !policy.is_restricted() {
        return Ok(());
    }
    for (key, value) in options {
        let Some(name) = key.strip_prefix("properties.") else {
            continue;
        };
        if loads_code(name) && !policy.client_plugins_allowed() {
            return Err(PathDenied {
                key: key.clone(),
                reason: "makes the Kafka client load code or run a command inside the server, \
                         which no client may ask for; the server's administrator can allow it \
                         with --allow-client-plugins"
                    .to_string(),
            });
        }
        if names_file(name) {
            if value.trim().eq_ignore_ascii_case(PROBE) && name.trim().ends_with("ca.location") {
                continue;
            }
            // librdkafka opens the value as it is: a `file://` prefix
            // would be a relative directory to it, not the path checked.
            if value.contains("://") {
                return Err(PathDenied {
                    key: key.clone(),
                    reason: format!("'{value}' is not a plain file path (librdkafka opens the value as it is)"),
                });
            }
            policy.check(key, value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn code_and_command_properties_are_refused_unless_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let policy = PathPolicy::allow(&[dir.path().to_path_buf()]).expect("policy");
        for key in [
            "properties.plugin.library.paths",
            "properties.sasl.kerberos.kinit.cmd",
            "properties.ssl.engine.location",
            "properties.ssl.providers",
            "properties.PLUGIN.library.paths",
            "properties.some.future.cmd",
        ] {
            let inside = format!("{}/lib.so", dir.path().display());
            let e = check(&options(&[(key, &inside)]), &policy).expect_err(key);
            assert_eq!(e.key, key);
            assert!(e.reason.contains("--allow-client-plugins"), "{e}");
            assert!(check(&options(&[(key, &inside)]), &policy.clone().allowing_client_plugins()).is_ok());
            assert!(check(&options(&[(key, &inside)]), &PathPolicy::unrestricted()).is_ok());
        }
    }

    #[test]
    fn file_properties_are_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let policy = PathPolicy::allow(&[dir.path().to_path_buf()]).expect("policy");
        let inside = format!("{}/ca.pem", dir.path().display());
        for name in PATHS {
            let key = format!("properties.{name}");
            assert!(check(&options(&[(&key, &inside)]), &policy).is_ok(), "{key}");
            let e = check(&options(&[(&key, "/etc/passwd")]), &policy).expect_err(&key);
            assert_eq!(e.key, key);
            assert!(e.reason.contains("outside the allowed directories"), "{e}");
            let e = check(&options(&[(&key, &format!("file://{inside}"))]), &policy).expect_err(&key);
            assert!(e.reason.contains("plain file path"), "{e}");
        }
        assert!(check(&options(&[("properties.ssl.ca.location", "probe")]), &policy).is_ok());
        // Unknown properties and other options pass.
        assert!(
            check(
                &options(&[("properties.fetch.wait.max.ms", "/etc/passwd"), ("path", "/etc")]),
                &policy
            )
            .is_ok()
        );
    }
}
