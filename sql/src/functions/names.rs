//! Every internal function name Weir's rewrites and passes put in a
//! plan: one list, so no two passes can pick one name for two meanings,
//! and a reader of a plan (`EXPLAIN`) finds what each one is. They all
//! start with [`PREFIX`], which no Flink function does.

/// What every internal name starts with.
pub const PREFIX: &str = "__weir_";
/// What the internal JSON functions' names start with.
pub const JSON_PREFIX: &str = "__weir_json_";
/// What the DECIMAL arithmetic functions' names start with (then the
/// operator's name).
pub const DECIMAL_PREFIX: &str = "__weir_decimal_";

/// A `JSON_ARRAYAGG(... NULL ON NULL)` element: its JSON text, `null` for
/// NULL.
pub const ELEMENT_NULLS_FN: &str = "__weir_json_element_nulls";
/// `CAST(x AS VARCHAR(n) | CHAR(n))` of a text (`functions::cast_to_length`
/// writes the call): `(text, n, pad)`.
pub const FIT_TEXT_FN: &str = "__weir_fit_text";
/// The internal function the SHA functions are planned with: a digest's
/// bytes as lower-case hex (Flink's `SHA256(s)` text).
pub const HEX_OF_BYTES: &str = "__weir_hex_of_bytes";
/// `__weir_named(CAST(x AS T), 'CAST(x AS T)')`: the value of its first
/// argument. DataFusion names a cast as its operand, so `AVG(x)` and
/// `AVG(CAST(x AS DOUBLE))` are both `avg(x)` and one aggregate cannot
/// hold both; a query that meets this is planned again with each cast in
/// a call's arguments wrapped in this, which names it as written
/// (`rewrite::name_casts_in_calls`).
pub const NAMED_FN: &str = "__weir_named";
/// In batch mode, the windows of a row of a HOP or CUMULATE window TVF as
/// a list of `{start, end, time}`, which the plan unnests into a row per
/// window (`planner::batch`).
pub const WINDOWS_FN: &str = "__weir_windows";
/// The right side of the `IS [NOT] DISTINCT FROM` that `x IS [NOT] JSON`
/// is parsed as (see `parser::rewrite_is_json_tokens`).
pub const IS_JSON_FN: &str = "__weir_is_json_kind";
/// `JSON_VALUE(j, p ... ON ERROR)` as the parser writes it:
/// `__weir_json_value_on_error(j, p, mode, default)` (see
/// `parser::rewrite_json_value_tokens`).
pub const JSON_VALUE_ON_ERROR_FN: &str = "__weir_json_value_on_error";
/// A member `[KEY] k VALUE v` of `JSON_OBJECT` or `JSON_OBJECTAGG` as the
/// parser's token rewrite writes it, `__weir_json_kv(k, v)`; the planner's
/// rewrite of those calls reads it back (it is never called).
pub const KV_FN: &str = "__weir_json_kv";
/// The parser's name of `MAP[...]`.
pub const MAP_FN: &str = "__weir_map";
/// A `JSON_OBJECTAGG(k VALUE v ABSENT ON NULL)` member: NULL when `v` is.
pub const MEMBER_ABSENT_FN: &str = "__weir_json_objectagg_member_absent";
/// A `JSON_OBJECTAGG(k VALUE v)` member: the text of `[k, v]`, `v` null
/// when NULL. The aggregate is LISTAGG of members, which `json::objectagg`
/// reads back.
pub const MEMBER_FN: &str = "__weir_json_objectagg_member";
/// The object from LISTAGG of members (NULL when there were none).
pub const OBJECTAGG_FN: &str = "__weir_json_objectagg";
/// A table's dynamic options (`t /*+ OPTIONS('k' = 'v') */`), handed
/// from the parser to `hints::dynamic_options` as `t(__weir_options('k',
/// 'v'))`.
pub const OPTIONS_FN: &str = "__weir_options";
/// The SESSION TVF's `PARTITION BY` as the parser hands it to the rewrite.
pub const PARTITION_BY_FN: &str = "__weir_partition_by";
/// `INSERT` of a ROW into a ROW column of other field names: Flink matches
/// fields by position (DataFusion's struct casts match them by name). The
/// planner's `__weir_positional_cast(x, NULL of the target type)`.
pub const POSITIONAL_CAST_FN: &str = "__weir_positional_cast";
/// Marks a JSON constructor's value nested in another constructor's
/// arguments: Flink inserts it as JSON (`JSON_ARRAY(JSON_OBJECT('a'
/// VALUE 1))` is `[{"a":1}]`), where any other string is a JSON string.
pub const RAW_FN: &str = "__weir_json_raw";
/// `FOR SYSTEM_TIME AS OF` as the parser hands it to the rewrite: the
/// argument of the versioned table (`rates(__weir_system_time(o.ts))`).
pub const SYSTEM_TIME_FN: &str = "__weir_system_time";
/// The rewrite's mark of a temporal join, one conjunct of its `ON`:
/// `__weir_temporal_join(left_time, right_rowtime, right_pk...)`. The
/// planner takes it out of the condition; it is true if evaluated.
pub const TEMPORAL_JOIN_FN: &str = "__weir_temporal_join";
/// Name of the UDF the planner puts in place of such casts.
pub const TO_STRING: &str = "__weir_flink_to_string";
/// (from `udf.rs`)
pub const WINDOW_FN: &str = "__weir_window";
/// `CEIL(t TO unit)` on the value's own ticks.
pub const CEIL_TIME: &str = "__weir_ceil_time";
/// `FLOOR(t TO unit)` on the value's own ticks.
pub const FLOOR_TIME: &str = "__weir_floor_time";
/// Wall-clock time in the session zone as an instant, the earlier one in a DST overlap.
pub const INSTANT_OF_LOCAL_TIME: &str = "__weir_instant_of_local_time";
/// Wall-clock time in the session zone as an instant, the later one in a DST overlap.
pub const INSTANT_OF_LOCAL_TIME_LENIENT: &str = "__weir_instant_of_local_time_lenient";
/// `x IS JSON [kind]`.
pub const IS_JSON: &str = "__weir_is_json";
/// A numeric cast that narrows as Java does (wraps), from the cast pass.
pub const JAVA_NARROW: &str = "__weir_java_narrow";
/// `JSON_ARRAY(... NULL ON NULL)`.
pub const JSON_ARRAY_NULLS: &str = "__weir_json_array_nulls";
/// `JSON_OBJECT(... NULL ON NULL)`.
pub const JSON_OBJECT: &str = "__weir_json_object";
/// `JSON_OBJECT(... ABSENT ON NULL)`.
pub const JSON_OBJECT_ABSENT: &str = "__weir_json_object_absent";
/// An instant as wall-clock time in the session zone (the local-zone pass).
pub const LOCAL_TIME: &str = "__weir_local_time";
/// Wall-clock time moved back by the session zone's offset at another instant.
pub const LOCAL_TIME_WITH_OFFSET_OF: &str = "__weir_local_time_with_offset_of";
/// `TIMESTAMPADD(unit, n, t)`.
pub const TIMESTAMPADD: &str = "__weir_timestampadd";
/// `TIMESTAMPDIFF(unit, t1, t2)`.
pub const TIMESTAMPDIFF: &str = "__weir_timestampdiff";
