//! Streaming plans: immutable descriptions of what a job runs. `...Node`
//! types describe; operators in [`crate::operators`] run.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use weir_catalog::TableDef;

use crate::canonical::canonical_exprs;
use crate::config::{JobConfig, StateBackendKind};
use crate::connectors::{SinkFactory, SourceFactory};

pub type NodeId = usize;

#[derive(Debug)]
pub struct StreamGraph {
    pub nodes: Vec<StreamNode>,
    pub edges: Vec<StreamEdge>,
}

#[derive(Debug)]
pub struct StreamNode {
    pub id: NodeId,
    /// Stable identity of the node's state; set by [`crate::uid::graph`],
    /// the one way a graph is built.
    pub uid: String,
    pub parallelism: usize,
    pub schema: SchemaRef,
    pub kind: NodeKind,
    /// The row kinds the node's output may hold, and its upsert key.
    pub changelog: ChangelogMode,
}

/// Which row kinds a node's output may hold (Flink's `ChangelogMode`), and
/// its upsert key. Weir's updating operators emit full retractions: an
/// update is `-U` (the old row) then `+U` (the new one), a delete carries
/// the whole row (Flink's BEFORE_AND_AFTER with full deletes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangelogMode {
    /// `-U`/`+U` pairs.
    pub updates: bool,
    /// `-D`.
    pub deletes: bool,
    /// Output columns that identify a row among the live rows (a GROUP BY's
    /// keys); `None` when unknown. Empty: at most one live row.
    pub upsert_key: Option<Vec<usize>>,
    /// Updates come as `+U` alone, without `-U` (Flink's upsert mode: an
    /// upsert materializer's output, by its key).
    pub no_update_before: bool,
}

impl ChangelogMode {
    pub fn insert_only() -> Self {
        Self::default()
    }

    pub fn is_insert_only(&self) -> bool {
        !self.updates && !self.deletes
    }

    /// Flink's EXPLAIN text: `[I]`, `[I,UB,UA]`, `[I,UB,UA,D]`.
    pub fn kinds(&self) -> String {
        let mut k = vec!["I"];
        if self.updates && !self.no_update_before {
            k.push("UB");
        }
        if self.updates {
            k.push("UA");
        }
        if self.deletes {
            k.push("D");
        }
        format!("[{}]", k.join(","))
    }

    /// Flink's words for what an insert-only consumer cannot take:
    /// `update`, `delete` or `update and delete`.
    pub fn changes_text(&self) -> &'static str {
        match (self.updates, self.deletes) {
            (true, true) => "update and delete",
            (true, false) => "update",
            (false, true) => "delete",
            (false, false) => "insert",
        }
    }

    /// The mode after a projection: the kinds stay, the upsert key
    /// survives when every key column is projected as a plain column.
    pub fn through_projection(&self, projected: &[Option<usize>]) -> Self {
        let upsert_key = self.upsert_key.as_ref().and_then(|key| {
            key.iter()
                .map(|k| projected.iter().position(|p| *p == Some(*k)))
                .collect::<Option<Vec<usize>>>()
        });
        ChangelogMode {
            upsert_key,
            ..self.clone()
        }
    }
}

// Built once per job: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum NodeKind {
    Source(SourceNode),
    Calc(CalcNode),
    WindowAggregate(WindowAggregateNode),
    GroupAggregate(GroupAggregateNode),
    Join(JoinNode),
    /// `UNION ALL`: every input's rows (and changes), relabelled to the
    /// union's columns.
    Union,
    Rank(RankNode),
    Limit(LimitNode),
    UpsertMaterialize(UpsertMaterializeNode),
    ChangelogNormalize(ChangelogNormalizeNode),
    TemporalSort(TemporalSortNode),
    SessionWindow(SessionWindowNode),
    OverAggregate(OverAggregateNode),
    Sink(SinkNode),
}

/// What a node's keyed state is partitioned by ([`PlanNode::state_keys`]),
/// read by the restore's key-type check and required by every operator
/// that opens keyed state (`BuildCtx::open_keyed` refuses a node that
/// reports none).
#[derive(Debug, Clone, Copy)]
pub enum StateKeys<'a> {
    /// No keyed state (stateless, or operator state only).
    None,
    /// Keyed state under these expressions of the first input; empty: one
    /// key for all rows (a global aggregate, an unpartitioned session).
    Keyed(&'a [Arc<dyn PhysicalExpr>]),
}

/// What every plan node answers, each kind beside its operator (the
/// operator's file holds its node's description, EXPLAIN state line, uid
/// text and state keys, next to the `build` that makes the operator), so
/// adding an operator touches its own file and one arm of
/// [`NodeKind::spec`].
pub trait PlanNode {
    /// The node's one-line EXPLAIN description.
    fn describe(&self) -> String;
    /// What the node keeps in state, for EXPLAIN (after `state: <backend>, `);
    /// `None` for a stateless node.
    fn explain_state(&self) -> Option<String> {
        None
    }
    /// The node's kind and defining text for its uid ([`crate::uid`]), in
    /// [`crate::canonical`] form: changing this text changes the uid, so a
    /// savepoint no longer restores into the node.
    fn uid_body(&self, node: &StreamNode) -> (&'static str, String);
    /// What the node's keyed state is partitioned by.
    fn state_keys(&self) -> StateKeys<'_> {
        StateKeys::None
    }
    /// The changes the node emits given its (first) input's (Flink's
    /// changelog-mode inference for this kind): by default what comes in.
    /// Joins, unions and ranks keep this default; the planner sets their
    /// mode once every input is known.
    fn changelog(&self, input: &ChangelogMode) -> ChangelogMode {
        input.clone()
    }
}

