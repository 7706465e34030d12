//! Shapes the planner recognises in DataFusion's logical plan: pure
//! functions over `LogicalPlan` (window markers, Top-N, time attributes,
//! join bounds).

pub(crate) mod time;
pub(crate) mod top_n;
pub(crate) mod window;

#[cfg(test)]
mod tests {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::LogicalPlan;
    use weir_catalog::Catalog;
    use weir_catalog::store::Entry;

    use super::time::{interval_bounds, is_proctime, is_rowtime};
    use super::top_n::top_n_of;
    use super::window::window_join_ends;
    use crate::Planner;
    use crate::parser::Statement;

    const DDL: &str = "
      CREATE TABLE l (k INT, v BIGINT, ts TIMESTAMP(3), pt AS PROCTIME(), WATERMARK FOR ts AS ts)
        WITH ('connector' = 'datagen');
      CREATE TABLE r (k INT, w BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts)
        WITH ('connector' = 'datagen');";

    /// The logical plan the planner's patterns see for `sql`.
    fn logical(sql: &str) -> (LogicalPlan, Catalog) {
        let planner = Planner::new();
        let mut catalog = Catalog::in_memory();
        for stmt in crate::parse(DDL).expect("ddl") {
            let Statement::CreateTable(ct) = &stmt.statement else {
                panic!("a CREATE TABLE")
            };
            let def = crate::ddl::create_table(ct, &planner).expect("table");
            catalog.create(Entry::Table(def), false).expect("create");
        }
        let stmt = crate::parse(sql).expect("parses").remove(0);
        let Statement::Query(q) = &stmt.statement else {
            panic!("a query")
        };
        let logical = planner.logical_plan(q, &catalog).expect("plans");
        (logical, catalog)
    }

    /// What `pick` answers for the first node (top down) it answers for.
    fn find<T>(plan: &LogicalPlan, pick: impl Fn(&LogicalPlan) -> Option<T>) -> T {
        let mut found = None;
        let _ = plan.apply(|p| {
            found = pick(p);
            Ok(if found.is_some() {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        });
        found.expect("the pattern's node")
    }

    /// A Top-N filter's N and the number of its other conjuncts.
    fn top_n(sql: &str) -> (Result<usize, String>, usize) {
        let (plan, _) = logical(sql);
        find(&plan, |p| match p {
            LogicalPlan::Filter(f) => top_n_of(f).map(|t| (t.limit.map_err(|e| e.to_string()), t.rest.len())),
            _ => None,
        })
    }

    #[test]
    fn top_n_bounds_read_as_flink_reads_them() {
        let q = |cond: &str| {
            format!(
                "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC) AS rn FROM l) WHERE {cond}"
            )
        };
        assert_eq!(top_n(&q("rn <= 3")), (Ok(3), 0));
        assert_eq!(top_n(&q("rn < 3")), (Ok(2), 0));
        assert_eq!(top_n(&q("rn = 1 AND v > 0")), (Ok(1), 1));
        let (plan, _) = logical(&q("v > 0"));
        assert!(
            find(&plan, |p| match p {
                LogicalPlan::Filter(f) => Some(top_n_of(f).is_none()),
                _ => None,
            }),
            "a filter on another column is no Top-N"
        );
    }

    #[test]
    fn interval_bounds_are_the_left_time_minus_the_right_time() {
        let (plan, catalog) = logical(
            "SELECT l.v, r.w FROM l JOIN r ON l.k = r.k
               AND l.ts BETWEEN r.ts - INTERVAL '1' MINUTE AND r.ts + INTERVAL '5' SECOND AND l.v > r.w",
        );
        let (bounds, rest) = find(&plan, |p| match p {
            LogicalPlan::Join(j) => interval_bounds(j, &catalog),
            _ => None,
        });
        assert_eq!((bounds.lower, bounds.upper, bounds.proctime), (-60_000, 5_000, false));
        assert_eq!((bounds.left_time, bounds.right_time), (2, 2), "each side's ts");
        assert!(rest.is_some(), "the non-time conjunct stays the join's condition");
        // One bound only: no interval join (a regular join, as in Flink).
        let (plan, catalog) = logical("SELECT l.v, r.w FROM l JOIN r ON l.k = r.k AND l.ts >= r.ts");
        assert!(find(&plan, |p| match p {
            LogicalPlan::Join(j) => Some(interval_bounds(j, &catalog).is_none()),
            _ => None,
        }));
    }

    #[test]
    fn time_attributes_pass_through_projections_unchanged_only() {
        let (plan, catalog) = logical("SELECT ts AS t, v, ts + INTERVAL '1' SECOND AS later, pt FROM l");
        let top = &plan;
        assert!(is_rowtime(top, 0, &catalog), "renamed, still the rowtime");
        assert!(!is_rowtime(top, 1, &catalog));
        assert!(!is_rowtime(top, 2, &catalog), "computed from it, a plain timestamp");
        assert!(is_proctime(top, 3, &catalog));
        assert!(!is_proctime(top, 0, &catalog));
    }

    #[test]
    fn a_window_join_is_found_by_both_window_bounds() {
        let windows =
            |t: &str| format!("(SELECT * FROM TABLE(TUMBLE(TABLE {t}, DESCRIPTOR(ts), INTERVAL '1' MINUTE)))");
        let (plan, _) = logical(&format!(
            "SELECT a.v, b.w FROM {} a JOIN {} b
               ON a.k = b.k AND a.window_start = b.window_start AND a.window_end = b.window_end",
            windows("l"),
            windows("r")
        ));
        let ends = find(&plan, |p| match p {
            LogicalPlan::Join(j) => Some(window_join_ends(j)),
            _ => None,
        });
        assert!(ends.is_some(), "start and end equal: a window join");
        let (plan, _) = logical(&format!(
            "SELECT a.v, b.w FROM {} a JOIN {} b ON a.k = b.k AND a.window_end = b.window_end",
            windows("l"),
            windows("r")
        ));
        let ends = find(&plan, |p| match p {
            LogicalPlan::Join(j) => Some(window_join_ends(j)),
            _ => None,
        });
        assert!(ends.is_none(), "the end alone: not a window join");
    }
}
