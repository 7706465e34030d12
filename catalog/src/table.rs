//! Table and view definitions as the catalog stores them.

use std::collections::BTreeMap;

use arrow_schema::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

/// A column of a table: physical (read from the connector) or computed
/// (`name AS expr`, evaluated by the engine after reading).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnDef {
    pub name: String,
    /// The type as the user wrote it in Flink's spelling, e.g. `TIMESTAMP(3)`.
    pub type_name: String,
    pub data_type: DataType,
    pub nullable: bool,
    /// SQL text of the expression of a computed column.
    pub computed: Option<String>,
    /// `METADATA [FROM 'key'] [VIRTUAL]`: supplied by the connector from
    /// beside the record's fields (Kafka's offset, timestamp, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<MetadataColumn>,
}

/// A metadata column's key and whether it is only read (`VIRTUAL`: not a
/// column an INSERT writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataColumn {
    pub key: String,
    #[serde(rename = "virtual")]
    pub is_virtual: bool,
}

/// `ALIGNMENT GROUP 'g' MAX DRIFT ... UPDATE INTERVAL ...`, or the
/// equivalent `scan.watermark.alignment.*` options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlignmentSpec {
    pub group: String,
    pub max_drift_ms: i64,
    pub update_interval_ms: i64,
}

/// `WATERMARK FOR column AS expr`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatermarkSpec {
    pub column: String,
    /// SQL text of the watermark expression, planned against the table's
    /// columns (physical and computed).
    pub expr: String,
    pub alignment: Option<AlignmentSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableDef {
    pub name: String,
    pub columns: Vec<ColumnDef>,
    pub watermark: Option<WatermarkSpec>,
    /// `WITH (...)` options, keys as written (Flink option keys are
    /// case-sensitive).
    pub options: BTreeMap<String, String>,
    /// `PRIMARY KEY (...) NOT ENFORCED`: the columns, in key order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_key: Option<Vec<String>>,
    /// `PARTITIONED BY (...)`: the partition columns, in path order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_keys: Vec<String>,
}

impl TableDef {
    pub fn connector(&self) -> Option<&str> {
        self.options.get("connector").map(String::as_str)
    }

    /// Columns the connector supplies, in declaration order.
    pub fn physical_columns(&self) -> impl Iterator<Item = &ColumnDef> {
        self.columns.iter().filter(|c| c.computed.is_none())
    }

    pub fn physical_schema(&self) -> SchemaRef {
        std::sync::Arc::new(Schema::new(
            self.physical_columns()
                .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
                .collect::<Vec<_>>(),
        ))
    }

    /// The columns an INSERT writes: the physical ones but `VIRTUAL`
    /// metadata columns.
    pub fn writable_columns(&self) -> impl Iterator<Item = &ColumnDef> {
        self.physical_columns()
            .filter(|c| !c.metadata.as_ref().is_some_and(|m| m.is_virtual))
    }

    pub fn writable_schema(&self) -> SchemaRef {
        std::sync::Arc::new(Schema::new(
            self.writable_columns()
                .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
                .collect::<Vec<_>>(),
        ))
    }

    /// The metadata columns among `columns` (physical or writable ones):
    /// (index among them, metadata key).
    pub fn metadata_of<'a>(columns: impl Iterator<Item = &'a ColumnDef>) -> Vec<(usize, String)> {
        columns
            .enumerate()
            .filter_map(|(i, c)| c.metadata.as_ref().map(|m| (i, m.key.clone())))
            .collect()
    }

    /// The schema queries see: every column, computed ones included.
    pub fn schema(&self) -> SchemaRef {
        std::sync::Arc::new(Schema::new(
            self.columns
                .iter()
                .map(|c| Field::new(&c.name, c.data_type.clone(), c.nullable))
                .collect::<Vec<_>>(),
        ))
    }

    pub fn column(&self, name: &str) -> Option<&ColumnDef> {
        self.columns.iter().find(|c| c.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewDef {
    pub name: String,
    /// The view's query as SQL text; planned each time the view is used.
    pub query: String,
}