/// The column indexes of `exprs` when each is a plain column (an upsert
/// key is made of columns).
pub fn column_indexes(exprs: &[Arc<dyn PhysicalExpr>]) -> Option<Vec<usize>> {
    exprs
        .iter()
        .map(|k| {
            k.downcast_ref::<datafusion::physical_expr::expressions::Column>()
                .map(|c| c.index())
        })
        .collect()
}

/// `UNION ALL`'s plan node: it has no fields of its own.
pub struct UnionNode;

impl PlanNode for UnionNode {
    fn describe(&self) -> String {
        "Union All".to_string()
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        ("union", String::new())
    }
}

impl NodeKind {
    /// The node's answers to [`PlanNode`]: the one match over kinds.
    pub fn spec(&self) -> &dyn PlanNode {
        match self {
            NodeKind::Source(n) => n,
            NodeKind::Calc(n) => n,
            NodeKind::WindowAggregate(n) => n,
            NodeKind::GroupAggregate(n) => n,
            NodeKind::Join(n) => n,
            NodeKind::Union => &UnionNode,
            NodeKind::Rank(n) => n,
            NodeKind::Limit(n) => n,
            NodeKind::UpsertMaterialize(n) => n,
            NodeKind::ChangelogNormalize(n) => n,
            NodeKind::TemporalSort(n) => n,
            NodeKind::SessionWindow(n) => n,
            NodeKind::OverAggregate(n) => n,
            NodeKind::Sink(n) => n,
        }
    }

    /// What the node's keyed state is partitioned by, read by the
    /// restore's key-type check and required by every operator that opens
    /// keyed state (`BuildCtx::open_keyed` refuses a node that reports none).
    pub fn state_keys(&self) -> StateKeys<'_> {
        self.spec().state_keys()
    }
}

/// The frame of an OVER aggregate on event time, ending at the current row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverFrame {
    /// `ROWS n PRECEDING` (`None`: UNBOUNDED PRECEDING).
    Rows(Option<u64>),
    /// `RANGE INTERVAL ... PRECEDING`, in ms (`None`: UNBOUNDED).
    Range(Option<i64>),
}

/// `agg(...) OVER (PARTITION BY .. ORDER BY rowtime <frame>)`: each row
/// with its aggregates, emitted when the watermark passes its time.
#[derive(Debug)]
pub struct OverAggregateNode {
    pub partition: Vec<Arc<dyn PhysicalExpr>>,
    /// The input's rowtime column (the ORDER BY).
    pub time_column: usize,
    pub frame: OverFrame,
    pub aggregates: Vec<Arc<AggregateFunctionExpr>>,
    /// `LAG(arg [, offset [, default]])` calls.
    pub lags: Vec<LagCall>,
    /// The columns after the input's, in the SELECT's order.
    pub outputs: Vec<OverOutput>,
}

/// `LAG(arg, offset, default)` over an event-time frame (Flink's
/// `LagAggFunction`): the value `offset` rows before the frame's last row.
#[derive(Debug, Clone)]
pub struct LagCall {
    pub arg: Arc<dyn PhysicalExpr>,
    pub offset: usize,
    /// When the frame has no row that far back (NULL unless given).
    pub default: datafusion::common::ScalarValue,
}

/// One output column of an OVER aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverOutput {
    Aggregate(usize),
    Lag(usize),
}

/// The SESSION window TVF on its own (not under a window aggregate that
/// groups by its partition): every row, with its session's
/// `window_start`, `window_end`, `window_time` appended, emitted when the
/// watermark passes the session's end.
#[derive(Debug)]
pub struct SessionWindowNode {
    /// The gap, in milliseconds.
    pub gap: i64,
    /// The input's time attribute.
    pub time_column: usize,
    /// `PARTITION BY` keys (none: one session sequence for all rows).
    pub partition: Vec<Arc<dyn PhysicalExpr>>,
    /// A TIMESTAMP_LTZ time attribute in a session zone: sessions on the
    /// zone's wall clock (the time column's instants read as wall times,
    /// watermarks compared on that clock, `window_time` an instant).
    pub zone: Option<crate::time_zone::SessionZone>,
}

/// How rows move from one node's subtasks to the next node's.
#[derive(Debug, Clone)]
pub enum Exchange {
    /// Subtask i → subtask i (same parallelism); chained into one task.
    Forward,
    /// By key group of the key expressions.
    Hash(Vec<Arc<dyn PhysicalExpr>>),
    /// Round-robin.
    Rebalance,
    /// Every subtask → the single downstream subtask.
    Global,
}

