//! SQL errors: the user's fault unless `Internal`, with a position when the
//! parser or planner knows one.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: u64,
    pub column: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not valid SQL.
    Parse,
    /// Valid SQL that refers to something missing or mistyped.
    Plan,
    /// Valid SQL naming a table, view or job that does not exist.
    NotFound,
    /// Valid SQL that Weir cannot run (yet).
    Unsupported,
    /// A bad option or catalog operation.
    Catalog,
    /// Not allowed to this user or outside the allowed directories.
    PermissionDenied,
    /// A failure while running: a file, a connector, state storage.
    Runtime,
    /// A bug of ours.
    Internal,
}

#[derive(Debug, Clone)]
pub struct SqlError {
    pub kind: ErrorKind,
    pub message: String,
    pub location: Option<Location>,
}

impl SqlError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            location: None,
        }
    }

    pub fn plan(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Plan, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// Sets the location unless a more precise one is already known.
    pub fn at(mut self, location: Location) -> Self {
        if self.location.is_none() {
            self.location = Some(location);
        }
        self
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(l) = self.location {
            write!(f, "{l}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for SqlError {}

/// sqlparser messages end with "at Line: L, Column: C"; lift that out.
impl From<sqlparser::parser::ParserError> for SqlError {
    fn from(e: sqlparser::parser::ParserError) -> Self {
        let text = match &e {
            sqlparser::parser::ParserError::TokenizerError(s) | sqlparser::parser::ParserError::ParserError(s) => {
                s.clone()
            }
            other => other.to_string(),
        };
        let mut err = SqlError::new(ErrorKind::Parse, text.clone());
        if let Some(i) = text.rfind(" at Line: ") {
            let tail = &text[i + " at Line: ".len()..];
            let mut parts = tail.split(", Column: ");
            if let (Some(l), Some(c)) = (parts.next(), parts.next())
                && let (Ok(line), Ok(column)) = (l.trim().parse(), c.trim().parse())
            {
                err.location = Some(Location { line, column });
                err.message = text[..i].to_string();
            }
        }
        err
    }
}

impl From<datafusion::error::DataFusionError> for SqlError {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        let location = e.diagnostic().and_then(|d| d.span).map(|s| Location {
            line: s.start.line,
            column: s.start.column,
        });
        let kind = match e.find_root() {
            // Our catalog provider's answer for a missing table.
            datafusion::error::DataFusionError::Plan(m) if m.ends_with("does not exist") => ErrorKind::NotFound,
            datafusion::error::DataFusionError::Plan(_)
            | datafusion::error::DataFusionError::SchemaError(_, _)
            | datafusion::error::DataFusionError::SQL(_, _) => ErrorKind::Plan,
            datafusion::error::DataFusionError::NotImplemented(_) => ErrorKind::Unsupported,
            _ => ErrorKind::Plan,
        };
        let message = e.find_root().message().to_string();
        SqlError {
            kind,
            message,
            location,
        }
    }
}

impl From<arrow::error::ArrowError> for SqlError {
    fn from(e: arrow::error::ArrowError) -> Self {
        SqlError::plan(e.to_string())
    }
}

impl From<weir_catalog::CatalogError> for SqlError {
    fn from(e: weir_catalog::CatalogError) -> Self {
        let kind = match e {
            weir_catalog::CatalogError::NotFound(_) => ErrorKind::NotFound,
            _ => ErrorKind::Catalog,
        };
        SqlError::new(kind, e.to_string())
    }
}

impl From<weir_engine::ExecError> for SqlError {
    fn from(e: weir_engine::ExecError) -> Self {
        use weir_engine::ExecError as E;
        let kind = match e {
            E::Connector(weir_engine::error::ConnectorError::PermissionDenied(_)) => ErrorKind::PermissionDenied,
            E::Internal(_) | E::Cancelled => ErrorKind::Internal,
            E::Config(_) | E::Catalog(_) | E::DataFusion(_) => ErrorKind::Catalog,
            _ => ErrorKind::Runtime,
        };
        SqlError::new(kind, e.to_string())
    }
}

pub type Result<T, E = SqlError> = std::result::Result<T, E>;

impl From<weir_engine::paths::PathDenied> for SqlError {
    fn from(e: weir_engine::paths::PathDenied) -> Self {
        SqlError::permission_denied(format!("permission denied: {e}"))
    }
}
