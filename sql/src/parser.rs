//! Splits a script into statements and parses each one.
//!
//! sqlparser does the work; Weir's statements are parsed with sqlparser's
//! `Parser` primitives (identifiers, types, expressions, queries) so that
//! positions are exact and the grammar is Flink's.

use sqlparser::ast::{self, Expr, Ident, Query};
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Whitespace};

use crate::error::{ErrorKind, Location, Result, SqlError};
use crate::refusals;

pub use crate::dialect::dialect;
pub(crate) use crate::dialect::object_name;

#[derive(Debug, Clone)]
pub struct ColumnSpec {
    pub name: Ident,
    pub data_type: Option<ast::DataType>,
    pub nullable: bool,
    pub computed: Option<Expr>,
    /// The computed expression as the user wrote it (what DESCRIBE shows
    /// and the catalog keeps: `computed` has the token rewrites applied).
    pub computed_text: Option<String>,
    /// `METADATA [FROM 'key'] [VIRTUAL]`: the key (`None`: the column's
    /// name) and whether the column is virtual.
    pub metadata: Option<(Option<String>, bool)>,
    pub location: Location,
}

#[derive(Debug, Clone)]
pub struct AlignmentClause {
    pub group: String,
    pub max_drift: Expr,
    pub update_interval: Option<Expr>,
    pub location: Location,
}

#[derive(Debug, Clone)]
pub struct WatermarkClause {
    pub column: Ident,
    pub expr: Expr,
    /// `expr` as the user wrote it.
    pub expr_text: String,
    pub alignment: Option<AlignmentClause>,
    pub location: Location,
}

#[derive(Debug, Clone)]
pub struct CreateTable {
    pub name: String,
    pub if_not_exists: bool,
    /// `CREATE TEMPORARY TABLE`: the session's only.
    pub temporary: bool,
    pub columns: Vec<ColumnSpec>,
    pub watermark: Option<WatermarkClause>,
    /// `PRIMARY KEY (cols) NOT ENFORCED`, and where it is.
    pub primary_key: Option<(Vec<Ident>, Location)>,
    /// `PARTITIONED BY (cols)`, and where it is.
    pub partitioned_by: Option<(Vec<Ident>, Location)>,
    pub options: Vec<(String, String, Location)>,
}

/// What an `ALTER TABLE` changes.
#[derive(Debug, Clone, PartialEq)]
pub enum TableChange {
    /// Options set or overwritten, each where it was written.
    Set(Vec<(String, String, Location)>),
    /// Options removed.
    Reset(Vec<(String, Location)>),
    RenameTo(String),
}

// One per statement: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Statement {
    CreateTable(CreateTable),
    CreateView {
        name: String,
        if_not_exists: bool,
        or_replace: bool,
        /// `CREATE TEMPORARY VIEW`: the session's only.
        temporary: bool,
        query: Box<Query>,
    },
    Drop {
        name: String,
        view: bool,
        if_exists: bool,
        /// `DROP TEMPORARY TABLE|VIEW`.
        temporary: bool,
    },
    /// `ALTER TABLE [IF EXISTS] t SET ('k' = 'v', ...)`, `RESET ('k', ...)`
    /// or `RENAME TO t2` (Flink's forms).
    AlterTable {
        name: String,
        if_exists: bool,
        change: TableChange,
    },
    ShowTables,
    /// `SHOW VIEWS`: the views only (`SHOW TABLES` lists both, as Flink).
    ShowViews,
    /// `SHOW JOBS`
    ShowJobs,
    /// `SHOW WATERMARKS FOR JOB 'name'`
    ShowWatermarks(String),
    /// `SHOW CHECKPOINTS FOR JOB 'name'`
    ShowCheckpoints(String),
    /// `DESCRIBE JOB '<id or name>'`
    DescribeJob(String),
    /// `STOP JOB '<id or name>'`: sources stop, the job drains and takes
    /// its final checkpoint.
    StopJob(String),
    /// `CANCEL JOB '<id or name>'`: ends the job at once, no final
    /// checkpoint (its last completed checkpoint stays).
    CancelJob(String),
    /// `STOP JOB '<id or name>' WITH SAVEPOINT ['dir'] [DRAIN]`: an aligned
    /// savepoint, the sinks commit, the job stops; with `DRAIN` every
    /// watermark first advances to the end (windows and timers fire).
    StopJobWithSavepoint {
        job: String,
        dir: Option<String>,
        drain: bool,
    },
    /// `SAVEPOINT JOB '<id or name>' ['dir']`: a savepoint of a job that
    /// keeps running.
    SavepointJob {
        job: String,
        dir: Option<String>,
    },
    /// `SHOW SAVEPOINTS FOR JOB 'name'`
    ShowSavepoints(String),
    /// `SUBSCRIBE TO <table or view> | (<query>)`: the query's rows as a
    /// changelog with a leading `_op` column.
    Subscribe(Box<Query>),
    Describe(String),
    /// `SHOW CREATE TABLE t` / `SHOW CREATE VIEW v`: the object's DDL.
    ShowCreate {
        name: String,
        view: bool,
    },
    Set(Option<(String, String)>),
    Reset(Option<String>),
    Insert {
        table: String,
        /// `INSERT INTO t (c, ...)`: the sink's columns the query's fill,
        /// in order, each with where it was written (empty: all writable
        /// columns, in order).
        columns: Vec<(String, Location)>,
        query: Box<Query>,
        /// `ON CONFLICT DO DEDUPLICATE | NOTHING | ERROR` (Flink 2.3): how an
        /// upsert sink resolves rows of different upsert keys that share its
        /// PRIMARY KEY.
        on_conflict: Option<OnConflict>,
    },
    Query(Box<Query>),
    Explain(Box<Statement>),
}

/// `INSERT ... ON CONFLICT DO <strategy>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    /// The latest row of the sink key wins (Flink's SinkUpsertMaterializer).
    Deduplicate,
    /// The first row of the sink key is kept.
    Nothing,
    /// Rows of different upsert keys on one sink key fail the job.
    Error,
}

impl std::fmt::Display for OnConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnConflict::Deduplicate => "DEDUPLICATE",
            OnConflict::Nothing => "NOTHING",
            OnConflict::Error => "ERROR",
        })
    }
}

#[derive(Debug, Clone)]
pub struct ParsedStatement {
    pub statement: Statement,
    /// Where the statement starts in the script (1-based).
    pub location: Location,
    /// The statement's text, without the terminating `;`.
    pub text: String,
}

fn loc(t: &TokenWithSpan) -> Location {
    Location {
        line: t.span.start.line,
        column: t.span.start.column,
    }
}

fn is_blank(t: &Token) -> bool {
    matches!(t, Token::Whitespace(_))
}

/// Parses every statement of `sql`.
pub fn parse(sql: &str) -> Result<Vec<ParsedStatement>> {
    let dialect = dialect();
    let tokens = Tokenizer::new(&dialect, sql).tokenize_with_location().map_err(|e| {
        let mut err = SqlError::new(ErrorKind::Parse, e.message.clone());
        err.location = Some(Location {
            line: e.location.line,
            column: e.location.column,
        });
        err
    })?;
    let mut out = vec![];
    for part in tokens.split(|t| t.token == Token::SemiColon) {
        let Some(first) = part.iter().find(|t| !is_blank(&t.token)) else {
            continue;
        };
        let last = part.iter().rev().find(|t| !is_blank(&t.token)).unwrap_or(first);
        let location = loc(first);
        let text = slice_text(
            sql,
            location,
            Location {
                line: last.span.end.line,
                column: last.span.end.column,
            },
        );
        let end = Location {
            line: last.span.end.line,
            column: last.span.end.column,
        };
        check_nesting(part)?;
        check_no_internal_names(part)?;
        let tokens = rewrite_tokens(rewrite_table_hints(part.to_vec())?);
        let statement = parse_one(tokens, sql).map_err(|e| {
            // sqlparser gives no position for "found: EOF": it is where the
            // statement ends.
            let at = if e.message.ends_with("found: EOF") {
                end
            } else {
                location
            };
            e.at(at)
        })?;
        out.push(ParsedStatement {
            statement,
            location,
            text,
        });
    }
    Ok(out)
}

/// Flink's syntax that sqlparser lacks, written as what it parses (each
/// rewrite keeps the positions of the tokens it replaces).
fn rewrite_tokens(tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    rewrite_json_member_tokens(rewrite_json_value_tokens(rewrite_map_tokens(rewrite_is_json_tokens(
        rewrite_system_time_tokens(rewrite_tvf_tokens(rewrite_numbers(tokens))),
    ))))
}

/// Parses an expression the catalog keeps as the user wrote it (a computed
/// column, a watermark), with the same rewrites as a statement's.
pub fn parse_expr_text(text: &str) -> Result<Expr> {
    let dialect = dialect();
    let tokens = Tokenizer::new(&dialect, text)
        .tokenize_with_location()
        .map_err(|e| SqlError::new(ErrorKind::Parse, format!("in '{text}': {}", e.message)))?;
    check_nesting(&tokens)?;
    let mut p = Parser::new(&dialect).with_tokens_with_locations(rewrite_tokens(tokens));
    let expr = p.parse_expr()?;
    let next = p.peek_token();
    if next.token != Token::EOF {
        return Err(SqlError::new(
            ErrorKind::Parse,
            format!("unexpected '{}' after the expression '{text}'", next.token),
        ));
    }
    Ok(expr)
}