#[derive(Debug)]
pub struct StreamEdge {
    pub from: NodeId,
    pub to: NodeId,
    pub exchange: Exchange,
    /// Which input of `to` the edge feeds: 0, or 1 for a join's right
    /// side.
    pub input: usize,
}

/// Per-split watermark generation from a table's `WATERMARK` clause.
#[derive(Debug, Clone)]
pub struct WatermarkNode {
    pub column: String,
    /// The expression as written, for EXPLAIN.
    pub sql: String,
    /// Evaluated on each batch of the table's full schema.
    pub expr: Arc<dyn PhysicalExpr>,
    pub idle_timeout: Option<Duration>,
    /// The table's watermark alignment group, if any.
    pub alignment: Option<weir_catalog::AlignmentSpec>,
}

#[derive(Debug)]
pub struct SourceNode {
    pub table: TableDef,
    pub factory: Arc<dyn SourceFactory>,
    /// Maps a batch of the physical schema to the table's full schema
    /// (computed columns evaluated). `None` when there are none.
    pub computed: Option<Vec<Arc<dyn PhysicalExpr>>>,
    pub watermark: Option<WatermarkNode>,
}

#[derive(Debug)]
pub struct CalcNode {
    pub filter: Option<Arc<dyn PhysicalExpr>>,
    pub projection: Option<Vec<Arc<dyn PhysicalExpr>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WindowKind {
    Tumble,
    Hop,
    Cumulate,
    /// Sessions per key: a row opens `[ts, ts + gap)` (`size` = the gap),
    /// merged with every session of its key it intersects.
    Session,
}

/// A window assigner's parameters, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowSpec {
    pub kind: WindowKind,
    pub size: i64,
    /// HOP: slide; CUMULATE: step; TUMBLE: equal to size.
    pub slide: i64,
    pub offset: i64,
}

impl std::fmt::Display for WindowSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |v: i64| {
            if v % 1000 == 0 {
                format!("{} s", v / 1000)
            } else {
                format!("{v} ms")
            }
        };
        match self.kind {
            WindowKind::Tumble => write!(f, "TUMBLE(size {})", ms(self.size))?,
            WindowKind::Hop => write!(f, "HOP(size {}, slide {})", ms(self.size), ms(self.slide))?,
            WindowKind::Cumulate => write!(f, "CUMULATE(size {}, step {})", ms(self.size), ms(self.slide))?,
            WindowKind::Session => write!(f, "SESSION(gap {})", ms(self.size))?,
        }
        if self.offset != 0 {
            write!(f, " offset {}", ms(self.offset))?;
        }
        Ok(())
    }
}

/// One output column of a window aggregate, before the aggregate values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOutput {
    WindowStart,
    WindowEnd,
    WindowTime,
    /// The i-th grouping key.
    Key(usize),
}

#[derive(Debug)]
pub struct WindowAggregateNode {
    pub window: WindowSpec,
    /// Input column holding a timestamp inside the row's window(s).
    pub time_column: usize,
    /// Windows on processing time (the column is a `PROCTIME()`
    /// attribute): a row belongs to the windows of the operator's clock
    /// when it arrives, and windows fire when the clock passes their end.
    pub proctime: bool,
    /// The input is a window aggregate's rows: `time_column` holds each
    /// row's `window_end`, and the row belongs to that one window (Flink's
    /// window aggregate over another's window properties).
    pub attached: bool,
    pub keys: Vec<Arc<dyn PhysicalExpr>>,
    pub group_outputs: Vec<GroupOutput>,
    pub aggregates: Vec<Arc<AggregateFunctionExpr>>,
    /// Windows on a TIMESTAMP_LTZ in a session zone: the time column holds
    /// wall times (the zoned window marker's), watermarks are compared on
    /// the wall clock and `window_time` is an instant again.
    pub zone: Option<crate::time_zone::SessionZone>,
}

/// An aggregate function of a non-windowed GROUP BY. Weir's own
/// accumulators (they retract exactly, which DataFusion's grouped
/// accumulators cannot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggFunc {
    Count,
    Sum,
    /// Flink's AVG: `SUM / COUNT` in the input's type for integers.
    Avg,
    Min,
    Max,
    /// Flink's variance family: Welford's running mean and squared
    /// deviations in DOUBLE (Flink's digits), the result cast back to the
    /// input's type.
    VarPop,
    VarSamp,
    StddevPop,
    StddevSamp,
    /// The first non-NULL value (insert-only input).
    FirstValue,
    /// The last non-NULL value (insert-only input).
    LastValue,
    /// The non-NULL values joined by [`AggCall::separator`] in arrival
    /// order (insert-only input).
    ListAgg,
    /// The values (NULLs too, unless [`AggCall::ignore_nulls`]) as an
    /// ARRAY in arrival order (insert-only input).
    ArrayAgg,
    /// The non-NULL values as a MULTISET (element → count,
    /// [`crate::multiset`]); a retraction takes one occurrence back.
    Collect,
}

