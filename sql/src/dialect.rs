//! The SQL dialect and the catalog's names for parsed objects: a leaf the
//! parser and the hint readers both use.

use sqlparser::ast::ObjectName;
use sqlparser::dialect::GenericDialect;

/// The dialect: generic, which accepts Flink's backtick identifiers.
pub fn dialect() -> GenericDialect {
    GenericDialect {}
}

/// A table or view name as the catalog keys it (`db.t`, quotes dropped).
pub(crate) fn object_name(name: &ObjectName) -> String {
    name.0
        .iter()
        .map(|p| p.as_ident().map_or_else(|| p.to_string(), |i| i.value.clone()))
        .collect::<Vec<_>>()
        .join(".")
}
