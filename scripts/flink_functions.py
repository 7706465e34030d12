#!/usr/bin/env python3
"""Records Flink 2.3's answers to the function conformance cases.

Usage: ~/.cache/flink23/bin/python scripts/flink_functions.py

Reads tests/functions/cases.txt (one expression per line, `## family`
headings) and evaluates each, on one local Flink 2.3 mini-cluster, as

    SELECT id, CAST((expr) AS STRING), TYPEOF((expr)) FROM t

over tests/functions/input.json. Writes tests/sql/functions_flink.slt,
which the SQL suite (tests/sql_files.rs) runs on Weir:

- a case Flink answers becomes a `query rowsort` block with Flink's rows
  (`+I[id, value, type]`, the type without ` NOT NULL`);
- a case Flink refuses or fails at run time becomes `statement error`;
- a case marked `;; refused: reason` becomes `statement error
  <FUNCTION>`: Weir must refuse it naming the function, never answer
  differently. Flink's answer is kept in a comment;
- a case marked `;; type: reason` (Weir's type differs, the values are
  the same) becomes a `query rowsort` block of `+I[id, value]`: the
  values are compared, the type is not;
- a case marked `;; known: reason` (a difference Weir cannot refuse, such
  as the last digit of a sine) is written as a comment only; docs/sql.md
  lists it.

With `--new`, only the cases without a block in the current
functions_flink.slt run on Flink; the others keep their recorded block
(a long run of every case has seen the local mini-cluster fail its last
few dozen jobs with no cause given).

Prints how many cases Flink answered and how many Weir refuses.
"""
import json, os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = os.path.join(ROOT, "tests", "functions", "cases.txt")
INPUT = os.path.join(ROOT, "tests", "functions", "input.json")
OUT = os.path.join(ROOT, "tests", "sql", "functions_flink.slt")

TABLE = """CREATE TABLE t (id INT, s STRING, s2 STRING, i INT, b BIGINT, d DOUBLE, m DECIMAL(10, 2),
  ts TIMESTAMP(3), dt DATE, flag BOOLEAN, j STRING)
WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json')"""


def query(expr, typed=True):
    if not typed:
        return f"SELECT id, CAST(({expr}) AS STRING) AS v FROM t"
    return (f"SELECT id, CAST(({expr}) AS STRING) AS v, "
            f"REGEXP_REPLACE(TYPEOF(({expr})), ' NOT NULL$', '') AS ty FROM t")


def read_cases():
    cases, family = [], ""
    for line in open(CASES, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("## "):
            family = line[3:].strip()
        if not line.strip() or line.startswith("#"):
            continue
        expr, _, mark = line.partition(";;")
        mark = mark.strip()
        kind, _, reason = mark.partition(":")
        if mark and kind not in ("refused", "known", "type"):
            sys.exit(f"{CASES}: a mark is `;; refused: reason`, `;; type: reason` or `;; known: reason`: {line}")
        cases.append((family, expr.strip(), (kind, reason.strip()) if mark else None))
    return cases


def function_name(expr):
    """The first function called in `expr` (what a refusal must name)."""
    m = re.search(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(", expr)
    if m and m.group(1).upper() not in ("CAST", "TRY_CAST"):
        return m.group(1).upper()
    if "IS JSON" in expr.upper():
        return "JSON"
    m = re.search(r"\b(ARRAY|MAP)\b", expr)
    return m.group(1) if m else ""


def main():
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment
    c = Configuration()
    c.set_string("parallelism.default", "1")
    env = TableEnvironment.create(
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(c).build())
    env.execute_sql(TABLE.format(path=INPUT))

    # `--new`: each recorded block by its heading (`# family: expr`).
    kept = {}
    if "--new" in sys.argv[1:] and os.path.exists(OUT):
        for block in open(OUT, encoding="utf-8").read().split("\n\n"):
            first = block.split("\n", 1)[0]
            if first.startswith("# ") and ": " in first:
                kept[first] = block.strip("\n")
    out = [
        "# Flink 2.3's answers to tests/functions/cases.txt, recorded by",
        "# scripts/flink_functions.py: do not edit, regenerate. Each case runs",
        "#   SELECT id, CAST((expr) AS STRING), TYPEOF((expr)) FROM t",
        "# (TYPEOF without NOT NULL). Known differences are refused by name.",
        "# recorded: flink-2.3 (every query's rows; EXPLAIN, SHOW and DESCRIBE are Weir's)",
        "",
        "statement ok",
        TABLE.format(path="${DATA}/../functions/input.json"),
        "",
    ]
    answered = refused = known = typed = 0
    for family, expr, mark in read_cases():
        sql = query(expr)
        heading = f"# {family}: {expr}"
        if heading in kept:
            block = kept[heading]
            out.append(block)
            out.append("")
            answered += "+I[" in block
            refused += mark is not None and mark[0] == "refused"
            known += mark is not None and mark[0] == "known"
            typed += mark is not None and mark[0] == "type"
            continue
        try:
            with env.execute_sql(sql).collect() as results:
                rows, values = [], []
                for r in results:
                    v = "null" if r[1] is None else r[1]
                    rows.append(f"+I[{r[0]}, {v}, {r[2]}]")
                    values.append(f"+I[{r[0]}, {v}]")
            rows.sort()
            values.sort()
            flink = None
        except Exception as e:  # Flink refused the query or failed running it
            # py4j's text holds the Java trace: its innermost cause says why.
            msg = [l.strip() for l in str(e).strip().splitlines()]
            causes = [l for l in msg if l.startswith("Caused by:")]
            named = [l for l in msg if "Exception:" in l]
            flink = (causes or named or msg or ["error"])[-1 if causes else 0]
            rows = None
        out.append(f"# {family}: {expr}")
        if rows is not None:
            answered += 1
        if mark is not None and mark[0] == "known":
            known += 1
            out.append(f"# Known difference, not compared: {mark[1]}.")
            out.append("# Flink: " + (" ".join(rows) if rows is not None else flink[:300]))
        elif mark is not None and mark[0] == "type" and rows is not None:
            typed += 1
            out.append(f"# Values compared, not the type: {mark[1]}.")
            out.append("# Flink: " + " ".join(rows))
            out.append("query rowsort")
            out.append(query(expr, typed=False))
            out.append("----")
            out.extend(values)
        elif mark is not None and mark[0] == "refused":
            refused += 1
            out.append(f"# Weir refuses it: {mark[1]}.")
            if rows is not None:
                out.append("# Flink: " + " ".join(rows))
            out.append(f"statement error {function_name(expr)}")
            out.append(sql)
        elif rows is None:
            if mark is not None:
                sys.exit(f"{CASES}: Flink fails `{expr}`: a `type:` mark needs an answer")
            out.append("# Flink: " + flink[:300].replace("\n", " "))
            out.append("statement error")
            out.append(sql)
        else:
            out.append("query rowsort")
            out.append(sql)
            out.append("----")
            out.extend(rows)
        out.append("")
        print(f"{'ok ' if rows is not None else 'ERR'} {expr}", flush=True)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(out))
    total = len(read_cases())
    print(f"{total} cases: Flink answered {answered}; Weir refuses {refused}; "
          f"{typed} compared without their type; {known} known differences; wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