impl AggFunc {
    pub fn name(self) -> &'static str {
        match self {
            AggFunc::Count => "COUNT",
            AggFunc::Sum => "SUM",
            AggFunc::Avg => "AVG",
            AggFunc::Min => "MIN",
            AggFunc::Max => "MAX",
            AggFunc::VarPop => "VAR_POP",
            AggFunc::VarSamp => "VAR_SAMP",
            AggFunc::StddevPop => "STDDEV_POP",
            AggFunc::StddevSamp => "STDDEV_SAMP",
            AggFunc::FirstValue => "FIRST_VALUE",
            AggFunc::LastValue => "LAST_VALUE",
            AggFunc::ListAgg => "LISTAGG",
            AggFunc::ArrayAgg => "ARRAY_AGG",
            AggFunc::Collect => "COLLECT",
        }
    }

    /// Whether the call keeps values of its input (FIRST_VALUE,
    /// LAST_VALUE, LISTAGG, ARRAY_AGG): over an updating input, every
    /// value present, so that a retraction can take one back.
    pub fn keeps_a_value(self) -> bool {
        matches!(
            self,
            AggFunc::FirstValue | AggFunc::LastValue | AggFunc::ListAgg | AggFunc::ArrayAgg | AggFunc::Collect
        )
    }

    /// Whether this is one of the variance family.
    pub fn is_moment(self) -> bool {
        matches!(
            self,
            AggFunc::VarPop | AggFunc::VarSamp | AggFunc::StddevPop | AggFunc::StddevSamp
        )
    }

    /// The variance family's result (`None`: NULL): `m2 / n` (POP) or
    /// `m2 / (n - 1)` (SAMP, NULL for one value), the standard deviations
    /// their square roots.
    pub fn moment(self, w: &Welford) -> Option<f64> {
        if w.n <= 0 {
            return None;
        }
        let var = match self {
            AggFunc::VarPop | AggFunc::StddevPop => w.m2 / w.n as f64,
            _ if w.n == 1 => return None,
            _ => w.m2 / (w.n - 1) as f64,
        };
        Some(match self {
            AggFunc::StddevPop | AggFunc::StddevSamp => var.sqrt(),
            _ => var,
        })
    }
}

/// Welford's running count, mean and sum of squared deviations: what the
/// variance family keeps (as Flink and DataFusion do; the textbook
/// `Σx² - (Σx)²/n` loses the last digits Flink writes).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Welford {
    pub n: i64,
    pub mean: f64,
    pub m2: f64,
}

impl Welford {
    pub fn add(&mut self, v: f64) {
        self.n += 1;
        let delta = v - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (v - self.mean);
    }

    /// Takes `v` back (a retraction).
    pub fn retract(&mut self, v: f64) {
        if self.n <= 1 {
            *self = Welford::default();
            return;
        }
        let n = self.n - 1;
        let delta1 = self.mean - v;
        let mean = delta1 / n as f64 + self.mean;
        let delta2 = mean - v;
        self.m2 -= delta1 * delta2;
        self.mean = mean;
        self.n = n;
    }

    /// Adds another partial result (Chan's parallel form).
    pub fn merge(&mut self, o: &Welford) {
        if o.n == 0 {
            return;
        }
        let n = self.n + o.n;
        let (a, b) = (self.n as f64, o.n as f64);
        let delta = self.mean - o.mean;
        self.mean = self.mean * a / n as f64 + o.mean * b / n as f64;
        self.m2 += o.m2 + delta * delta * a * b / n as f64;
        self.n = n;
    }
}

/// A variance-family result (computed in DOUBLE) in Flink's result type:
/// the input's integer type by Java's saturating cast, FLOAT, or
/// `DECIMAL(38, 6)` rounded half up; `None` is NULL.
pub fn moment_scalar(
    v: Option<f64>,
    out: &arrow::datatypes::DataType,
) -> datafusion::common::Result<datafusion::common::ScalarValue> {
    use arrow::datatypes::DataType as D;
    use datafusion::common::ScalarValue as S;
    let Some(v) = v else {
        return S::try_from(out);
    };
    Ok(match out {
        D::Int8 => S::Int8(Some(v as i8)),
        D::Int16 => S::Int16(Some(v as i16)),
        D::Int32 => S::Int32(Some(v as i32)),
        D::Int64 => S::Int64(Some(v as i64)),
        D::Float32 => S::Float32(Some(v as f32)),
        D::Decimal128(p, s) => S::Decimal128(Some((v * 10f64.powi(i32::from(*s))).round() as i128), *p, *s),
        _ => S::Float64(Some(v)),
    })
}

/// One aggregate call: `func([DISTINCT] arg) [FILTER (WHERE filter)]`.
#[derive(Debug, Clone)]
pub struct AggCall {
    pub func: AggFunc,
    /// `None`: `COUNT(*)`.
    pub arg: Option<Arc<dyn PhysicalExpr>>,
    pub distinct: bool,
    pub filter: Option<Arc<dyn PhysicalExpr>>,
    /// The type of `arg` (Null for `COUNT(*)`).
    pub input_type: arrow::datatypes::DataType,
    /// The planned result type.
    pub output_type: arrow::datatypes::DataType,
    /// LISTAGG's separator (`,` by default).
    pub separator: Option<String>,
    /// ARRAY_AGG(x IGNORE NULLS): NULLs are left out (Flink's default is
    /// RESPECT NULLS).
    pub ignore_nulls: bool,
}

