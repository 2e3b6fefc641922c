"""Small tables held on the driver, and the questions the summary, the charts and the
state ask of a table whether it is held here or is a Spark DataFrame.

The compact form's tables are a few rows per queue, minute or segment: computed on
the driver (L{spark.audit.compact}), where a Spark query over a few rows costs its
planning and scheduling (about 0.13 CPU s each on a local JVM) and they are some fifty.
The per-record form's tables stay DataFrames. Both answer the same questions here,
with Spark SQL's semantics: nulls sort first, aggregates skip them, a comparison with
a null is not true.

test-case-name: tests.unit.test_audit_rows
"""

import decimal


def ddl_names(ddl):
    """The column names of a DDL schema string (C{"a bigint, b array<bigint>"})."""
    return [c.split()[0] for c in ddl.split(", ")]


class Rows:
    """A small table on the driver: C{rows} (dicts) of the schema C{ddl}."""

    def __init__(self, ddl, rows=()):
        self.ddl = ddl
        self.columns = ddl_names(ddl)
        self.rows = [{c: r.get(c) for c in self.columns} for r in rows]

    def where(self, test):
        """The rows for which C{test(row)} is true."""
        return Rows(self.ddl, [r for r in self.rows if test(r)])

    def frame(self, spark):
        """This table as a Spark DataFrame (to write it as Parquet)."""
        return spark.createDataFrame([tuple(r[c] for c in self.columns) for r in self.rows], self.ddl)

    def __len__(self):
        return len(self.rows)


def collected(df, ddl):
    """The rows of the (small) DataFrame C{df} as a L{Rows} of C{ddl}."""
    return Rows(ddl, [r.asDict() for r in df.collect()])


def is_local(table):
    """Whether C{table} is a L{Rows} (else a Spark DataFrame)."""
    return isinstance(table, Rows)


def frame(spark, table):
    """C{table} as a Spark DataFrame."""
    return table.frame(spark) if is_local(table) else table


def _plain(v):
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, bytearray):
        return bytes(v).hex()
    return v


def null_first(row, keys):
    """A sort key of C{row} by C{keys}, ascending with nulls first (Spark's order)."""
    return tuple((row[k] is not None, row[k]) for k in keys)


def dicts(table, order=(), limit=None):
    """The rows of C{table} as dicts, ordered by the columns C{order} (then by the
    others, so that ties come out the same from either kind of table), at most
    C{limit}."""
    if is_local(table):
        rows = table.rows
        if order:
            rest = [c for c in table.columns if c not in order]
            rows = sorted(rows, key=lambda r: null_first(r, list(order) + rest))
        return [dict(r) for r in (rows if limit is None else rows[:limit])]
    df = table
    if order:
        df = df.orderBy(*order, *[c for c in df.columns if c not in order])
    if limit is not None:
        df = df.limit(limit)
    return [{k: _plain(v) for k, v in r.asDict().items()} for r in df.collect()]


def count(table):
    """The number of rows of C{table}."""
    return len(table) if is_local(table) else table.count()


def counts(table, column):
    """C{{value: rows}} of C{table}'s C{column}."""
    if is_local(table):
        out = {}
        for r in table.rows:
            out[r[column]] = out.get(r[column], 0) + 1
        return out
    from pyspark.sql import functions as F

    return {r[column]: r["n"] for r in table.groupBy(column).agg(F.count("*").alias("n")).collect()}


def where(table, column, op, value=None):
    """The rows of C{table} whose C{column} is C{value} (C{op} C{"=="}), is not
    C{value} (C{"!="}), or is not null (C{"set"}); a null is neither equal nor unequal."""
    if is_local(table):
        tests = {
            "==": lambda v: v is not None and v == value,
            "!=": lambda v: v is not None and v != value,
            "set": lambda v: v is not None,
        }
        test = tests[op]
        return table.where(lambda r: test(r[column]))
    from pyspark.sql import functions as F

    col = F.col(column)
    return table.where({"==": col == value, "!=": col != value, "set": col.isNotNull()}[op])


def total(table, column):
    """The sum of C{table}'s C{column} (None when it has no value, as SQL's C{sum})."""
    if is_local(table):
        values = [r[column] for r in table.rows if r[column] is not None]
        return sum(values) if values else None
    from pyspark.sql import functions as F

    return table.agg(F.sum(column)).first()[0]


def values(table, column):
    """The distinct values of C{table}'s C{column}."""
    if is_local(table):
        return {r[column] for r in table.rows}
    return {r[column] for r in table.select(column).distinct().collect()}


# -- Spark SQL's arithmetic, where Python's differs ---------------------------------------


def spark_round(value, digits):
    """C{round(value, digits)} as Spark SQL rounds a double: half up, on the shortest
    decimal that prints it."""
    if value is None:
        return None
    q = decimal.Decimal(1).scaleb(-digits)
    return float(decimal.Decimal(repr(value)).quantize(q, rounding=decimal.ROUND_HALF_UP))


def least(*values):
    """SQL's C{least}: the smallest value that is not null (None when all are)."""
    known = [v for v in values if v is not None]
    return min(known) if known else None


def greatest(*values):
    """SQL's C{greatest}: the largest value that is not null (None when all are)."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def aggregate(rows, keys, columns):
    """Group C{rows} (dicts) by C{keys}; per group, each of C{columns} (C{{name: (fn,
    column)}}, C{fn} one of C{sum}, C{min}, C{max}, C{count}) as SQL computes it (nulls
    skipped; C{count} of C{"*"} counts rows). Returns dicts in the order groups are
    first seen."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, members in groups.items():
        row = dict(zip(keys, key))
        for name, (fn, column) in columns.items():
            if fn == "count":
                row[name] = len(members) if column == "*" else sum(1 for m in members if m[column] is not None)
                continue
            vals = [m[column] for m in members if m[column] is not None]
            row[name] = ({"sum": sum, "min": min, "max": max}[fn](vals)) if vals else None
        out.append(row)
    return out
