//! `CREATE TABLE` → a catalog [`TableDef`], validated: column types, computed
//! columns planned (so their types are known), the `WATERMARK` column and
//! expression checked, connector options validated.

use std::collections::{BTreeMap, HashSet};

use datafusion::common::DFSchema;
use weir_catalog::{AlignmentSpec, ColumnDef, MetadataColumn, TableDef, WatermarkSpec};

use crate::error::{Result, SqlError};
use crate::parser::CreateTable;
use crate::planner::Planner;
use crate::rewrite::interval_ms_or_zero;
use crate::types::{flink_name, is_rowtime_type, to_arrow};

pub fn create_table(stmt: &CreateTable, planner: &Planner) -> Result<TableDef> {
    let mut options = BTreeMap::new();
    for (k, v, at) in &stmt.options {
        if options.insert(k.clone(), v.clone()).is_some() {
            return Err(SqlError::plan(format!("option '{k}' is given twice")).at(*at));
        }
    }
    let mut def = TableDef {
        name: stmt.name.clone(),
        columns: vec![],
        watermark: None,
        options,
        primary_key: None,
        partition_keys: vec![],
    };
    let mut seen = HashSet::new();
    for c in &stmt.columns {
        if !seen.insert(c.name.value.clone()) {
            return Err(SqlError::plan(format!("column '{}' is declared twice", c.name.value)).at(c.location));
        }
        if let Some(t) = &c.data_type {
            let (data_type, type_name) = to_arrow(t).map_err(|e| e.at(c.location))?;
            def.columns.push(ColumnDef {
                name: c.name.value.clone(),
                type_name,
                data_type,
                nullable: c.nullable,
                computed: None,
                metadata: c.metadata.as_ref().map(|(key, is_virtual)| MetadataColumn {
                    key: key.clone().unwrap_or_else(|| c.name.value.clone()),
                    is_virtual: *is_virtual,
                }),
            });
        }
    }
    if stmt.columns.is_empty() {
        // `CREATE TABLE bid WITH ('connector' = 'nexmark')`: the connector's columns.
        match weir_engine::connectors::default_schema(&def)? {
            Some(schema) => {
                for f in schema.fields() {
                    def.columns.push(ColumnDef {
                        name: f.name().clone(),
                        type_name: flink_name(f.data_type()),
                        data_type: f.data_type().clone(),
                        nullable: f.is_nullable(),
                        computed: None,
                        metadata: None,
                    });
                }
            }
            None => {
                return Err(SqlError::plan(format!(
                    "table '{}' declares no columns, and its connector has no fixed schema",
                    def.name
                )));
            }
        }
    }
    // Computed columns see the physical columns (Flink's rule).
    let physical = DFSchema::try_from(def.physical_schema().as_ref().clone())?;
    let mut position = 0;
    for c in &stmt.columns {
        if c.computed.is_none() {
            position += 1;
        }
        if let Some(expr) = &c.computed {
            let (_, phys) = planner.plan_expr(expr, &physical, None).map_err(|e| e.at(c.location))?;
            let data_type = phys.data_type(physical.as_arrow())?;
            def.columns.insert(
                position,
                ColumnDef {
                    name: c.name.value.clone(),
                    type_name: flink_name(&data_type),
                    data_type,
                    nullable: true,
                    computed: c.computed_text.clone().or_else(|| Some(expr.to_string())),
                    metadata: None,
                },
            );
            position += 1;
        }
    }
    if let Some(w) = &stmt.watermark {
        let col = def.column(&w.column.value).ok_or_else(|| {
            SqlError::plan(format!(
                "WATERMARK FOR '{}': no such column in table '{}'",
                w.column.value, def.name
            ))
            .at(w.location)
        })?;
        if col
            .computed
            .as_deref()
            .is_some_and(crate::functions::overrides::is_proctime_call)
        {
            return Err(SqlError::plan(format!(
                "WATERMARK FOR '{}': a watermark cannot be defined on a processing-time attribute (PROCTIME()); \
                 declare it on an event-time column",
                col.name
            ))
            .at(w.location));
        }
        if !is_rowtime_type(&col.data_type) {
            return Err(SqlError::plan(format!(
                "WATERMARK FOR '{}': the rowtime column must be TIMESTAMP(3) or TIMESTAMP_LTZ(3), but it is {}",
                col.name, col.type_name
            ))
            .at(w.location));
        }
        let full = DFSchema::try_from(def.schema().as_ref().clone())?;
        let (_, phys) = planner.plan_expr(&w.expr, &full, None).map_err(|e| e.at(w.location))?;
        let t = phys.data_type(full.as_arrow())?;
        if !is_rowtime_type(&t) {
            return Err(SqlError::plan(format!(
                "the WATERMARK expression must return TIMESTAMP(3) or TIMESTAMP_LTZ(3), but '{}' returns {}",
                w.expr_text,
                flink_name(&t)
            ))
            .at(w.location));
        }
        let alignment = alignment_spec(w, &def).map_err(|e| e.at(w.location))?;
        def.watermark = Some(WatermarkSpec {
            column: col.name.clone(),
            expr: w.expr_text.clone(),
            alignment,
        });
    } else if def.options.keys().any(|k| k.starts_with("scan.watermark.alignment.")) {
        return Err(SqlError::plan(format!(
            "table '{}' has 'scan.watermark.alignment.*' options but no WATERMARK clause to align",
            def.name
        )));
    }
    if let Some((cols, at)) = &stmt.partitioned_by {
        for c in cols {
            let Some(col) = def.columns.iter().find(|d| d.name == c.value) else {
                return Err(SqlError::plan(format!(
                    "PARTITIONED BY column '{}' is not a column of the table",
                    c.value
                ))
                .at(*at));
            };
            if col.computed.is_some() {
                return Err(SqlError::plan(format!(
                    "PARTITIONED BY column '{}' is a computed column; a partition column must be a physical column",
                    c.value
                ))
                .at(*at));
            }
            if def.partition_keys.contains(&c.value) {
                return Err(SqlError::plan(format!("PARTITIONED BY names column '{}' twice", c.value)).at(*at));
            }
            def.partition_keys.push(c.value.clone());
        }
        if def.partition_keys.len() == def.physical_columns().count() {
            return Err(SqlError::plan(
                "PARTITIONED BY names every physical column; a partitioned table needs columns to write into its files",
            )
            .at(*at));
        }
    }
    if let Some((cols, at)) = &stmt.primary_key {
        let mut key = vec![];
        for c in cols {
            let Some(col) = def.columns.iter().find(|d| d.name == c.value) else {
                return Err(
                    SqlError::plan(format!("PRIMARY KEY column '{}' is not a column of the table", c.value)).at(*at),
                );
            };
            if col.computed.is_some() || col.metadata.is_some() {
                return Err(SqlError::plan(format!(
                    "PRIMARY KEY column '{}' is a {} column; a key must be a physical column",
                    c.value,
                    if col.computed.is_some() { "computed" } else { "metadata" }
                ))
                .at(*at));
            }
            if key.contains(&c.value) {
                return Err(SqlError::plan(format!("PRIMARY KEY names column '{}' twice", c.value)).at(*at));
            }
            key.push(c.value.clone());
        }
        def.primary_key = Some(key);
    }
    // After the key: a connector may need one (upsert-kafka).
    weir_engine::connectors::validate_table(&def)?;
    Ok(def)
}