impl std::fmt::Display for AggCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let arg = self.arg.as_ref().map_or("*".to_string(), |a| a.to_string());
        let distinct = if self.distinct { "DISTINCT " } else { "" };
        write!(f, "{}({distinct}{arg})", self.func.name())?;
        if let Some(w) = &self.filter {
            write!(f, " FILTER (WHERE {w})")?;
        }
        Ok(())
    }
}

/// `GROUP BY keys` without a window (or a global aggregate, no keys): an
/// updating result, one live row per key.
#[derive(Debug)]
pub struct GroupAggregateNode {
    pub keys: Vec<Arc<dyn PhysicalExpr>>,
    pub aggregates: Vec<AggCall>,
    /// A `STATE_TTL` hint naming its input: instead of `table.exec.state.ttl`.
    pub state_ttl: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinType {
    Inner,
    Left,
    Right,
    Full,
    /// `WHERE EXISTS` / `IN (subquery)`: left rows with a match.
    LeftSemi,
    /// `WHERE NOT EXISTS`: left rows without a match.
    LeftAnti,
}

impl JoinType {
    /// Semi (`Some(false)`) or anti (`Some(true)`) join: the output is the
    /// left rows alone.
    pub fn semi_anti(self) -> Option<bool> {
        match self {
            JoinType::LeftSemi => Some(false),
            JoinType::LeftAnti => Some(true),
            _ => None,
        }
    }

    /// Whether the left side's rows are kept without a match (padded).
    pub fn keeps_left(self) -> bool {
        matches!(self, JoinType::Left | JoinType::Full)
    }

    pub fn keeps_right(self) -> bool {
        matches!(self, JoinType::Right | JoinType::Full)
    }

    pub fn sql(self) -> &'static str {
        match self {
            JoinType::Inner => "INNER",
            JoinType::Left => "LEFT",
            JoinType::Right => "RIGHT",
            JoinType::Full => "FULL OUTER",
            JoinType::LeftSemi => "LEFT SEMI",
            JoinType::LeftAnti => "LEFT ANTI",
        }
    }
}

/// A regular (non-windowed) equi-join of input 0 (left) and input 1
/// (right): both sides kept in state, every change matched against the
/// other side's rows.
#[derive(Debug)]
pub struct JoinNode {
    pub join_type: JoinType,
    /// Equality keys, evaluated on each side's rows.
    pub left_keys: Vec<Arc<dyn PhysicalExpr>>,
    pub right_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The rest of the ON condition, over `left ++ right` columns.
    pub filter: Option<Arc<dyn PhysicalExpr>>,
    pub left_schema: SchemaRef,
    pub right_schema: SchemaRef,
    /// Per side, a `STATE_TTL` hint naming it: instead of
    /// `table.exec.state.ttl` for that side's rows.
    pub state_ttl: [Option<std::time::Duration>; 2],
    /// Per side, the input's upsert key (its column indexes) when it has
    /// one: that side's rows are stored by it (Flink's `HasUniqueKey`
    /// state view), not as a multiset of whole rows.
    pub unique_keys: [Option<Vec<usize>>; 2],
    /// Time bounds between the sides' event-time columns: an interval
    /// join (insert-only, state freed as the watermark passes).
    pub interval: Option<IntervalBounds>,
    /// A window join: the sides join on equal `window_start` and
    /// `window_end` (of a window TVF or a window aggregate on each side);
    /// per side, the input column holding `window_end`. Each window's
    /// rows are joined once, when the watermark passes its end.
    pub window: Option<[usize; 2]>,
    /// An event-time temporal join (`FOR SYSTEM_TIME AS OF`): the left
    /// row's time column and the right (versioned) side's version time
    /// column. Each left row joins the version of its key valid at its
    /// time, once the watermark passes it.
    pub temporal: Option<[usize; 2]>,
    /// A window join of windows on a TIMESTAMP_LTZ's wall clock in a
    /// session zone: watermarks are compared with window ends on that
    /// wall clock (as [`WindowAggregateNode::zone`]).
    pub zone: Option<crate::time_zone::SessionZone>,
}

/// `right.time + lower <= left.time <= right.time + upper` (ms, inclusive)
/// between the sides' event-time columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalBounds {
    pub left_time: usize,
    pub right_time: usize,
    pub lower: i64,
    pub upper: i64,
    /// The time columns are processing-time attributes: a row's time is
    /// the operator's clock when it arrives, and rows expire by the clock
    /// (Flink's `ProcTimeIntervalJoin`).
    pub proctime: bool,
}

impl JoinNode {
    /// Whether side `side`'s join key holds its upsert key (Flink's
    /// `JoinKeyContainsUniqueKey`: one row per join key).
    pub fn join_key_holds_unique_key(&self, side: usize) -> bool {
        let keys = if side == 0 { &self.left_keys } else { &self.right_keys };
        self.unique_keys[side].as_ref().is_some_and(|columns| {
            columns.iter().all(|c| {
                keys.iter().any(|k| {
                    k.downcast_ref::<datafusion::physical_expr::expressions::Column>()
                        .is_some_and(|k| k.index() == *c)
                })
            })
        })
    }

