//! `SHOW CREATE TABLE` / `SHOW CREATE VIEW`: the DDL of a catalog object,
//! laid out as Flink 2.3 lays it out (recorded with the flink tool: one
//! column `result`, a line per column, `CONSTRAINT \`PK_<cols>\``,
//! `PARTITIONED BY` then `WITH` with the options sorted). Unlike Flink's,
//! names are not qualified with `default_catalog.default_database` (Weir
//! has one catalog and would not read them back) and types and
//! expressions are as the user wrote them (`STRING`, not
//! `VARCHAR(2147483647)`), so the text runs again as it is. Secret option
//! values are masked as `SET` shows them. A named constraint shows as
//! `PK_<columns>` (Weir keeps the key, not its name).

use weir_catalog::{TableDef, ViewDef};

/// `name` in backticks, a backtick in it doubled.
fn quoted(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// A string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

pub fn table_ddl(t: &TableDef, temporary: bool) -> String {
    let mut lines: Vec<String> = vec![];
    for c in &t.columns {
        let mut line = format!("  {}", quoted(&c.name));
        match (&c.computed, &c.metadata) {
            (Some(expr), _) => line.push_str(&format!(" AS {expr}")),
            (None, meta) => {
                line.push_str(&format!(" {}", c.type_name));
                if !c.nullable {
                    line.push_str(" NOT NULL");
                }
                if let Some(m) = meta {
                    line.push_str(&format!(" METADATA FROM {}", literal(&m.key)));
                    if m.is_virtual {
                        line.push_str(" VIRTUAL");
                    }
                }
            }
        }
        lines.push(line);
    }
    if let Some(w) = &t.watermark {
        let mut line = format!("  WATERMARK FOR {} AS {}", quoted(&w.column), w.expr);
        if let Some(a) = &w.alignment {
            line.push_str(&format!(
                " ALIGNMENT GROUP {} MAX DRIFT INTERVAL '{}' MILLISECOND UPDATE INTERVAL '{}' MILLISECOND",
                literal(&a.group),
                a.max_drift_ms,
                a.update_interval_ms
            ));
        }
        lines.push(line);
    }
    if let Some(pk) = &t.primary_key {
        lines.push(format!(
            "  CONSTRAINT {} PRIMARY KEY ({}) NOT ENFORCED",
            quoted(&format!("PK_{}", pk.join("_"))),
            pk.iter().map(|c| quoted(c)).collect::<Vec<_>>().join(", ")
        ));
    }
    let mut out = format!(
        "CREATE {}TABLE {} (\n{}\n)\n",
        if temporary { "TEMPORARY " } else { "" },
        quoted(&t.name),
        lines.join(",\n")
    );
    if !t.partition_keys.is_empty() {
        out.push_str(&format!(
            "PARTITIONED BY ({})\n",
            t.partition_keys
                .iter()
                .map(|c| quoted(c))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let options: Vec<String> = t
        .options
        .iter()
        .map(|(k, v)| format!("  {} = {}", literal(k), literal(crate::access::shown(k, v))))
        .collect();
    out.push_str(&format!("WITH (\n{}\n)\n", options.join(",\n")));
    out
}

pub fn view_ddl(v: &ViewDef, temporary: bool) -> String {
    format!(
        "CREATE {}VIEW {}\nAS {}\n",
        if temporary { "TEMPORARY " } else { "" },
        quoted(&v.name),
        v.query.trim()
    )
}
