//! Typed option values and their validation.
//!
//! Option keys and value syntax follow Flink: durations like `10 s`, `200ms`,
//! `1 min`; memory sizes like `64 mb`; booleans `true`/`false`. Every error
//! names the key and what would have been accepted.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::CatalogError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionKind {
    String,
    /// A file or directory (a `file://` prefix is allowed). Every option
    /// naming a path is of this kind, so a server's allowed directories
    /// (`weir serve --allow-dir`) cover it without a list to keep.
    Path,
    /// A [`OptionKind::Path`] or the URL of an object store (`s3://`,
    /// `gs://`, `az://`, `abfs://`): where checkpoints may go.
    Location,
    /// A non-negative or bounded integer.
    Int {
        min: i64,
        max: i64,
    },
    Bool,
    Duration,
    MemorySize,
    /// A finite decimal number >= 0 (a multiplier, a factor).
    Decimal,
    /// One of a fixed set of values, matched case-insensitively.
    Enum(&'static [&'static str]),
}

impl OptionKind {
    fn describe(&self) -> String {
        match self {
            OptionKind::String => "a string".into(),
            OptionKind::Path => "a file or directory path ('file://' allowed)".into(),
            OptionKind::Location => "a directory path, or an s3://, gs://, az:// or abfs:// URL".into(),
            OptionKind::Int { min, max } if *max == i64::MAX => format!("an integer >= {min}"),
            OptionKind::Int { min, max } => format!("an integer in {min}..={max}"),
            OptionKind::Bool => "'true' or 'false'".into(),
            OptionKind::Duration => "a duration such as '500 ms', '10 s', '1 min'".into(),
            OptionKind::MemorySize => "a memory size such as '64 mb', '2 gb'".into(),
            OptionKind::Decimal => "a decimal number >= 0 such as '1.5'".into(),
            OptionKind::Enum(values) => format!("one of {}", values.join(", ")),
        }
    }

    /// Checks `value` against the kind, returning a message on failure.
    pub fn check(&self, value: &str) -> Result<(), String> {
        if let Some(scheme) = foreign_scheme(value)
            && (matches!(self, OptionKind::Path) || (matches!(self, OptionKind::Location) && !is_object_store(scheme)))
        {
            // Never a local directory named `s3:`: a path of a scheme Weir
            // cannot open is refused, not taken literally.
            return Err(format!(
                "'{value}' names a '{scheme}://' location; Weir reads and writes local paths only \
                 (a plain path or 'file://')"
            ));
        }
        let ok = match self {
            OptionKind::String => true,
            OptionKind::Path | OptionKind::Location => !value.trim().is_empty(),
            OptionKind::Int { min, max } => value.trim().parse::<i64>().is_ok_and(|v| v >= *min && v <= *max),
            OptionKind::Bool => parse_bool(value).is_some(),
            OptionKind::Duration => parse_duration(value).is_some(),
            OptionKind::MemorySize => parse_memory_size(value).is_some(),
            OptionKind::Decimal => parse_decimal(value).is_some(),
            OptionKind::Enum(values) => values.iter().any(|v| v.eq_ignore_ascii_case(value.trim())),
        };
        if ok {
            Ok(())
        } else {
            Err(format!("invalid value '{value}', expected {}", self.describe()))
        }
    }
}

/// A finite decimal number >= 0.
fn parse_decimal(value: &str) -> Option<f64> {
    value.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

/// Schemes of the object stores a [`OptionKind::Location`] may name.
pub const OBJECT_STORE_SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "azure", "abfs", "abfss"];

/// Whether `scheme` (case-insensitive) is one of [`OBJECT_STORE_SCHEMES`].
pub fn is_object_store(scheme: &str) -> bool {
    OBJECT_STORE_SCHEMES.iter().any(|o| o.eq_ignore_ascii_case(scheme))
}