/// The deepest a statement's expressions may nest, counted as
/// [`check_nesting`] does: generous for real SQL (a WHERE of a hundred
/// ANDed conditions), sized for the 16 MiB stacks the `weir` binary gives
/// its runtime threads (a debug build used about 21 KiB of stack per level
/// of a chain of `::BIGINT` casts in planning).
pub const MAX_NESTING: usize = 256;

/// Refuses a statement whose syntax tree could be deeper than
/// [`MAX_NESTING`], before sqlparser builds it.
///
/// sqlparser's recursion limit covers what it parses by recursion
/// (parentheses, subqueries, unary operators), but chains of binary
/// operators (`1 + 1 + ...`, `a OR b OR ...`, `x::INT::INT`) and of set
/// operations (`... UNION ALL ...`) are built by a loop into a left-deep
/// tree, one level per operator. Everything that walks the tree afterwards
/// recurses once per level (our rewrite, DataFusion's planner, `Display`,
/// `Drop`), so a long enough chain overflowed the stack and aborted the
/// process, a server included. The bound is on tokens: for each open
/// parenthesis (or `CASE ... END`), the operators and keywords of the list
/// item being read, summed over the open levels. That is at least the tree's
/// depth, while long lists (`IN (1, 2, ...)`, many columns, many `WHEN`s)
/// stay cheap.
fn check_nesting(tokens: &[TokenWithSpan]) -> Result<()> {
    /// An open parenthesis (or CASE): operators in its current list item,
    /// and whether that list is a FROM list, whose items are joined (a
    /// comma is a join, one more level of the plan).
    #[derive(Default)]
    struct Level {
        operators: usize,
        in_from: bool,
    }
    let mut levels: Vec<Level> = vec![Level::default()];
    let mut total = 0usize;
    for t in tokens {
        let keyword = match &t.token {
            Token::Word(w) if w.quote_style.is_none() => w.keyword,
            _ => Keyword::NoKeyword,
        };
        let top = levels.len() - 1;
        match (&t.token, keyword) {
            (Token::LParen | Token::LBracket | Token::LBrace, _) | (_, Keyword::CASE) => levels.push(Level::default()),
            (Token::RParen | Token::RBracket | Token::RBrace, _) | (_, Keyword::END) if top > 0 => {
                total -= levels.pop().map_or(0, |l| l.operators);
            }
            // The next item of a list or branch of a CASE: what came before
            // is a sibling, not a parent.
            (Token::Comma, _) if !levels[top].in_from => {
                total -= std::mem::take(&mut levels[top].operators);
            }
            (_, Keyword::WHEN | Keyword::THEN | Keyword::ELSE) if top > 0 => {
                total -= std::mem::take(&mut levels[top].operators);
            }
            // Literals and names add no level.
            (Token::Whitespace(_) | Token::Word(_), Keyword::NoKeyword)
            | (
                Token::Number(..)
                | Token::SingleQuotedString(_)
                | Token::DoubleQuotedString(_)
                | Token::NationalStringLiteral(_)
                | Token::HexStringLiteral(_)
                | Token::Placeholder(_)
                | Token::Period
                | Token::SemiColon,
                _,
            ) => {}
            // Operators, keywords and joins: each may be one more level.
            _ => {
                levels[top].operators += 1;
                total += 1;
                match keyword {
                    Keyword::FROM => levels[top].in_from = true,
                    Keyword::WHERE
                    | Keyword::GROUP
                    | Keyword::HAVING
                    | Keyword::ORDER
                    | Keyword::LIMIT
                    | Keyword::WINDOW
                    | Keyword::SELECT => levels[top].in_from = false,
                    _ => {}
                }
            }
        }
        if total + levels.len() > MAX_NESTING {
            return Err(SqlError::new(
                ErrorKind::Parse,
                format!(
                    "expression nested too deeply: more than {MAX_NESTING} operators or levels in one \
                     expression; split it (a long OR chain of equalities is an IN list)"
                ),
            )
            .at(loc(t)));
        }
    }
    Ok(())
}

/// Refuses the window marker function in user SQL: the rewrite writes it
/// with checked arguments, but called directly it reached the window
/// operator with a slide of 0 (a division by zero in the task).
fn check_no_internal_names(tokens: &[TokenWithSpan]) -> Result<()> {
    for t in tokens {
        if let Token::Word(w) = &t.token
            && [
                crate::udf::WINDOW_FN,
                crate::udf::PARTITION_BY_FN,
                crate::udf::SYSTEM_TIME_FN,
                crate::udf::TEMPORAL_JOIN_FN,
                crate::udf::OPTIONS_FN,
            ]
            .iter()
            .any(|name| w.value.eq_ignore_ascii_case(name))
        {
            return Err(SqlError::plan(format!(
                "{} is internal to Weir; use TUMBLE, HOP, CUMULATE or SESSION",
                w.value
            ))
            .at(loc(t)));
        }
    }
    Ok(())
}

/// Hints are read where a SELECT starts (`SELECT /*+ STATE_TTL(...) */`,
/// see `hints.rs`), and right after a table's name: Flink's dynamic table
/// options, `FROM t /*+ OPTIONS('k' = 'v', ...) */`, handed to the parser
/// as `t(__weir_options('k', 'v', ...))` (`hints::dynamic_options` takes
/// them out again). Anywhere else sqlparser would drop a `/*+ ... */` as a
/// comment and the query would run with other options than written, so a
/// hint elsewhere, or another table hint, is refused by name.
fn rewrite_table_hints(tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    use sqlparser::tokenizer::Whitespace;
    let mut out: Vec<TokenWithSpan> = Vec::with_capacity(tokens.len());
    for t in tokens {
        let Token::Whitespace(Whitespace::MultiLineComment(text)) = &t.token else {
            out.push(t);
            continue;
        };
        if !text.starts_with('+') {
            out.push(t);
            continue;
        }
        let previous = out.iter().rev().find(|p| !is_blank(&p.token)).map(|p| &p.token);
        if matches!(previous, Some(Token::Word(w)) if w.keyword == sqlparser::keywords::Keyword::SELECT) {
            out.push(t);
            continue;
        }
        let body = text[1..].trim();
        let name: String = body
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // A table's name: a (quoted or dotted) name right after FROM,
        // JOIN or INTO.
        let mut back = out.iter().rev().filter(|p| !is_blank(&p.token)).map(|p| &p.token);
        let mut before_name = back.nth(1);
        while matches!(before_name, Some(Token::Period)) {
            before_name = back.nth(1);
        }
        let after = |kw: sqlparser::keywords::Keyword| matches!(before_name, Some(Token::Word(w)) if w.keyword == kw);
        let named = matches!(previous, Some(Token::Word(w))
            if w.quote_style.is_some() || w.keyword == sqlparser::keywords::Keyword::NoKeyword);
        let after_table = named
            && (after(sqlparser::keywords::Keyword::FROM)
                || after(sqlparser::keywords::Keyword::JOIN)
                || after(sqlparser::keywords::Keyword::INTO));
        if !name.eq_ignore_ascii_case("OPTIONS") || !after_table {
            let what = if name.eq_ignore_ascii_case("OPTIONS") {
                "hint OPTIONS is read right after a table's name (`FROM t /*+ OPTIONS('k' = 'v') */`)".to_string()
            } else {
                format!(
                    "hint {} is not supported here; Weir reads OPTIONS after a table's name and STATE_TTL \
                     and the join hints right after SELECT",
                    if name.is_empty() { "/*+ */" } else { &name }
                )
            };
            return Err(SqlError::unsupported(what).at(loc(&t)));
        }
        // INTO names a sink.
        if after(sqlparser::keywords::Keyword::INTO) {
            return Err(SqlError::unsupported(
                "hint OPTIONS on the table an INSERT writes is not supported; set the options in its WITH clause",
            )
            .at(loc(&t)));
        }
        let pairs = hint_options(&text[1..]).map_err(|e| e.at(loc(&t)))?;
        // `( __weir_options ( 'k' , 'v' , ... ) )`, all at the comment's
        // place.
        let at = |token: Token| TokenWithSpan::new(token, t.span);
        out.push(at(Token::LParen));
        out.push(at(Token::make_word(crate::udf::OPTIONS_FN, None)));
        out.push(at(Token::LParen));
        for (i, (k, v)) in pairs.into_iter().enumerate() {
            if i > 0 {
                out.push(at(Token::Comma));
            }
            out.push(at(Token::SingleQuotedString(k)));
            out.push(at(Token::Comma));
            out.push(at(Token::SingleQuotedString(v)));
        }
        out.push(at(Token::RParen));
        out.push(at(Token::RParen));
    }
    Ok(out)
}