    /// How side `side`'s rows are stored, for EXPLAIN.
    pub fn state_layout(&self, side: usize) -> String {
        let schema = if side == 0 {
            &self.left_schema
        } else {
            &self.right_schema
        };
        let Some(columns) = &self.unique_keys[side] else {
            return "key group|join key|row → (count, matches of an outer side)".into();
        };
        let names: Vec<&str> = columns
            .iter()
            .filter_map(|&c| schema.fields().get(c).map(|f| f.name().as_str()))
            .collect();
        if self.join_key_holds_unique_key(side) {
            format!(
                "key group|join key (holds the upsert key [{}]) → (matches of an outer side, row)",
                names.join(", ")
            )
        } else {
            format!(
                "key group|join key|upsert key [{}] → (matches of an outer side, row)",
                names.join(", ")
            )
        }
    }
}

/// One key of an ORDER BY.
#[derive(Debug, Clone)]
pub struct SortKey {
    pub expr: Arc<dyn PhysicalExpr>,
    pub asc: bool,
    pub nulls_first: bool,
}

/// As EXPLAIN shows a key: `expr ASC|DESC NULLS FIRST|LAST`.
impl std::fmt::Display for SortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} NULLS {}",
            self.expr,
            if self.asc { "ASC" } else { "DESC" },
            if self.nulls_first { "FIRST" } else { "LAST" }
        )
    }
}

/// ORDER BY keys in uid text ([`crate::canonical::sort_key`] of each).
pub fn canonical_order(keys: &[SortKey]) -> String {
    keys.iter()
        .map(|k| crate::canonical::sort_key(&k.expr, k.asc, k.nulls_first))
        .collect::<Vec<_>>()
        .join(",")
}

/// What a rank node keeps per partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankStrategy {
    /// Top-N: `ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..) <= N`.
    TopN,
    /// Deduplication keeping the row with the latest event time
    /// (`ORDER BY rowtime DESC`, `= 1`, no rank column): a later row with
    /// an equal or greater time replaces it.
    KeepLastRowtime,
    /// Deduplication keeping the row with the earliest event time
    /// (`ORDER BY rowtime ASC`, `= 1`, no rank column), emitted once the
    /// watermark passes it: insert-only.
    KeepFirstRowtime,
    /// Deduplication on processing time (`ORDER BY` a `PROCTIME()`
    /// column `DESC`): every row replaces the key's row, at once.
    KeepLastProctime,
    /// Deduplication on processing time, `ASC`: a key's first row is
    /// emitted at once and later rows are dropped: insert-only.
    KeepFirstProctime,
    /// Window Top-N and window deduplication: the partition holds a
    /// window's `window_start` and `window_end` (of a window TVF or a
    /// window aggregate) and the input is insert-only; a window's top N are
    /// emitted when the watermark passes its end, insert-only. `end`: the
    /// input column of `window_end`; `later_ties_first`: window
    /// deduplication keeping the last row (`ORDER BY rowtime DESC`, `= 1`,
    /// no rank column), where a later row of equal time wins.
    Window { end: usize, later_ties_first: bool },
}

/// Top-N and deduplication over `ROW_NUMBER()`.
#[derive(Debug)]
pub struct RankNode {
    pub strategy: RankStrategy,
    /// A window Top-N of windows on a TIMESTAMP_LTZ's wall clock in a
    /// session zone: watermarks are compared with window ends on that
    /// wall clock (as [`WindowAggregateNode::zone`]).
    pub zone: Option<crate::time_zone::SessionZone>,
    pub partition: Vec<Arc<dyn PhysicalExpr>>,
    pub order: Vec<SortKey>,
    /// The rank end N (ranks 1..=N are kept).
    pub limit: usize,
    /// Whether the rank column is used downstream: then a row's rank
    /// shifting is an update (`-U`/`+U`); without it only rows entering
    /// and leaving the top N are changes.
    pub with_rank: bool,
    /// Flink's UpdateFast strategy: the input's upsert key (it holds the
    /// partition key), given when every sort field can only move a row
    /// up (a COUNT or MAX sorted DESC, a MIN ASC, a group key, over an
    /// aggregate of insert-only input). A `+U` then replaces its key's
    /// row in place, so a row that stays in the top N is one `-U`/`+U`
    /// (the retract strategy would show it leave and come back).
    pub update_key: Option<Vec<usize>>,
}

#[derive(Debug)]
pub struct LimitNode {
    pub skip: usize,
    pub fetch: usize,
}

/// `ORDER BY rowtime [, ...]` on a stream: rows emitted in time order as
/// the watermark passes them.
#[derive(Debug, Clone)]
pub struct TemporalSortNode {
    /// The input's rowtime column (the first ORDER BY key, ascending).
    pub time_column: usize,
    /// The other ORDER BY keys, for rows of one time.
    pub order: Vec<SortKey>,
}

