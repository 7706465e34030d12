//! # weir-catalog
//!
//! What a session knows about tables and views, independent of how they run.
//!
//! # Layout
//! - [`table`]: table and view definitions: columns, computed columns, the
//!   `WATERMARK` clause and its alignment group, connector options.
//! - [`options`]: typed option values (durations, sizes, enums) and the
//!   validation that turns a bad `WITH (...)` or `SET` into an error naming
//!   the key and what is accepted.
//! - [`store`]: the persistent catalog (`catalog.json` in the data dir),
//!   written atomically.
//! - [`error`] — [`CatalogError`].

pub mod error;
pub mod options;
pub mod store;
pub mod table;

pub use error::CatalogError;
pub use options::{OptionKind, OptionSpec, Options};
pub use store::Catalog;
pub use table::{AlignmentSpec, ColumnDef, MetadataColumn, TableDef, ViewDef, WatermarkSpec};