/// The `'key' = 'value'` pairs of one OPTIONS hint (`hints::parse_hints`
/// reads the syntax, as for query hints), each key once.
fn hint_options(text: &str) -> Result<Vec<(String, String)>> {
    let bad = |why: String| SqlError::plan(format!("hint OPTIONS: {why}; write OPTIONS('key' = 'value', ...)"));
    let [(_, pairs)] = crate::hints::parse_hints(text)?
        .try_into()
        .map_err(|_| bad("one hint at a time".into()))?;
    if pairs.is_empty() {
        return Err(bad("no options given".into()));
    }
    let mut out: Vec<(String, String)> = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        let Some(v) = v else {
            return Err(bad(format!("'{k}' is not a quoted key with a value")));
        };
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(bad(format!("'{k}' is given twice")));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// The text between two 1-based positions.
fn slice_text(sql: &str, start: Location, end: Location) -> String {
    let offset = |l: Location| -> usize {
        let mut off = 0;
        for (i, line) in sql.split_inclusive('\n').enumerate() {
            if i as u64 + 1 == l.line {
                return off
                    + line
                        .char_indices()
                        .nth((l.column as usize).saturating_sub(1))
                        .map_or(line.len(), |(b, _)| b);
            }
            off += line.len();
        }
        sql.len()
    };
    let (s, e) = (offset(start), offset(end));
    sql.get(s..e.max(s)).unwrap_or_default().trim().to_string()
}

/// Flink writes window TVFs as `TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts), ...))`;
/// sqlparser cannot parse `TABLE t` as an argument, so the inner `TABLE`
/// keyword is blanked out (positions of everything else are kept). The
/// SESSION TVF's `TABLE t PARTITION BY k` / `PARTITION BY (k1, k2)` becomes
/// `t, __weir_partition_by(k1, k2)`, an argument the rewrite takes apart.
fn rewrite_tvf_tokens(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let idx: Vec<usize> = (0..tokens.len()).filter(|i| !is_blank(&tokens[*i].token)).collect();
    let mut partitions = vec![];
    for w in idx.windows(5) {
        let [a, b, c, d, e] = [w[0], w[1], w[2], w[3], w[4]];
        let is_tvf = ["TUMBLE", "HOP", "CUMULATE", "SESSION"]
            .iter()
            .any(|k| word(&tokens[c].token, k));
        if word(&tokens[a].token, "TABLE")
            && tokens[b].token == Token::LParen
            && is_tvf
            && tokens[d].token == Token::LParen
            && word(&tokens[e].token, "TABLE")
        {
            tokens[e].token = Token::Whitespace(Whitespace::Space);
            partitions.push(e);
        }
    }
    // Back to front: inserted parentheses do not move earlier positions.
    for e in partitions.into_iter().rev() {
        let next = |from: usize, tokens: &[TokenWithSpan]| (from..tokens.len()).find(|i| !is_blank(&tokens[*i].token));
        // The table name: words and dots up to PARTITION, `,` or `)`.
        let mut i = next(e + 1, &tokens);
        while let Some(at) = i {
            if word(&tokens[at].token, "PARTITION") {
                break;
            }
            match &tokens[at].token {
                Token::Word(_) | Token::Period => i = next(at + 1, &tokens),
                _ => {
                    i = None;
                }
            }
        }
        let Some(partition) = i else { continue };
        let Some(by) = next(partition + 1, &tokens).filter(|b| word(&tokens[*b].token, "BY")) else {
            continue;
        };
        tokens[partition].token = Token::Comma;
        tokens[by].token = Token::make_word(crate::udf::PARTITION_BY_FN, None);
        let Some(first) = next(by + 1, &tokens) else { continue };
        if tokens[first].token == Token::LParen {
            continue;
        }
        // One column without parentheses: `k` or `t.k`.
        let last = column_end(&tokens, first);
        let (open, close) = (tokens[first].span, tokens[last].span);
        tokens.insert(last + 1, TokenWithSpan::new(Token::RParen, close));
        tokens.insert(first, TokenWithSpan::new(Token::LParen, open));
    }
    tokens
}

/// The last token of the column name starting at `first` (`k`, `t.k`).
fn column_end(tokens: &[TokenWithSpan], first: usize) -> usize {
    let next = |from: usize| (from..tokens.len()).find(|i| !is_blank(&tokens[*i].token));
    let mut last = first;
    while let Some(dot) = next(last + 1).filter(|d| tokens[*d].token == Token::Period) {
        match next(dot + 1) {
            Some(w) if matches!(tokens[w].token, Token::Word(_)) => last = w,
            _ => break,
        }
    }
    last
}

/// Flink's temporal join `JOIN r FOR SYSTEM_TIME AS OF o.ts [AS] alias`:
/// our dialect has no table versions, so the clause becomes an argument of
/// the table, `r (__weir_system_time(o.ts))`, which the rewrite takes
/// apart. The time is a column (`ts` or `o.ts`), as Flink requires.
fn rewrite_system_time_tokens(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let next = |from: usize, tokens: &[TokenWithSpan]| (from..tokens.len()).find(|i| !is_blank(&tokens[*i].token));
    let mut at = 0;
    while let Some(f) = next(at, &tokens) {
        at = f + 1;
        if !word(&tokens[f].token, "FOR") {
            continue;
        }
        let Some(st) = next(f + 1, &tokens).filter(|i| word(&tokens[*i].token, "SYSTEM_TIME")) else {
            continue;
        };
        let Some(as_) = next(st + 1, &tokens).filter(|i| word(&tokens[*i].token, "AS")) else {
            continue;
        };
        let Some(of) = next(as_ + 1, &tokens).filter(|i| word(&tokens[*i].token, "OF")) else {
            continue;
        };
        let Some(first) = next(of + 1, &tokens).filter(|i| matches!(tokens[*i].token, Token::Word(_))) else {
            continue;
        };
        let last = column_end(&tokens, first);
        // `FOR SYSTEM_TIME AS OF x` → `( __weir_system_time ( x ) )`.
        tokens[f].token = Token::LParen;
        tokens[st].token = Token::make_word(crate::udf::SYSTEM_TIME_FN, None);
        tokens[as_].token = Token::LParen;
        tokens[of].token = Token::Whitespace(Whitespace::Space);
        let close = tokens[last].span;
        tokens.insert(last + 1, TokenWithSpan::new(Token::RParen, close));
        tokens.insert(last + 1, TokenWithSpan::new(Token::RParen, close));
        at = last + 3;
    }
    tokens
}

/// sqlparser has no `x IS [NOT] JSON [VALUE | SCALAR | ARRAY | OBJECT]`:
/// it becomes `x IS [NOT] DISTINCT FROM __weir_is_json('KIND')`, a
/// predicate of the same precedence, which `functions::flink_calls` turns
/// back into Flink's test (`IS JSON` ↔ `IS NOT DISTINCT FROM`).
fn rewrite_is_json_tokens(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let next = |from: usize, tokens: &[TokenWithSpan]| (from..tokens.len()).find(|i| !is_blank(&tokens[*i].token));
    let mut at = 0;
    while let Some(is) = next(at, &tokens) {
        at = is + 1;
        if !word(&tokens[is].token, "IS") {
            continue;
        }
        let mut j = next(is + 1, &tokens);
        let negated = j.is_some_and(|n| word(&tokens[n].token, "NOT"));
        if negated {
            j = j.and_then(|n| next(n + 1, &tokens));
        }
        let Some(json) = j.filter(|j| word(&tokens[*j].token, "JSON")) else {
            continue;
        };
        let kind = next(json + 1, &tokens).filter(|k| {
            ["VALUE", "SCALAR", "ARRAY", "OBJECT"]
                .iter()
                .any(|w| word(&tokens[*k].token, w))
        });
        // The new tokens stand for `JSON [kind]`: they take its whole span
        // (a computed column's text is cut by its tokens' spans).
        let span = tokens[json].span.union(&tokens[kind.unwrap_or(json)].span);
        let kind_text = kind.map_or("VALUE".to_string(), |k| {
            tokens[k].token.to_string().to_ascii_uppercase()
        });
        let mut new: Vec<Token> = vec![];
        if !negated {
            new.extend([Token::make_keyword("NOT"), Token::Whitespace(Whitespace::Space)]);
        }
        new.extend([
            Token::make_keyword("DISTINCT"),
            Token::Whitespace(Whitespace::Space),
            Token::make_keyword("FROM"),
            Token::Whitespace(Whitespace::Space),
            Token::make_word(crate::udf::IS_JSON_FN, None),
            Token::LParen,
            Token::SingleQuotedString(kind_text),
            Token::RParen,
        ]);
        // `IS NOT JSON`: the NOT is kept and reads `IS NOT DISTINCT`'s
        // opposite, `IS DISTINCT`: drop it.
        let end = kind.unwrap_or(json);
        let first = if negated {
            let not = next(is + 1, &tokens).unwrap_or(json);
            tokens[not].token = Token::Whitespace(Whitespace::Space);
            json
        } else {
            json
        };
        let count = new.len();
        tokens.splice(first..=end, new.into_iter().map(|t| TokenWithSpan::new(t, span)));
        at = first + count;
    }
    tokens
}

/// Numbers typed as Flink (Calcite) types them. One with an exponent
/// (`1.5e0`) is a DOUBLE; DataFusion, asked for DECIMALs
/// (`parse_float_as_decimal`), would make it one too, so it becomes
/// `CAST('1.5e0' AS DOUBLE)`, which `flink_literals` folds back into a
/// DOUBLE literal. One with a point is a DECIMAL of the digits as written,
/// leading zeros counted (`0.1` DECIMAL(2, 1), `.5` DECIMAL(1, 1), `100.00`
/// DECIMAL(5, 2)), where DataFusion drops them (`0.1` DECIMAL(1, 1)):
/// it becomes `CAST(0.1 AS DECIMAL(2, 1))`, folded the same way.
fn rewrite_numbers(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let mut at = 0;
    while at < tokens.len() {
        let (value, target) = match &tokens[at].token {
            Token::Number(n, _) if n.contains(['e', 'E']) => (
                Token::SingleQuotedString(n.clone()),
                vec![Token::make_word("DOUBLE", None)],
            ),
            Token::Number(n, _) if n.contains('.') => {
                let digits = n.chars().filter(char::is_ascii_digit).count();
                let scale = n
                    .split_once('.')
                    .map_or(0, |(_, f)| f.chars().filter(char::is_ascii_digit).count());
                // Beyond DECIMAL(38): DataFusion's own typing (and error).
                if digits == 0 || digits > 38 {
                    at += 1;
                    continue;
                }
                (
                    tokens[at].token.clone(),
                    vec![
                        Token::make_word("DECIMAL", None),
                        Token::LParen,
                        Token::Number(digits.to_string(), false),
                        Token::Comma,
                        Token::Number(scale.to_string(), false),
                        Token::RParen,
                    ],
                )
            }
            _ => {
                at += 1;
                continue;
            }
        };
        let span = tokens[at].span;
        let mut new = vec![
            Token::make_keyword("CAST"),
            Token::LParen,
            value,
            Token::Whitespace(Whitespace::Space),
            Token::make_keyword("AS"),
            Token::Whitespace(Whitespace::Space),
        ];
        new.extend(target);
        new.push(Token::RParen);
        let count = new.len();
        tokens.splice(at..=at, new.into_iter().map(|t| TokenWithSpan::new(t, span)));
        at += count;
    }
    tokens
}

/// The `)` or `]` that closes the `(` or `[` at `open`, if any.
fn matching_close(tokens: &[TokenWithSpan], open: usize) -> Option<usize> {
    let (opens, closes) = match tokens[open].token {
        Token::LParen => (Token::LParen, Token::RParen),
        Token::LBracket => (Token::LBracket, Token::RBracket),
        _ => return None,
    };
    let mut depth = 0usize;
    (open..tokens.len()).find(|i| {
        if tokens[*i].token == opens {
            depth += 1;
        } else if tokens[*i].token == closes {
            depth -= 1;
        }
        depth == 0
    })
}

/// sqlparser has no `MAP[k1, v1, k2, v2, ...]` value constructor: it
/// becomes the call `__weir_map(k1, v1, ...)` (`functions::flink_calls`
/// plans it). `MAP<K, V>` types and backquoted `map` names are untouched.
fn rewrite_map_tokens(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let next = |from: usize, tokens: &[TokenWithSpan]| (from..tokens.len()).find(|i| !is_blank(&tokens[*i].token));
    let mut at = 0;
    while let Some(map) = next(at, &tokens) {
        at = map + 1;
        if !word(&tokens[map].token, "MAP") {
            continue;
        }
        let Some(open) = next(map + 1, &tokens).filter(|o| tokens[*o].token == Token::LBracket) else {
            continue;
        };
        // An unclosed bracket stays as it is: sqlparser reports it.
        let Some(close) = matching_close(&tokens, open) else {
            continue;
        };
        tokens[map].token = Token::make_word(crate::functions::maps::MAP_FN, None);
        tokens[open].token = Token::LParen;
        tokens[close].token = Token::RParen;
    }
    tokens
}

/// sqlparser reads a member of `JSON_OBJECT(k VALUE v, ...)` only when
/// its key is a name or a string, and has no `KEY` before it (optional in
/// Flink, where the key is any expression): in `JSON_OBJECT` and
/// `JSON_OBJECTAGG` each member `[KEY] k VALUE v` becomes the argument
/// `__weir_json_kv(k, v)` (`functions::flink_calls` reads it back). A
/// trailing `NULL ON NULL` / `ABSENT ON NULL` stays a clause.
fn rewrite_json_member_tokens(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let next = |from: usize, tokens: &[TokenWithSpan]| (from..tokens.len()).find(|i| !is_blank(&tokens[*i].token));
    let mut at = 0;
    while let Some(name) = next(at, &tokens) {
        at = name + 1;
        if !(word(&tokens[name].token, "JSON_OBJECT") || word(&tokens[name].token, "JSON_OBJECTAGG")) {
            continue;
        }
        let Some(open) = next(name + 1, &tokens).filter(|o| tokens[*o].token == Token::LParen) else {
            continue;
        };
        let Some(close) = matching_close(&tokens, open) else {
            continue;
        };
        // The call's members: the indices of their top-level tokens, and
        // where each ends (its comma, the clause or the closing parenthesis).
        let mut members: Vec<(Vec<usize>, usize)> = vec![(vec![], close)];
        let mut depth = 0usize;
        for (i, t) in tokens.iter().enumerate().take(close).skip(open + 1) {
            let t = &t.token;
            if depth == 0 && *t == Token::Comma {
                if let Some(m) = members.last_mut() {
                    m.1 = i;
                }
                members.push((vec![], close));
            } else if depth == 0
                && !is_blank(t)
                && let Some(m) = members.last_mut()
            {
                m.0.push(i);
            }
            match t {
                Token::LParen | Token::LBracket | Token::LBrace => depth += 1,
                Token::RParen | Token::RBracket | Token::RBrace => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if let Some((last, end)) = members.last_mut()
            && last.len() >= 3
        {
            let n = last.len();
            let (a, b, c) = (
                &tokens[last[n - 3]].token,
                &tokens[last[n - 2]].token,
                &tokens[last[n - 1]].token,
            );
            if (word(a, "NULL") || word(a, "ABSENT")) && word(b, "ON") && word(c, "NULL") {
                *end = last[n - 3];
                last.truncate(n - 3);
            }
        }
        // Rewritten from the last member, so earlier indices stay valid.
        for (m, bound) in members.iter().rev() {
            let Some(&first) = m.first() else {
                continue;
            };
            let keyword = word(&tokens[first].token, "KEY") && m.len() > 1 && !word(&tokens[m[1]].token, "VALUE");
            let key_start = usize::from(keyword);
            let Some(value) = m
                .iter()
                .skip(key_start + 1)
                .find(|i| word(&tokens[**i].token, "VALUE"))
                .copied()
            else {
                continue;
            };
            let Some(end) = (value + 1..*bound).rev().find(|i| !is_blank(&tokens[*i].token)) else {
                continue;
            };
            let span = tokens[first].span;
            let at_span = |token: Token| TokenWithSpan { token, span };
            tokens[value].token = Token::Comma;
            tokens.insert(end + 1, at_span(Token::RParen));
            if keyword {
                tokens[first].token = Token::Whitespace(Whitespace::Space);
            }
            tokens.insert(first, at_span(Token::LParen));
            tokens.insert(first, at_span(Token::make_word(crate::functions::json::KV_FN, None)));
        }
        at = open + 1;
    }
    tokens
}

/// sqlparser has no `JSON_VALUE(j, p [RETURNING t] [{NULL | ERROR |
/// DEFAULT literal} ON EMPTY] [{NULL | ERROR | DEFAULT literal} ON ERROR])`
/// clauses: the call becomes
/// `[TRY_CAST(] __weir_json_value_on_error(j, p, 'MODE', CAST(literal AS
/// STRING)) [AS t)]`. ON EMPTY is read and dropped: in Flink 2.3 an
/// absent value is an error, and ON EMPTY never applies (see
/// `flink_json::json_value_on_error`). A
/// DEFAULT that is not a literal (Flink fails on one) is left for
/// sqlparser to refuse.
fn rewrite_json_value_tokens(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let next = |from: usize, tokens: &[TokenWithSpan]| (from..tokens.len()).find(|i| !is_blank(&tokens[*i].token));
    let mut at = 0;
    while let Some(name) = next(at, &tokens) {
        at = name + 1;
        if !word(&tokens[name].token, "JSON_VALUE") {
            continue;
        }
        let Some(open) = next(name + 1, &tokens).filter(|o| tokens[*o].token == Token::LParen) else {
            continue;
        };
        let Some(close) = matching_close(&tokens, open) else {
            continue;
        };
        // The call's own tokens (those at its depth, and the closing
        // parenthesis of each nested one, which ends an argument).
        let mut depth = 0usize;
        let mut top: Vec<usize> = vec![];
        for (i, t) in tokens.iter().enumerate().take(close).skip(open + 1) {
            match t.token {
                Token::LParen => depth += 1,
                Token::RParen => depth -= 1,
                _ => {}
            }
            if depth == 0 && !is_blank(&t.token) {
                top.push(i);
            }
        }
        // Clauses, read from the end: `<behaviour> ON EMPTY|ERROR`.
        let mut end = top.len();
        let mut on_error: Option<(String, Option<Vec<Token>>)> = None;
        let mut clauses = 0;
        let mut valid = true;
        while end >= 3 && clauses < 2 {
            let (on, target) = (top[end - 2], top[end - 1]);
            let is_error = word(&tokens[target].token, "ERROR");
            if !word(&tokens[on].token, "ON") || !(is_error || word(&tokens[target].token, "EMPTY")) {
                break;
            }
            let before = top[end - 3];
            let (mode, literal, start) =
                if word(&tokens[before].token, "NULL") && !(end >= 4 && word(&tokens[top[end - 4]].token, "DEFAULT")) {
                    ("NULL", None, end - 3)
                } else if word(&tokens[before].token, "ERROR") {
                    ("ERROR", None, end - 3)
                } else {
                    // DEFAULT [-] literal
                    let Some(d) = (0..end - 2).rev().find(|k| word(&tokens[top[*k]].token, "DEFAULT")) else {
                        valid = false;
                        break;
                    };
                    let value: Vec<Token> = top[d + 1..end - 2].iter().map(|k| tokens[*k].token.clone()).collect();
                    let literal = match value.as_slice() {
                        [Token::Number(..) | Token::SingleQuotedString(_)] => true,
                        [Token::Minus | Token::Plus, Token::Number(..)] => true,
                        [t] => ["NULL", "TRUE", "FALSE"].iter().any(|w| word(t, w)),
                        _ => false,
                    };
                    if !literal {
                        valid = false;
                        break;
                    }
                    ("DEFAULT", Some(value), d)
                };
            if is_error && on_error.is_none() {
                on_error = Some((mode.to_string(), literal));
            }
            end = start;
            clauses += 1;
        }
        if !valid || clauses == 0 {
            continue;
        }
        // What remains: `j, p [RETURNING type...]`.
        let args = &top[..end];
        let returning = args.iter().position(|k| word(&tokens[*k].token, "RETURNING"));
        let args_end = returning.map_or(top[end - 1] + 1, |r| args[r]);
        // The call's whole span, as each new token's (a computed column's
        // text is cut by its tokens' spans).
        let span = tokens[name].span.union(&tokens[close].span);
        let (mode, default) = on_error.unwrap_or_else(|| ("NULL".to_string(), None));
        let mut new: Vec<Token> = vec![];
        if returning.is_some() {
            new.extend([Token::make_keyword("TRY_CAST"), Token::LParen]);
        }
        new.extend([
            Token::make_word(crate::udf::JSON_VALUE_ON_ERROR_FN, None),
            Token::LParen,
        ]);
        new.extend(tokens[open + 1..args_end].iter().map(|t| t.token.clone()));
        new.extend([Token::Comma, Token::SingleQuotedString(mode), Token::Comma]);
        match default {
            Some(value) => {
                new.extend([Token::make_keyword("CAST"), Token::LParen, Token::LParen]);
                new.extend(
                    value
                        .into_iter()
                        .flat_map(|t| [t, Token::Whitespace(Whitespace::Space)]),
                );
                new.extend([
                    Token::RParen,
                    Token::Whitespace(Whitespace::Space),
                    Token::make_keyword("AS"),
                    Token::Whitespace(Whitespace::Space),
                    Token::make_word("STRING", None),
                    Token::RParen,
                ]);
            }
            None => new.push(Token::make_keyword("NULL")),
        }
        new.push(Token::RParen);
        if let Some(r) = returning {
            new.extend([
                Token::Whitespace(Whitespace::Space),
                Token::make_keyword("AS"),
                Token::Whitespace(Whitespace::Space),
            ]);
            let type_end = top[end - 1];
            new.extend(tokens[args[r] + 1..=type_end].iter().map(|t| t.token.clone()));
            new.push(Token::RParen);
        }
        let count = new.len();
        tokens.splice(name..=close, new.into_iter().map(|t| TokenWithSpan::new(t, span)));
        at = name + count;
    }
    tokens
}

/// Whether `t` is the unquoted word `kw` (any case).
fn word(t: &Token, kw: &str) -> bool {
    matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(kw))
}

/// `sql` is the text the tokens' positions point into.
fn parse_one(tokens: Vec<TokenWithSpan>, sql: &str) -> Result<Statement> {
    let dialect = dialect();
    let (tokens, on_conflict) = split_on_conflict(tokens)?;
    let mut p = Parser::new(&dialect).with_tokens_with_locations(tokens);
    let mut stmt = parse_statement(&mut p, sql)?;
    if let Some(strategy) = on_conflict {
        let insert = match &mut stmt {
            Statement::Explain(inner) => inner.as_mut(),
            other => other,
        };
        match insert {
            Statement::Insert { on_conflict, .. } => *on_conflict = Some(strategy),
            _ => {
                return Err(SqlError::new(
                    ErrorKind::Parse,
                    "ON CONFLICT belongs to an INSERT statement",
                ));
            }
        }
    }
    // Anything left over is a syntax error at its position.
    let next = p.peek_token();
    if next.token != Token::EOF {
        return Err(SqlError::new(
            ErrorKind::Parse,
            format!("unexpected '{}' after the end of the statement", next.token),
        )
        .at(loc(&next)));
    }
    Ok(stmt)
}

/// Takes Flink 2.3's `ON CONFLICT DO DEDUPLICATE | NOTHING | ERROR` off the
/// end of an INSERT (sqlparser knows PostgreSQL's form only).
fn split_on_conflict(mut tokens: Vec<TokenWithSpan>) -> Result<(Vec<TokenWithSpan>, Option<OnConflict>)> {
    let words: Vec<usize> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !is_blank(&t.token))
        .map(|(i, _)| i)
        .collect();
    // `INSERT ...`, `EXPLAIN [PLAN FOR] INSERT ...`.
    let starts_insert = match words.first() {
        Some(i) if word(&tokens[*i].token, "EXPLAIN") => {
            words.iter().take(4).any(|i| word(&tokens[*i].token, "INSERT"))
        }
        Some(i) => word(&tokens[*i].token, "INSERT"),
        None => false,
    };
    let [.., on, conflict, do_, what] = words.as_slice() else {
        return Ok((tokens, None));
    };
    if !starts_insert
        || !word(&tokens[*on].token, "ON")
        || !word(&tokens[*conflict].token, "CONFLICT")
        || !word(&tokens[*do_].token, "DO")
    {
        return Ok((tokens, None));
    }
    let strategy = if word(&tokens[*what].token, "DEDUPLICATE") {
        OnConflict::Deduplicate
    } else if word(&tokens[*what].token, "NOTHING") {
        OnConflict::Nothing
    } else if word(&tokens[*what].token, "ERROR") {
        OnConflict::Error
    } else {
        return Err(SqlError::new(
            ErrorKind::Parse,
            format!(
                "ON CONFLICT DO {} is not a conflict strategy; expected DEDUPLICATE, NOTHING or ERROR",
                tokens[*what].token
            ),
        )
        .at(loc(&tokens[*what])));
    };
    tokens.truncate(*on);
    Ok((tokens, Some(strategy)))
}

fn parse_statement(p: &mut Parser, sql: &str) -> Result<Statement> {
    let start = p.peek_token();
    if p.parse_keyword(Keyword::EXPLAIN) {
        // EXPLAIN [PLAN FOR] <statement>. Not recursive: `EXPLAIN EXPLAIN
        // ...` repeated overflowed the stack.
        let _ = p.parse_keywords(&[Keyword::PLAN, Keyword::FOR]);
        let inner = p.peek_token();
        if matches!(&inner.token, Token::Word(w) if w.keyword == Keyword::EXPLAIN) {
            return Err(SqlError::unsupported("EXPLAIN of an EXPLAIN is not supported").at(loc(&inner)));
        }
        return Ok(Statement::Explain(Box::new(parse_statement(p, sql)?)));
    }
    if p.parse_keyword(Keyword::CREATE) {
        let or_replace = p.parse_keywords(&[Keyword::OR, Keyword::REPLACE]);
        let temporary = p.parse_keyword(Keyword::TEMPORARY);
        if p.parse_keyword(Keyword::TABLE) {
            if or_replace {
                return Err(refusals::CREATE_OR_REPLACE_TABLE.error().at(loc(&start)));
            }
            let mut ct = parse_create_table(p, sql)?;
            ct.temporary = temporary;
            return Ok(Statement::CreateTable(ct));
        }
        if p.parse_keyword(Keyword::VIEW) {
            let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
            let name = object_name(&p.parse_object_name(false)?);
            p.expect_keyword(Keyword::AS)?;
            let query = p.parse_query()?;
            return Ok(Statement::CreateView {
                name,
                if_not_exists,
                or_replace,
                temporary,
                query,
            });
        }
        let t = p.peek_token();
        return Err(SqlError::unsupported(format!(
            "CREATE {} is not supported; expected CREATE TABLE or CREATE VIEW",
            t.token
        ))
        .at(loc(&t)));
    }
    if p.parse_keyword(Keyword::DROP) {
        let temporary = p.parse_keyword(Keyword::TEMPORARY);
        let view = if p.parse_keyword(Keyword::VIEW) {
            true
        } else {
            p.expect_keyword(Keyword::TABLE)?;
            false
        };
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let name = object_name(&p.parse_object_name(false)?);
        return Ok(Statement::Drop {
            name,
            view,
            if_exists,
            temporary,
        });
    }
    if p.parse_keyword(Keyword::SHOW) {
        if p.parse_keyword(Keyword::TABLES) {
            return Ok(Statement::ShowTables);
        }
        if p.parse_keyword(Keyword::VIEWS) {
            return Ok(Statement::ShowViews);
        }
        if p.parse_keyword(Keyword::CREATE) {
            let view = if p.parse_keyword(Keyword::VIEW) {
                true
            } else {
                p.expect_keyword(Keyword::TABLE)?;
                false
            };
            let name = object_name(&p.parse_object_name(false)?);
            return Ok(Statement::ShowCreate { name, view });
        }
        if parse_word(p, "JOBS") {
            return Ok(Statement::ShowJobs);
        }
        for (word, make) in [
            ("WATERMARKS", Statement::ShowWatermarks as fn(String) -> Statement),
            ("CHECKPOINTS", Statement::ShowCheckpoints),
            ("SAVEPOINTS", Statement::ShowSavepoints),
        ] {
            if parse_word(p, word) {
                p.expect_keyword(Keyword::FOR)?;
                if !parse_word(p, "JOB") {
                    let t = p.peek_token();
                    return Err(
                        SqlError::new(ErrorKind::Parse, format!("expected JOB, found {}", t.token)).at(loc(&t)),
                    );
                }
                return Ok(make(parse_string_literal(p)?));
            }
        }
        let t = p.peek_token();
        return Err(SqlError::unsupported(format!(
            "SHOW {} is not supported; try SHOW TABLES, SHOW VIEWS, SHOW CREATE TABLE, SHOW JOBS, SHOW WATERMARKS FOR JOB, SHOW CHECKPOINTS FOR JOB \
             or SHOW SAVEPOINTS FOR JOB",
            t.token
        ))
        .at(loc(&t)));
    }
    if p.parse_keyword(Keyword::DESCRIBE) || p.parse_keyword(Keyword::DESC) {
        // `DESCRIBE JOB 'x'`; a table named `job` is still `DESCRIBE job`.
        if matches!(p.peek_nth_token(1).token, Token::SingleQuotedString(_)) && parse_word(p, "JOB") {
            return Ok(Statement::DescribeJob(parse_string_literal(p)?));
        }
        return Ok(Statement::Describe(object_name(&p.parse_object_name(false)?)));
    }
    let expect_job = |p: &mut Parser| -> Result<()> {
        if parse_word(p, "JOB") {
            return Ok(());
        }
        let t = p.peek_token();
        Err(SqlError::new(ErrorKind::Parse, format!("expected JOB, found {}", t.token)).at(loc(&t)))
    };
    // An optional directory: a string literal.
    let optional_dir = |p: &mut Parser| -> Result<Option<String>> {
        match p.peek_token().token {
            Token::SingleQuotedString(_) => Ok(Some(parse_string_literal(p)?)),
            _ => Ok(None),
        }
    };
    if parse_word(p, "STOP") {
        expect_job(p)?;
        let job = parse_string_literal(p)?;
        if !p.parse_keyword(Keyword::WITH) {
            return Ok(Statement::StopJob(job));
        }
        if !parse_word(p, "SAVEPOINT") {
            let t = p.peek_token();
            return Err(SqlError::new(
                ErrorKind::Parse,
                format!("expected SAVEPOINT after WITH, found {}", t.token),
            )
            .at(loc(&t)));
        }
        let dir = optional_dir(p)?;
        let drain = parse_word(p, "DRAIN");
        return Ok(Statement::StopJobWithSavepoint { job, dir, drain });
    }
    if parse_word(p, "CANCEL") {
        expect_job(p)?;
        return Ok(Statement::CancelJob(parse_string_literal(p)?));
    }
    // `SAVEPOINT JOB 'x'`; SQL's transaction `SAVEPOINT name` is not ours.
    if matches!(p.peek_nth_token(1).token, Token::Word(ref w) if w.value.eq_ignore_ascii_case("JOB"))
        && parse_word(p, "SAVEPOINT")
    {
        expect_job(p)?;
        let job = parse_string_literal(p)?;
        let dir = optional_dir(p)?;
        return Ok(Statement::SavepointJob { job, dir });
    }
    if parse_word(p, "SUBSCRIBE") {
        p.expect_keyword(Keyword::TO)?;
        let query = if p.peek_token().token == Token::LParen {
            p.expect_token(&Token::LParen)?;
            let q = p.parse_query()?;
            p.expect_token(&Token::RParen)?;
            q
        } else {
            // `SUBSCRIBE TO t` is `SUBSCRIBE TO (SELECT * FROM t)`.
            let name = p.parse_object_name(false)?;
            let sql = format!("SELECT * FROM {name}");
            let dialect = dialect();
            Parser::new(&dialect).try_with_sql(&sql)?.parse_query()?
        };
        return Ok(Statement::Subscribe(query));
    }
    if p.parse_keywords(&[Keyword::ALTER, Keyword::TABLE]) {
        return parse_alter_table(p);
    }
    if p.parse_keyword(Keyword::SET) {
        if p.peek_token().token == Token::EOF {
            return Ok(Statement::Set(None));
        }
        let key = parse_option_text(p, true)?;
        p.expect_token(&Token::Eq)?;
        let value = parse_option_text(p, false)?;
        return Ok(Statement::Set(Some((key, value))));
    }
    if p.parse_keyword(Keyword::RESET) {
        if p.peek_token().token == Token::EOF {
            return Ok(Statement::Reset(None));
        }
        return Ok(Statement::Reset(Some(parse_option_text(p, true)?)));
    }
    match p.parse_statement()? {
        ast::Statement::Query(q) => Ok(Statement::Query(q)),
        ast::Statement::Insert(insert) => {
            let table = match &insert.table {
                ast::TableObject::TableName(n) => object_name(n),
                other => {
                    return Err(SqlError::unsupported(format!("INSERT INTO {other} is not supported")).at(loc(&start)));
                }
            };
            // Flink overwrites only in batch mode (Weir runs every job in
            // streaming mode); appending instead would be another meaning.
            if insert.overwrite {
                return Err(refusals::INSERT_OVERWRITE.error().at(loc(&start)));
            }
            if insert.partitioned.is_some() {
                return Err(refusals::INSERT_PARTITION.error().at(loc(&start)));
            }
            // A column named in parts (`t.c`) is not one of the sink's.
            let columns = insert
                .columns
                .iter()
                .map(|c| {
                    use sqlparser::ast::Spanned;
                    let s = c.span().start;
                    let at = Location {
                        line: s.line,
                        column: s.column,
                    };
                    match c.0.as_slice() {
                        [part] => part
                            .as_ident()
                            .map(|i| (i.value.clone(), at))
                            .ok_or_else(|| SqlError::plan(format!("Unknown target column '{c}'")).at(at)),
                        _ => Err(SqlError::plan(format!("Unknown target column '{c}'")).at(at)),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            if let Some(on) = &insert.on {
                return Err(SqlError::unsupported(format!(
                    "INSERT ... {on} is not supported; Flink's form is ON CONFLICT DO DEDUPLICATE, DO NOTHING or DO \
                     ERROR, without a conflict target"
                ))
                .at(loc(&start)));
            }
            let query = insert
                .source
                .ok_or_else(|| SqlError::unsupported("INSERT without a query is not supported").at(loc(&start)))?;
            Ok(Statement::Insert {
                table,
                columns,
                query,
                on_conflict: None,
            })
        }
        other => {
            let kind = other
                .to_string()
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            Err(SqlError::unsupported(format!("statement '{kind} ...' is not supported")).at(loc(&start)))
        }
    }
}

/// `[CONSTRAINT name] PRIMARY KEY`, consumed when there (the name is
/// Flink's too and says nothing Weir keeps).
fn parse_primary_key_words(p: &mut Parser) -> Result<Option<()>> {
    if p.parse_keyword(Keyword::CONSTRAINT) {
        p.parse_identifier()?;
        p.expect_keywords(&[Keyword::PRIMARY, Keyword::KEY])?;
        return Ok(Some(()));
    }
    Ok(p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]).then_some(()))
}

/// A primary key is `NOT ENFORCED` in Flink, and says so.
fn not_enforced(p: &mut Parser, start: &TokenWithSpan) -> Result<()> {
    if p.parse_keywords(&[Keyword::NOT, Keyword::ENFORCED]) {
        return Ok(());
    }
    // Flink's message, word for word.
    Err(SqlError::plan(
        "Flink doesn't support ENFORCED mode for PRIMARY KEY constraint. ENFORCED/NOT ENFORCED \
         controls if the constraint checks are performed on the incoming/outgoing data. Flink \
         does not own the data therefore the only supported mode is the NOT ENFORCED mode",
    )
    .at(loc(start)))
}

/// `('k' = 'v', ...)`: a table's options (CREATE TABLE's WITH, ALTER
/// TABLE's SET), each with where its key starts.
fn parse_option_list(p: &mut Parser) -> Result<Vec<(String, String, Location)>> {
    p.expect_token(&Token::LParen)?;
    let mut options = vec![];
    loop {
        let at = p.peek_token();
        let key = parse_string_literal(p)?;
        p.expect_token(&Token::Eq)?;
        let value = parse_string_literal(p)?;
        options.push((key, value, loc(&at)));
        if !p.consume_token(&Token::Comma) {
            break;
        }
    }
    p.expect_token(&Token::RParen)?;
    Ok(options)
}

/// After `ALTER TABLE`: `[IF EXISTS] t SET ('k' = 'v', ...)`,
/// `RESET ('k', ...)` or `RENAME TO t2`.
fn parse_alter_table(p: &mut Parser) -> Result<Statement> {
    let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
    let name = object_name(&p.parse_object_name(false)?);
    let at = p.peek_token();
    let change = if p.parse_keyword(Keyword::SET) {
        TableChange::Set(parse_option_list(p)?)
    } else if p.parse_keyword(Keyword::RESET) {
        p.expect_token(&Token::LParen)?;
        let mut keys = vec![];
        loop {
            let at = p.peek_token();
            keys.push((parse_string_literal(p)?, loc(&at)));
            if !p.consume_token(&Token::Comma) {
                break;
            }
        }
        p.expect_token(&Token::RParen)?;
        TableChange::Reset(keys)
    } else if p.parse_keywords(&[Keyword::RENAME, Keyword::TO]) {
        TableChange::RenameTo(object_name(&p.parse_object_name(false)?))
    } else {
        return Err(SqlError::unsupported(format!(
            "ALTER TABLE {name} {}: Weir alters a table with SET ('key' = 'value', ...), RESET ('key', ...) or RENAME TO; \
             to change its columns or watermark, DROP TABLE and CREATE TABLE again",
            at.token
        ))
        .at(loc(&at)));
    };
    Ok(Statement::AlterTable {
        name,
        if_exists,
        change,
    })
}

/// An option key or value: a quoted string, or words, numbers and dots
/// (`SET parallelism.default = 4` as well as `SET 'parallelism.default' = '4'`).
fn parse_option_text(p: &mut Parser, key: bool) -> Result<String> {
    let mut text = String::new();
    loop {
        let t = p.peek_token();
        match &t.token {
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) if text.is_empty() => {
                p.next_token();
                return Ok(s.clone());
            }
            Token::Word(w) => text.push_str(&w.value),
            Token::Number(n, _) => text.push_str(n),
            Token::Period => text.push('.'),
            Token::Minus => text.push('-'),
            Token::Whitespace(_) => {}
            Token::EOF | Token::Eq if !text.is_empty() => return Ok(text),
            other => {
                let what = if key { "an option key" } else { "an option value" };
                return Err(SqlError::new(
                    ErrorKind::Parse,
                    format!("expected {what} such as 'parallelism.default', found {other}"),
                )
                .at(loc(&t)));
            }
        }
        p.next_token();
        if key && p.peek_token().token == Token::Eq {
            return Ok(text);
        }
    }
}

fn parse_create_table(p: &mut Parser, sql: &str) -> Result<CreateTable> {
    let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = object_name(&p.parse_object_name(false)?);
    let mut columns = vec![];
    let mut watermark = None;
    let mut primary_key = None;
    if p.consume_token(&Token::LParen) {
        loop {
            let start = p.peek_token();
            if parse_word(p, "WATERMARK") {
                p.expect_keyword(Keyword::FOR)?;
                let column = p.parse_identifier()?;
                p.expect_keyword(Keyword::AS)?;
                let (expr, expr_text) = parse_written_expr(p, sql)?;
                let at = p.peek_token();
                let alignment = if parse_word(p, "ALIGNMENT") {
                    // ALIGNMENT GROUP 'g' MAX DRIFT <interval> [UPDATE <interval>]
                    p.expect_keyword(Keyword::GROUP)?;
                    let group = parse_string_literal(p)?;
                    p.expect_keyword(Keyword::MAX)?;
                    if !parse_word(p, "DRIFT") {
                        let t = p.peek_token();
                        return Err(SqlError::new(
                            ErrorKind::Parse,
                            format!("expected DRIFT after MAX, found {}", t.token),
                        )
                        .at(loc(&t)));
                    }
                    let max_drift = p.parse_expr()?;
                    let update_interval = if p.parse_keyword(Keyword::UPDATE) {
                        Some(p.parse_expr()?)
                    } else {
                        None
                    };
                    Some(AlignmentClause {
                        group,
                        max_drift,
                        update_interval,
                        location: loc(&at),
                    })
                } else {
                    None
                };
                if watermark.is_some() {
                    return Err(SqlError::plan("a table can have only one WATERMARK clause").at(loc(&start)));
                }
                watermark = Some(WatermarkClause {
                    column,
                    expr,
                    expr_text,
                    alignment,
                    location: loc(&start),
                });
            } else if let Some(()) = parse_primary_key_words(p)? {
                // `[CONSTRAINT name] PRIMARY KEY (cols) NOT ENFORCED`.
                let cols = p.parse_parenthesized_column_list(sqlparser::parser::IsOptional::Mandatory, false)?;
                not_enforced(p, &start)?;
                if primary_key.is_some() {
                    return Err(SqlError::plan("a table can have only one PRIMARY KEY").at(loc(&start)));
                }
                primary_key = Some((cols, loc(&start)));
            } else {
                let name = p.parse_identifier()?;
                if p.parse_keyword(Keyword::AS) {
                    let (expr, text) = parse_written_expr(p, sql)?;
                    columns.push(ColumnSpec {
                        name,
                        data_type: None,
                        nullable: true,
                        computed: Some(expr),
                        computed_text: Some(text),
                        metadata: None,
                        location: loc(&start),
                    });
                } else {
                    let data_type = parse_column_type(p)?;
                    let mut nullable = true;
                    if p.parse_keywords(&[Keyword::NOT, Keyword::NULL]) {
                        nullable = false;
                    } else {
                        let _ = p.parse_keyword(Keyword::NULL);
                    }
                    // The column-level form: `id BIGINT [CONSTRAINT pk]
                    // PRIMARY KEY NOT ENFORCED`.
                    let key_at = p.peek_token();
                    if let Some(()) = parse_primary_key_words(p)? {
                        not_enforced(p, &key_at)?;
                        if primary_key.is_some() {
                            return Err(SqlError::plan("a table can have only one PRIMARY KEY").at(loc(&key_at)));
                        }
                        primary_key = Some((vec![name.clone()], loc(&key_at)));
                    }
                    let metadata = if p.parse_keyword(Keyword::METADATA) {
                        let key = if p.parse_keyword(Keyword::FROM) {
                            Some(parse_string_literal(p)?)
                        } else {
                            None
                        };
                        Some((key, p.parse_keyword(Keyword::VIRTUAL)))
                    } else {
                        None
                    };
                    if p.parse_keyword(Keyword::COMMENT) {
                        p.parse_literal_string()?;
                    }
                    columns.push(ColumnSpec {
                        name,
                        data_type: Some(data_type),
                        nullable,
                        computed: None,
                        computed_text: None,
                        metadata,
                        location: loc(&start),
                    });
                }
            }
            if p.consume_token(&Token::Comma) {
                continue;
            }
            p.expect_token(&Token::RParen)?;
            break;
        }
    }
    if p.parse_keyword(Keyword::COMMENT) {
        p.parse_literal_string()?;
    }
    let t = p.peek_token();
    let partitioned_by = if p.parse_keywords(&[Keyword::PARTITIONED, Keyword::BY]) {
        let cols = p.parse_parenthesized_column_list(sqlparser::parser::IsOptional::Mandatory, false)?;
        Some((cols, loc(&t)))
    } else {
        None
    };
    let mut options = vec![];
    if p.parse_keyword(Keyword::WITH) {
        options = parse_option_list(p)?;
    }
    Ok(CreateTable {
        primary_key,
        partitioned_by,
        name,
        if_not_exists,
        temporary: false,
        columns,
        watermark,
        options,
    })
}

/// An expression and its text in `sql` as written (before the token
/// rewrites: `0.1`, not `CAST(0.1 AS DECIMAL(2, 1))`).
fn parse_written_expr(p: &mut Parser, sql: &str) -> Result<(Expr, String)> {
    let start = loc(&p.peek_token());
    let expr = p.parse_expr()?;
    // The last token read: the parser may have looked ahead and stepped
    // back, which leaves blanks before its position.
    let mut at = p.get_current_index();
    while at > 0 && is_blank(&p.token_at(at).token) {
        at -= 1;
    }
    let last = p.token_at(at);
    let end = Location {
        line: last.span.end.line,
        column: last.span.end.column,
    };
    Ok((expr, slice_text(sql, start, end)))
}

/// A column's type, with Flink's nested types that sqlparser's generic
/// dialect lacks: `MAP<K, V>`, `MULTISET<T>`, `ROW<name type, ...>` and
/// `ROW(name type, ...)`, and `ARRAY<T>` of them, where `>>` closes two at once. The rest
/// is sqlparser's. `NOT NULL` inside a nested type is accepted and not
/// kept (the field stays nullable).
fn parse_column_type(p: &mut Parser) -> Result<ast::DataType> {
    let mut pending = 0;
    let t = parse_nested_type(p, &mut pending)?;
    if pending > 0 {
        return Err(SqlError::new(ErrorKind::Parse, "unmatched '>' after the column's type").at(loc(&p.peek_token())));
    }
    Ok(t)
}

/// One (possibly nested) type; `pending` counts the `>` of enclosing
/// types a `>>` has already consumed.
fn parse_nested_type(p: &mut Parser, pending: &mut usize) -> Result<ast::DataType> {
    let at = p.peek_token();
    let word = match &at.token {
        Token::Word(w) if w.quote_style.is_none() => w.value.to_ascii_uppercase(),
        _ => String::new(),
    };
    let opens = |t: &Token| matches!(t, Token::Lt) || (word == "ROW" && matches!(t, Token::LParen));
    if !matches!(word.as_str(), "ARRAY" | "MAP" | "ROW" | "MULTISET") || !opens(&p.peek_nth_token(1).token) {
        return Ok(p.parse_data_type()?);
    }
    p.next_token();
    if word == "ROW" && p.consume_token(&Token::LParen) {
        let fields = parse_row_fields(p, pending)?;
        if *pending > 0 {
            return Err(SqlError::new(ErrorKind::Parse, "unmatched '>' in ROW(...)").at(loc(&p.peek_token())));
        }
        p.expect_token(&Token::RParen)?;
        return Ok(ast::DataType::Struct(fields, ast::StructBracketKind::Parentheses));
    }
    p.expect_token(&Token::Lt)?;
    let t = match word.as_str() {
        "ARRAY" => {
            let elem = parse_nested_type(p, pending)?;
            skip_not_null(p, *pending);
            ast::DataType::Array(ast::ArrayElemTypeDef::AngleBracket(Box::new(elem)))
        }
        "MAP" => {
            let key = parse_nested_type(p, pending)?;
            skip_not_null(p, *pending);
            if *pending > 0 {
                return Err(SqlError::new(ErrorKind::Parse, "MAP<K, V> needs a value type").at(loc(&at)));
            }
            p.expect_token(&Token::Comma)?;
            let value = parse_nested_type(p, pending)?;
            skip_not_null(p, *pending);
            ast::DataType::Map(Box::new(key), Box::new(value))
        }
        "MULTISET" => {
            let elem = parse_nested_type(p, pending)?;
            skip_not_null(p, *pending);
            crate::types::multiset_ast(elem)
        }
        _ => ast::DataType::Struct(parse_row_fields(p, pending)?, ast::StructBracketKind::AngleBrackets),
    };
    close_angle(p, pending)?;
    Ok(t)
}

/// `name type [NOT NULL] ['comment'], ...` up to the closing bracket
/// (not consumed), or up to a `>>` that closed it.
fn parse_row_fields(p: &mut Parser, pending: &mut usize) -> Result<Vec<ast::StructField>> {
    let mut fields = vec![];
    loop {
        let name = p.parse_identifier()?;
        let field_type = parse_nested_type(p, pending)?;
        skip_not_null(p, *pending);
        if *pending == 0 && matches!(p.peek_token().token, Token::SingleQuotedString(_)) {
            p.next_token();
        }
        fields.push(ast::StructField {
            field_name: Some(name),
            field_type,
            options: None,
        });
        if *pending > 0 || !p.consume_token(&Token::Comma) {
            return Ok(fields);
        }
    }
}

fn skip_not_null(p: &mut Parser, pending: usize) {
    if pending == 0 && !p.parse_keywords(&[Keyword::NOT, Keyword::NULL]) {
        let _ = p.parse_keyword(Keyword::NULL);
    }
}

/// The `>` closing a nested type, or the second half of a `>>`.
fn close_angle(p: &mut Parser, pending: &mut usize) -> Result<()> {
    if *pending > 0 {
        *pending -= 1;
        return Ok(());
    }
    let t = p.next_token();
    match &t.token {
        Token::Gt => Ok(()),
        Token::ShiftRight => {
            *pending += 1;
            Ok(())
        }
        other => Err(SqlError::new(
            ErrorKind::Parse,
            format!("expected '>' closing the type, found {other}"),
        )
        .at(loc(&t))),
    }
}

fn parse_string_literal(p: &mut Parser) -> Result<String> {
    let t = p.next_token();
    match &t.token {
        Token::SingleQuotedString(s) => Ok(s.clone()),
        other => Err(SqlError::new(
            ErrorKind::Parse,
            format!("expected a quoted string like 'connector', found {other}"),
        )
        .at(loc(&t))),
    }
}

/// Consumes an unquoted word that sqlparser has no keyword for.
fn parse_word(p: &mut Parser, word: &str) -> bool {
    match &p.peek_token().token {
        Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word) => {
            p.next_token();
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_statements_and_keeps_positions() {
        let s = parse("SET 'a.b' = 'x';\n  SHOW TABLES;\nRESET;").expect("parse");
        assert_eq!(s.len(), 3);
        assert!(matches!(&s[0].statement, Statement::Set(Some((k, v))) if k == "a.b" && v == "x"));
        assert_eq!(s[1].location, Location { line: 2, column: 3 });
        assert_eq!(s[1].text, "SHOW TABLES");
    }

    #[test]
    fn create_table_with_watermark_and_options() {
        let sql = "CREATE TABLE t (a BIGINT, `ts` TIMESTAMP(3), b AS a + 1,\n WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH ('connector' = 'nexmark')";
        let s = parse(sql).expect("parse");
        let Statement::CreateTable(ct) = &s[0].statement else {
            panic!("not create table")
        };
        assert_eq!(ct.columns.len(), 3);
        assert!(ct.watermark.is_some());
        assert_eq!(ct.options[0].0, "connector");
    }

    #[test]
    fn syntax_errors_carry_position() {
        let e = parse("SELECT 1;\nCREATE TABLE t (a BIGINT,, b INT)").expect_err("bad");
        assert_eq!(e.location, Some(Location { line: 2, column: 26 }), "{e}");
    }

    #[test]
    fn long_operator_chains_are_refused_with_their_position() {
        // Built by a loop in sqlparser, walked by recursion everywhere
        // else: 200 000 of them overflowed the stack.
        for sql in [
            format!("SELECT 1{}", " + 1".repeat(200_000)),
            format!("SELECT 1{}", " UNION ALL SELECT 1".repeat(MAX_NESTING)),
            format!("SELECT 1{}", "::BIGINT".repeat(MAX_NESTING)),
            format!(
                "SELECT * FROM t0{}",
                (1..MAX_NESTING).map(|i| format!(", t{i}")).collect::<String>()
            ),
            format!("SELECT x{}", " + CASE WHEN a THEN 1 END".repeat(MAX_NESTING)),
        ] {
            let e = parse(&sql).expect_err("too deep");
            assert!(e.message.contains("nested too deeply"), "{e}");
            assert_eq!(e.location.map(|l| l.line), Some(1), "{e}");
        }
        let e = parse("SELECT\n  1 + (2 * (3").expect_err("not too deep, but unfinished");
        assert!(!e.message.contains("nested too deeply"), "{e}");
    }

    #[test]
    fn wide_statements_are_not_deep() {
        let ins = (0..5_000).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
        let cols = (0..1_000)
            .map(|i| format!("a + {i} AS c{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let whens = (0..1_000)
            .map(|i| format!("WHEN a = {i} THEN 'x{i}'"))
            .collect::<String>();
        let ors = (0..25).map(|i| format!("a = {i}")).collect::<Vec<_>>().join(" OR ");
        for sql in [
            format!("SELECT * FROM t WHERE a IN ({ins})"),
            format!("SELECT {cols} FROM t"),
            format!("SELECT CASE {whens} ELSE 'y' END FROM t"),
            format!("SELECT * FROM t WHERE {ors}"),
        ] {
            parse(&sql).expect("wide, not deep");
        }
    }

    #[test]
    fn explain_of_explain_is_refused_not_recursed() {
        let e = parse("EXPLAIN EXPLAIN SELECT 1").expect_err("refused");
        assert_eq!(e.location, Some(Location { line: 1, column: 9 }), "{e}");
        // 100 000 of them overflowed the stack; now the nesting bound says no.
        parse(&format!("{}SELECT 1", "EXPLAIN ".repeat(100_000))).expect_err("refused");
        parse("EXPLAIN PLAN FOR SELECT 1").expect("one EXPLAIN");
    }

    #[test]
    fn window_tvf_parses() {
        let s =
            parse("SELECT * FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))").expect("parse");
        assert!(matches!(s[0].statement, Statement::Query(_)));
    }
}