const GROUP_KEY: &str = "scan.watermark.alignment.group";
const DRIFT_KEY: &str = "scan.watermark.alignment.max-drift";
const INTERVAL_KEY: &str = "scan.watermark.alignment.update-interval";

fn option_ms(def: &TableDef, key: &str) -> Result<Option<i64>> {
    match def.options.get(key) {
        None => Ok(None),
        Some(v) => weir_catalog::options::parse_duration(v)
            .map(|d| Some(d.as_millis() as i64))
            .ok_or_else(|| {
                SqlError::plan(format!(
                    "option '{key}': invalid value '{v}', expected a duration such as '30 s'"
                ))
            }),
    }
}

/// The alignment group from the clause and/or Flink's table options; both
/// forms may be given, but must agree.
fn alignment_spec(w: &crate::parser::WatermarkClause, def: &TableDef) -> Result<Option<AlignmentSpec>> {
    let opt_group = def.options.get(GROUP_KEY).cloned();
    let opt_drift = option_ms(def, DRIFT_KEY)?;
    let opt_interval = option_ms(def, INTERVAL_KEY)?;
    let clause = match &w.alignment {
        Some(a) => Some((
            a.group.clone(),
            interval_ms_or_zero(&a.max_drift).map_err(|e| e.at(a.location))?,
            a.update_interval
                .as_ref()
                .map(interval_ms_or_zero)
                .transpose()
                .map_err(|e| e.at(a.location))?,
        )),
        None => None,
    };
    let disagree = |what: &str, a: String, b: String| {
        Err(SqlError::plan(format!(
            "the ALIGNMENT GROUP clause and option '{what}' disagree ({a} vs {b}); give one or make them equal"
        )))
    };
    let (group, drift, interval) = match (clause, opt_group) {
        (None, None) => {
            if opt_drift.is_some() {
                return Err(SqlError::plan(format!("option '{DRIFT_KEY}' needs '{GROUP_KEY}'")));
            }
            return Ok(None);
        }
        (Some((g, d, i)), og) => {
            if let Some(og) = og.filter(|og| *og != g) {
                return disagree(GROUP_KEY, format!("'{g}'"), format!("'{og}'"));
            }
            if let Some(od) = opt_drift.filter(|od| *od != d) {
                return disagree(DRIFT_KEY, format!("{d} ms"), format!("{od} ms"));
            }
            if let (Some(ci), Some(oi)) = (i, opt_interval)
                && ci != oi
            {
                return disagree(INTERVAL_KEY, format!("{ci} ms"), format!("{oi} ms"));
            }
            (g, d, i.or(opt_interval))
        }
        (None, Some(g)) => {
            let d = opt_drift.ok_or_else(|| SqlError::plan(format!("option '{GROUP_KEY}' needs '{DRIFT_KEY}'")))?;
            (g, d, opt_interval)
        }
    };
    let interval = interval.unwrap_or(1_000);
    if interval < 1 {
        return Err(SqlError::plan("the alignment update interval must be positive"));
    }
    if group.is_empty() {
        return Err(SqlError::plan("the alignment group name must not be empty"));
    }
    Ok(Some(AlignmentSpec {
        group,
        max_drift_ms: drift,
        update_interval_ms: interval,
    }))
}