/// An upsert sink's materializer (`ON CONFLICT DO DEDUPLICATE`, Flink's
/// `SinkUpsertMaterializer`): the live rows of each sink key, the latest
/// one written.
#[derive(Debug)]
pub struct UpsertMaterializeNode {
    /// The sink's PRIMARY KEY columns (input columns; its partitioning).
    pub key: Vec<Arc<dyn PhysicalExpr>>,
    /// The input's upsert key; `None`: rows are compared whole.
    pub upsert_key: Option<Vec<usize>>,
}

/// The changelog normalizer behind an upsert source (Flink's
/// `ChangelogNormalize`): each key's last row, so upserts and key-only
/// deletes become a full changelog.
#[derive(Debug)]
pub struct ChangelogNormalizeNode {
    /// The source's PRIMARY KEY columns (its partitioning).
    pub key: Vec<Arc<dyn PhysicalExpr>>,
}

#[derive(Debug)]
pub struct SinkNode {
    pub name: String,
    pub factory: Arc<dyn SinkFactory>,
}

impl StreamGraph {
    /// The node with uid `uid`.
    pub fn by_uid(&self, uid: &str) -> Option<&StreamNode> {
        self.nodes.iter().find(|n| n.uid == uid)
    }

    pub fn node(&self, id: NodeId) -> &StreamNode {
        &self.nodes[id]
    }

    pub fn inputs(&self, id: NodeId) -> impl Iterator<Item = &StreamEdge> {
        self.edges.iter().filter(move |e| e.to == id)
    }

    pub fn outputs(&self, id: NodeId) -> impl Iterator<Item = &StreamEdge> {
        self.edges.iter().filter(move |e| e.from == id)
    }

    /// True when every source is bounded: the job ends by itself.
    pub fn is_bounded(&self) -> bool {
        self.nodes.iter().all(|n| match &n.kind {
            NodeKind::Source(s) => s.factory.is_bounded(),
            _ => true,
        })
    }

    /// Whether `edge` joins its ends into one task (same parallelism,
    /// forward, and the downstream node has no other input).
    pub fn is_chained(&self, edge: &StreamEdge) -> bool {
        matches!(edge.exchange, Exchange::Forward)
            && self.nodes[edge.from].parallelism == self.nodes[edge.to].parallelism
            && self.inputs(edge.to).count() == 1
            && self.outputs(edge.from).count() == 1
    }

    /// Identifies the plan: its operators' uids (which cover their
    /// meaning and inputs), never parallelism or a library's text. Shown
    /// and stored; state is matched to operators by uid, not by this.
    pub fn fingerprint(&self) -> String {
        let uids: Vec<&str> = self.nodes.iter().map(|n| n.uid.as_str()).collect();
        crate::checkpoint::metadata::checksum(uids.join("\n").as_bytes())
    }