/// The scheme of a URL-like path value other than `file` (`s3` of
/// `s3://bucket/key`), if any.
pub fn foreign_scheme(value: &str) -> Option<&str> {
    let (scheme, _) = value.trim().split_once("://")?;
    let url_like = !scheme.is_empty()
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (url_like && !scheme.eq_ignore_ascii_case("file")).then_some(scheme)
}

/// One accepted option. A `*` in the key matches one dot-free segment
/// (e.g. datagen's `fields.*.kind`); a final `**` matches one or more
/// segments (Kafka's pass-through `properties.**`).
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    pub key: &'static str,
    pub kind: OptionKind,
    pub default: Option<&'static str>,
    pub description: &'static str,
}

impl OptionSpec {
    pub const fn new(key: &'static str, kind: OptionKind, description: &'static str) -> Self {
        Self {
            key,
            kind,
            default: None,
            description,
        }
    }

    pub const fn with_default(mut self, default: &'static str) -> Self {
        self.default = Some(default);
        self
    }

    pub fn matches(&self, key: &str) -> bool {
        let mut pattern = self.key.split('.');
        let mut actual = key.split('.');
        loop {
            match (pattern.next(), actual.next()) {
                (None, None) => return true,
                (Some("**"), Some(a)) => return !a.is_empty(),
                (Some("*"), Some(a)) if !a.is_empty() => {}
                (Some(p), Some(a)) if p == a => {}
                _ => return false,
            }
        }
    }
}

/// Options that passed validation against a list of [`OptionSpec`]s, with
/// typed getters that fall back to the spec's default.
#[derive(Debug, Clone, Default)]
pub struct Options {
    values: BTreeMap<String, String>,
    specs: Vec<OptionSpec>,
    context: String,
}

impl Options {
    /// Validates every key and value of `values` against `specs`.
    /// `context` names the owner in errors, e.g. "connector 'nexmark'".
    pub fn validate(
        values: &BTreeMap<String, String>,
        specs: &[OptionSpec],
        context: &str,
    ) -> Result<Self, CatalogError> {
        for (key, value) in values {
            let spec = specs
                .iter()
                .find(|s| s.matches(key))
                .ok_or_else(|| CatalogError::UnknownOption {
                    key: key.clone(),
                    context: context.to_string(),
                    accepted: specs.iter().map(|s| s.key).collect::<Vec<_>>().join(", "),
                })?;
            spec.kind.check(value).map_err(|message| CatalogError::InvalidOption {
                key: key.clone(),
                // A secret's value is never echoed.
                message: if is_secret_key(key) {
                    format!("invalid value '{MASK}', expected {}", spec.kind.describe())
                } else {
                    message
                },
            })?;
        }
        Ok(Self {
            values: values.clone(),
            specs: specs.to_vec(),
            context: context.to_string(),
        })
    }

    pub fn raw(&self) -> &BTreeMap<String, String> {
        &self.values
    }

    /// The value given, or the spec's default.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values
            .get(key)
            .map(String::as_str)
            .or_else(|| self.specs.iter().find(|s| s.matches(key)).and_then(|s| s.default))
    }

    pub fn require(&self, key: &str) -> Result<&str, CatalogError> {
        self.get(key).ok_or_else(|| CatalogError::MissingOption {
            key: key.to_string(),
            context: self.context.clone(),
        })
    }

    fn typed<T>(&self, key: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Option<T>, CatalogError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => parse(v).map(Some).ok_or_else(|| CatalogError::InvalidOption {
                key: key.to_string(),
                message: format!("invalid value '{}'", shown(key, v)),
            }),
        }
    }

    pub fn i64(&self, key: &str) -> Result<Option<i64>, CatalogError> {
        self.typed(key, |v| v.trim().parse().ok())
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, CatalogError> {
        self.typed(key, parse_bool)
    }

    pub fn duration(&self, key: &str) -> Result<Option<Duration>, CatalogError> {
        self.typed(key, parse_duration)
    }

    pub fn memory_size(&self, key: &str) -> Result<Option<u64>, CatalogError> {
        self.typed(key, parse_memory_size)
    }

    pub fn decimal(&self, key: &str) -> Result<Option<f64>, CatalogError> {
        self.typed(key, parse_decimal)
    }

    /// Enum values are returned lower-cased.
    pub fn enum_value(&self, key: &str) -> Option<String> {
        self.get(key).map(|v| v.trim().to_ascii_lowercase())
    }

    /// Keys given that start with `prefix`.
    pub fn keys_with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a str> {
        self.values
            .keys()
            .filter(move |k| k.starts_with(prefix))
            .map(String::as_str)
    }
}

