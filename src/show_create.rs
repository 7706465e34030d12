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
        masked_options(v.query.trim())
    )
}

/// A view's stored query as the user wrote it, secrets masked: the parser
/// stores a `/*+ OPTIONS('k' = 'v') */` hint as `t(__weir_options('k',
/// 'v'))`, which is turned back into the hint, and the value of every
/// option whose key names a secret is masked there and in any `'key' =
/// 'value'` pair. (Text that does not tokenize is shown masked whole: it
/// cannot be checked.)
fn masked_options(text: &str) -> String {
    use crate::access::{MASK, is_secret_key};
    use sqlparser::tokenizer::{Token, Tokenizer};
    let dialect = sqlparser::dialect::GenericDialect {};
    let Ok(tokens) = Tokenizer::new(&dialect, text).tokenize() else {
        return MASK.to_string();
    };
    let shown = |k: &str, v: &str| {
        if is_secret_key(k) {
            MASK.to_string()
        } else {
            v.to_string()
        }
    };
    let solid = |i: usize| tokens.get(i).filter(|t| !matches!(t, Token::Whitespace(_)));
    let mut out = String::new();
    let mut i = 0;
    while i < tokens.len() {
        // `( __weir_options ( 'k' , 'v' , ... ) )`, as the parser writes it.
        if let (Some(Token::LParen), Some(Token::Word(w)), Some(Token::LParen)) = (solid(i), solid(i + 1), solid(i + 2))
            && w.value == "__weir_options"
        {
            let mut args = vec![];
            let mut j = i + 3;
            while let Some(t) = tokens.get(j) {
                match t {
                    Token::SingleQuotedString(v) => args.push(v.clone()),
                    Token::Comma | Token::Whitespace(_) => {}
                    _ => break,
                }
                j += 1;
            }
            if let (Some(Token::RParen), Some(Token::RParen)) = (solid(j), solid(j + 1))
                && args.len() % 2 == 0
            {
                let pairs: Vec<String> = args
                    .chunks(2)
                    .map(|kv| format!("{} = {}", literal(&kv[0]), literal(&shown(&kv[0], &kv[1]))))
                    .collect();
                out.push_str(&format!(" /*+ OPTIONS({}) */", pairs.join(", ")));
                i = j + 2;
                continue;
            }
        }
        // `'key' = 'value'`.
        if let Some(Token::SingleQuotedString(k)) = tokens.get(i)
            && is_secret_key(k)
        {
            let mut j = i + 1;
            while matches!(tokens.get(j), Some(Token::Whitespace(_))) {
                j += 1;
            }
            if matches!(tokens.get(j), Some(Token::Eq)) {
                let mut v = j + 1;
                while matches!(tokens.get(v), Some(Token::Whitespace(_))) {
                    v += 1;
                }
                if let Some(Token::SingleQuotedString(_)) = tokens.get(v) {
                    for t in &tokens[i..v] {
                        out.push_str(&t.to_string());
                    }
                    out.push_str(&literal(MASK));
                    i = v + 1;
                    continue;
                }
            }
        }
        out.push_str(&tokens[i].to_string());
        i += 1;
    }
    out
}