    /// `EXPLAIN` text: operators, parallelism, exchanges, state, watermarks.
    pub fn explain(&self, config: &JobConfig) -> String {
        let mut s = String::new();
        let backend = match config.state_backend {
            StateBackendKind::RocksDb => "rocksdb",
            StateBackendKind::Heap => "hashmap",
        };
        let _ = writeln!(
            s,
            "Job '{}': max-parallelism {}, state backend {}",
            config.name, config.max_parallelism, backend
        );
        for node in &self.nodes {
            let chained = if self.inputs(node.id).any(|e| self.is_chained(e)) {
                " (chained)"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "[{}] {}  parallelism={}{}",
                node.id,
                node.describe(),
                node.parallelism,
                chained
            );
            if let NodeKind::Source(src) = &node.kind {
                if let Some(text) = src.factory.explain() {
                    for line in text.lines() {
                        let _ = writeln!(s, "      {line}");
                    }
                } else if let Some(w) = &src.watermark {
                    let idle = w
                        .idle_timeout
                        .map(|d| format!(", idle after {} ms", d.as_millis()))
                        .unwrap_or_default();
                    let _ = writeln!(
                        s,
                        "      watermark: {} AS {} per split; reader = min over active splits{}",
                        w.column, w.sql, idle
                    );
                    if let Some(a) = &w.alignment {
                        let _ = writeln!(
                            s,
                            "      alignment group '{}': max drift {} ms, update interval {} ms, buffer {} samples",
                            a.group, a.max_drift_ms, a.update_interval_ms, config.alignment_buffer_size
                        );
                    }
                } else {
                    let _ = writeln!(s, "      watermark: none (no WATERMARK clause)");
                }
            }
            if let Some(state) = node.kind.spec().explain_state() {
                let _ = writeln!(s, "      state: {backend}, {state}");
            }
            {
                let key = match &node.changelog.upsert_key {
                    Some(k) => format!(
                        ", upsertKey=[{}]",
                        k.iter()
                            .map(|i| node.schema.field(*i).name().as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None => String::new(),
                };
                let _ = writeln!(s, "      changelogMode={}{key}", node.changelog.kinds());
            }
            for e in self.outputs(node.id) {
                let how = match &e.exchange {
                    Exchange::Forward => "forward".to_string(),
                    Exchange::Hash(k) => format!(
                        "hash [{}] by key group",
                        k.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                    Exchange::Rebalance => "rebalance".to_string(),
                    Exchange::Global => "global (to one subtask)".to_string(),
                };
                let _ = writeln!(s, "      -> [{}] {}", e.to, how);
            }
        }
        s
    }
}

impl StreamNode {
    pub fn describe(&self) -> String {
        self.kind.spec().describe()
    }
}

impl PlanNode for SourceNode {
    fn describe(&self) -> String {
        format!(
            "Source: {} (connector '{}'{})",
            self.table.name,
            self.factory.name(),
            if self.factory.is_bounded() {
                ", bounded"
            } else {
                ", unbounded"
            }
        )
    }

    fn changelog(&self, _: &ChangelogMode) -> ChangelogMode {
        if self.factory.is_upsert() {
            // Upserts by the key: no `-U`, deletes maybe of the key only
            // (normalized right behind).
            ChangelogMode {
                updates: true,
                deletes: true,
                upsert_key: None,
                no_update_before: true,
            }
        } else if self.factory.produces_changes() {
            // A changelog format reads updates and deletes.
            ChangelogMode {
                updates: true,
                deletes: true,
                upsert_key: None,
                no_update_before: false,
            }
        } else {
            ChangelogMode::insert_only()
        }
    }

    fn uid_body(&self, n: &StreamNode) -> (&'static str, String) {
        (
            "source",
            format!("table={};connector={}", self.table.name, self.factory.name()) + &source_extras(self, n),
        )
    }
}

/// What a source adds to its table and connector, each only where it
/// departs from the plain case (so the uids of plain reads stay): the
/// columns it reads when not all of them (projection pushdown), its
/// computed columns, and its changelog when not insert-only (a format
/// such as `debezium-json` changes how downstream state is kept).
fn source_extras(s: &SourceNode, n: &StreamNode) -> String {
    let mut out = String::new();
    let all: Vec<&str> = s.table.columns.iter().map(|c| c.name.as_str()).collect();
    let read: Vec<&str> = n.schema.fields().iter().map(|f| f.name().as_str()).collect();
    if read != all {
        out.push_str(&format!(";columns={}", read.join(",")));
    }
    if let Some(c) = &s.computed {
        out.push_str(&format!(";computed={}", canonical_exprs(c)));
    }
    if !n.changelog.is_insert_only() {
        out.push_str(&format!(
            ";changelog={}{}{}",
            if n.changelog.updates { "U" } else { "" },
            if n.changelog.deletes { "D" } else { "" },
            if n.changelog.no_update_before {
                "-no-update-before"
            } else {
                ""
            }
        ));
    }
    out
}

impl PlanNode for SinkNode {
    fn describe(&self) -> String {
        format!("Sink: {} (connector '{}')", self.name, self.factory.name())
    }

    fn uid_body(&self, _: &StreamNode) -> (&'static str, String) {
        ("sink", format!("table={};connector={}", self.name, self.factory.name()))
    }
}

/// A TTL as EXPLAIN shows it, in the largest unit that divides it:
/// `1 d`, `12 h`, `90 s`, `1500 ms`.
pub fn humantime_ms(t: std::time::Duration) -> String {
    let ms = t.as_millis();
    for (unit, name) in [(86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1000, "s")] {
        if ms >= unit && ms.is_multiple_of(unit) {
            return format!("{} {name}", ms / unit);
        }
    }
    format!("{ms} ms")
}

#[cfg(test)]
mod welford_tests {
    use super::*;

    #[test]
    fn moments_retract_and_merge_to_what_adding_gives() {
        let xs = [2.5, -0.5, 8.5e37, 0.1];
        let mut all = Welford::default();
        xs.iter().for_each(|x| all.add(*x));
        // Flink's digits (recorded): VAR_POP and VAR_SAMP of the four.
        assert_eq!(AggFunc::VarPop.moment(&all), Some(1.3546874999999997e75));
        assert_eq!(AggFunc::VarSamp.moment(&all), Some(1.8062499999999996e75));
        assert_eq!(AggFunc::StddevSamp.moment(&all), Some(4.2499999999999995e37));

        let mut two = Welford::default();
        [1.0, 3.0, 10.0].iter().for_each(|x| two.add(*x));
        two.retract(10.0);
        assert_eq!(two.n, 2);
        assert!(
            (two.mean - 2.0).abs() < 1e-12 && (two.m2 - 2.0).abs() < 1e-12,
            "{two:?}"
        );
        two.retract(1.0);
        two.retract(3.0);
        assert_eq!(two, Welford::default(), "all taken back");
        assert_eq!(AggFunc::VarSamp.moment(&two), None);

        let (mut a, mut b) = (Welford::default(), Welford::default());
        [1.0, 2.0].iter().for_each(|x| a.add(*x));
        [3.0, 4.0, 5.0].iter().for_each(|x| b.add(*x));
        a.merge(&b);
        assert_eq!(a.n, 5);
        assert!((AggFunc::VarPop.moment(&a).unwrap_or(0.0) - 2.0).abs() < 1e-12);
        let mut one = Welford::default();
        one.add(7.0);
        assert_eq!(AggFunc::VarSamp.moment(&one), None, "SAMP of one value is NULL");
        assert_eq!(AggFunc::VarPop.moment(&one), Some(0.0));
    }
}
