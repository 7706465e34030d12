use std::path::PathBuf;

/// Errors of the catalog layer. `Option*` and `*Exists`/`NotFound` are the
/// user's fault; `Io`/`Corrupt` are the outside world's.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("table or view '{0}' already exists")]
    AlreadyExists(String),
    #[error("table or view '{0}' does not exist")]
    NotFound(String),
    #[error("option '{key}': {message}")]
    InvalidOption { key: String, message: String },
    #[error("unknown option '{key}' for {context}; accepted options: {accepted}")]
    UnknownOption {
        key: String,
        context: String,
        accepted: String,
    },
    #[error("missing required option '{key}' for {context}")]
    MissingOption { key: String, context: String },
    #[error("catalog file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("catalog file {path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
}