/// Option keys whose values are secrets (Flink masks the same ones): such
/// values are never shown in listings, errors or logs.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    // A private key inline (`properties.ssl.key.pem`), a registry's
    // `basic-auth.user-info`, cloud credentials.
    [
        "password",
        "secret",
        "sasl.jaas.config",
        "token",
        "ssl.key",
        "private",
        "credential",
        "user-info",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// What is shown in place of a secret.
pub const MASK: &str = "******";

/// `value`, or the mask when `key` names a secret.
pub fn shown<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret_key(key) { MASK } else { value }
}

pub fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// Flink's duration syntax: a number and an optional unit (default ms).
pub fn parse_duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().ok()?;
    let ms = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => n,
        "s" | "sec" | "secs" | "second" | "seconds" => n.checked_mul(1_000)?,
        "m" | "min" | "mins" | "minute" | "minutes" => n.checked_mul(60_000)?,
        "h" | "hour" | "hours" => n.checked_mul(3_600_000)?,
        "d" | "day" | "days" => n.checked_mul(86_400_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

/// Flink's memory size syntax: a number and an optional unit (default bytes).
pub fn parse_memory_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" => 1,
        "k" | "kb" | "kibibytes" => 1 << 10,
        "m" | "mb" | "mebibytes" => 1 << 20,
        "g" | "gb" | "gibibytes" => 1 << 30,
        "t" | "tb" | "tebibytes" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_takes_object_store_urls_and_a_path_does_not() {
        assert!(OptionKind::Location.check("s3://bucket/prefix").is_ok());
        assert!(OptionKind::Location.check("abfss://c@a.dfs.core.windows.net/p").is_ok());
        assert!(OptionKind::Location.check("/var/lib/weir").is_ok());
        assert!(OptionKind::Location.check("hdfs://nn/x").is_err());
        assert!(OptionKind::Path.check("s3://bucket/prefix").is_err());
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("200"), Some(Duration::from_millis(200)));
        assert_eq!(parse_duration("10 s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1min"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("ten"), None);
        assert_eq!(parse_duration("5 fortnights"), None);
        assert_eq!(parse_memory_size("2 gb"), Some(2 << 30));
        assert_eq!(parse_memory_size("-1"), None);
    }

    #[test]
    fn unknown_and_invalid_options_name_the_key() {
        let specs = [
            OptionSpec::new("rows-per-second", OptionKind::Int { min: 1, max: i64::MAX }, ""),
            OptionSpec::new("fields.*.kind", OptionKind::Enum(&["random", "sequence"]), ""),
        ];
        let mut m = BTreeMap::new();
        m.insert("fields.a.kind".to_string(), "SEQUENCE".to_string());
        Options::validate(&m, &specs, "connector 'datagen'").expect("valid");
        m.insert("rows-per-second".into(), "0".into());
        let e = Options::validate(&m, &specs, "connector 'datagen'").expect_err("invalid");
        assert!(e.to_string().contains("'rows-per-second'"), "{e}");
        let mut m = BTreeMap::new();
        m.insert("fields.a.b.kind".to_string(), "random".to_string());
        let e = Options::validate(&m, &specs, "connector 'datagen'").expect_err("unknown");
        assert!(e.to_string().contains("unknown option 'fields.a.b.kind'"), "{e}");
    }
}
