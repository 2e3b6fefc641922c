"""The audit job's I/O: arguments, the SparkSession, reading a data directory, running
the transforms, writing the outputs, stopping Spark.

``python -m spark.audit DATA_DIR [--compare OTHER_DIR] [--out OUT_DIR]`` runs it on
``local[*]``; under ``spark-submit --master ...`` the master comes from spark-submit.
Exit codes: 0 no integrity finding, 1 integrity findings, 2 bad input or no Spark.

test-case-name: tests.spark.test_audit_job
"""

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from spark.audit import checks as K
from spark.audit import classcache
from spark.audit import ranges as R
from spark.audit import records as rec
from spark.audit import rows as RW
from spark.audit import transforms as T
from spark.audit.rows import frame

_ITEM_NAMES = [c.split()[0] for c in rec.ITEM_DDL.split(", ")]

#: The steps the progress display counts.
STEPS = ["read", "decode", "integrity", "consume queues", "consumption", "compare", "write", "report"]


class Progress:
    """Prints one line per step, with the elapsed time, to C{stream} (stderr).

    Spark's own console progress bar shows the stages inside a step."""

    def __init__(self, stream=None, enabled=True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.start = time.monotonic()

    def step(self, name, detail=""):
        """Announce step C{name}."""
        if self.enabled:
            n = STEPS.index(name) + 1 if name in STEPS else "-"
            t = time.monotonic() - self.start
            print(f"[audit {n}/{len(STEPS)} {t:7.1f}s] {name} {detail}".rstrip(), file=self.stream, flush=True)


def parse_args(argv):
    """Parse the command line; returns an C{argparse.Namespace}."""
    p = argparse.ArgumentParser(
        prog="python -m spark.audit",
        description="Audit an mqserver data directory (commit log, consume queues, metadata).",
    )
    p.add_argument("data_dir", help="the broker's store.path (local path or a Hadoop URI)")
    p.add_argument("--compare", metavar="OTHER_DIR", help="a second directory (slave) to compare by eventId")
    p.add_argument("--out", default="audit-report", help="output directory (default: ./audit-report)")
    p.add_argument("--master", default=None, help="Spark master when not run by spark-submit (default local[*])")
    p.add_argument("--driver-memory", default="4g", help="driver memory for local runs (default 4g)")
    p.add_argument("--segment-size", type=int, default=None,
                   help="segment size in bytes, when the files cannot tell (no BLANK-sealed segment)")
    p.add_argument("--as-of-ms", type=int, default=None,
                   help="the time overdue delays and expired topics are judged at (default: the checkpoint's mtime)")
    p.add_argument("--grace-ms", type=int, default=5000,
                   help="slack before a delay counts as overdue or an expired topic as unreclaimed")
    p.add_argument("--split-mb", type=float, default=R.DEFAULT_SPLIT >> 20,
                   help="bytes of a segment one task decodes, in MiB (default 64): bounds memory per task")
    p.add_argument("--max-examples", type=int, default=20, help="examples per finding in the summary")
    p.add_argument("--tables", default="none", metavar="NAMES",
                   help="detail tables to write as Parquet under OUT_DIR/tables: comma-separated names (see"
                        " docs/audit.md), 'all', or 'none' (the default: summary.json and the report only)")
    p.add_argument("--quiet", action="store_true", help="no progress display (neither step lines nor Spark's bar)")
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                   help="Spark's stage progress bar on stderr: auto (when stderr is a terminal), always, never")
    p.add_argument("--live", action="store_true",
                   help="the broker is running: read only up to the checkpoint's logOffset (what it made durable)")
    p.add_argument("--since-state", metavar="DIR", default=None,
                   help="keep what this audit proved in DIR and read only new or changed segments next time")
    p.add_argument("--full", action="store_true",
                   help="one row per record through every check (the reference; slower) instead of the compact form")
    p.add_argument("--class-cache", default=classcache.default_dir(), metavar="DIR",
                   help="keep the JVM's loaded classes in DIR for the next local run (Java 13+), or"
                        " 'none' (default: $XDG_CACHE_HOME/mqserver or ~/.cache/mqserver)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark configuration property (repeatable), as spark-submit's --conf")
    return p.parse_args(argv)


#: JVM option: exit on the first OutOfMemoryError rather than run on with a dead thread.
OOM_EXIT = "-XX:+ExitOnOutOfMemoryError"
#: JVM option: compile with the quick C1 compiler only. The audit's JVM runs short Spark
#: jobs and exits; the optimising C2 compiler spent about 22 of its 48 CPU seconds on a
#: 0.5 GiB log (bench/audit_bench.py), and its code never paid that back before the job
#: ended (docs/audit.md, "Memory and speed").
QUICK_JIT = "-XX:TieredStopAtLevel=1"
#: The options of the JVMs the audit starts, unless the user gave their own.
JAVA_OPTIONS = f"{OOM_EXIT} {QUICK_JIT}"
#: The driver's logging: errors only (spark/audit/log4j2.properties).
LOG_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


def log_option():
    """The driver JVM's option naming L{LOG_CONFIG} (a leading space), or "" when its
    path holds whitespace (Spark splits the options on it)."""
    if any(c.isspace() for c in LOG_CONFIG):
        return ""
    return f" -Dlog4j2.configurationFile=file:{LOG_CONFIG}"


#: How long stopping Spark may take after a failure before the process exits anyway.
STOP_TIMEOUT_S = 60


def build_session(args, archive=None):
    """Return a SparkSession. Under spark-submit the master is already set; otherwise
    C{--master} or C{local[*]}, and the driver's JVM starts from C{archive} (a
    L{spark.audit.classcache.ClassArchive}) when given; if it cannot, the archive is
    dropped and the JVM started without it."""
    extra = archive.options() if archive is not None else ""
    try:
        return _session(args, extra)
    except Exception:
        if archive is None or archive.path is None:
            raise
        archive.discard()  # e.g. a damaged file: the JVM exited before it listened
        return _session(args, "")


def _session(args, extra_java):
    from pyspark.sql import SparkSession

    conf = submitted_conf()
    b = SparkSession.builder.appName("mqserver-audit")
    if not submitted():
        # Local workers run this interpreter (the one with our dependencies), not
        # whatever python3 is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        b = b.master(args.master or "local[*]").config("spark.driver.memory", args.driver_memory)
        # A JVM out of heap may leave a thread dead and the job waiting forever; end
        # the JVM instead, so the driver sees the failure and exits with 2.
        b = b.config("spark.driver.extraJavaOptions", JAVA_OPTIONS + log_option() + extra_java)
    if not conf.contains("spark.executor.extraJavaOptions"):
        b = b.config("spark.executor.extraJavaOptions", JAVA_OPTIONS)
    if not conf.contains("spark.ui.showConsoleProgress"):
        b = b.config("spark.ui.showConsoleProgress", "true" if console_progress(args) else "false")
    for item in args.conf:  # after the defaults above: the user's --conf wins
        key, _, value = item.partition("=")
        b = b.config(key, value)
    b = b.config("spark.sql.session.timeZone", "UTC")
    spark = b.getOrCreate()
    tune(spark)
    return spark


def class_archive(args):
    """The L{spark.audit.classcache.ClassArchive} of a local run (None under
    spark-submit, whose JVM is already running, or when C{--conf} sets the driver's
    JVM options)."""
    if submitted() or any(c.partition("=")[0] == "spark.driver.extraJavaOptions" for c in args.conf):
        return None
    return classcache.ClassArchive.find(args.class_cache)


def jvm_process(spark):
    """The C{Popen} of the JVM pyspark started for C{spark}, or None (spark-submit's)."""
    # pyspark keeps it on its gateway (not public; pyspark is pinned in setup.cfg).
    return getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)


def console_progress(args, stream=None):
    """Whether Spark's console progress bar (C{spark.ui.showConsoleProgress}) is on:
    never with C{--quiet} or C{--progress never}, always with C{--progress always},
    else when C{stream} (stderr, where the driver JVM draws it) is a terminal."""
    if args.quiet or args.progress == "never":
        return False
    if args.progress == "always":
        return True
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def submitted():
    """Return True when run by spark-submit, which starts the JVM before Python and
    hands pyspark its gateway's port (pyspark's own test for connecting to it)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def submitted_conf():
    """Return the Spark configuration spark-submit was given (master, C{--conf} ...);
    an empty C{SparkConf} when not run by spark-submit."""
    from pyspark import SparkConf, SparkContext

    if submitted():
        # Before a context exists SparkConf() has no JVM and sees none of spark-submit's
        # settings (so the job ran on local[*] whatever --master said): connect to the
        # JVM spark-submit started. _ensure_initialized is pyspark's own way to do it
        # (not public; pyspark is pinned in setup.cfg, and the cluster test runs it).
        SparkContext._ensure_initialized()
    return SparkConf()


def tune(spark):
    """Size shuffles to the cluster unless the user chose: the audit's shuffles are
    aggregates, and Spark's default of 200 partitions costs more than the work on
    small directories. Quiets Spark's INFO/WARN chatter (the progress bar stays)."""
    conf = spark.sparkContext.getConf()
    if not conf.contains("spark.sql.shuffle.partitions"):
        n = max(2, 2 * spark.sparkContext.defaultParallelism)
        spark.conf.set("spark.sql.shuffle.partitions", str(n))
    if not conf.contains("spark.sql.inMemoryColumnarStorage.compressed"):
        # The decoded records are cached once and read by every check; compressing the
        # cache cost more than decoding them (2x the decode stage on a 200 MB log).
        spark.conf.set("spark.sql.inMemoryColumnarStorage.compressed", "false")
    spark.sparkContext.setLogLevel("ERROR")


#: Spark SQL settings for the compact form's queries: expressions interpreted, not
#: compiled to Java. They run over a few rows, and generating and compiling code for
#: each (Janino, class loading) cost more than the rows: 2-3 of the JVM's ~17 CPU s on a
#: 0.5 GiB log when the compact form's tables were Spark queries (docs/audit.md,
#: "Memory and speed"). C{factoryMode} is an internal setting of
#: Spark SQL, honoured by the pinned pyspark (tests/spark/test_audit_job.py checks it).
INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def interpreted(spark, on):
    """Run the session's queries with expressions interpreted (C{on}) or compiled, as
    L{INTERPRETED} says; settings the user gave are left alone."""
    conf = spark.sparkContext.getConf()
    for key, value in INTERPRETED.items():
        if conf.contains(key):
            continue
        if on:
            spark.conf.set(key, value)
        else:
            spark.conf.unset(key)


def ship_code(spark):
    """Add the zip of L{spark.audit.package} to the job, unless spark-submit was given
    C{--py-files} already or the master is local (C{local}, C{local[N]}): executors on
    a cluster then import the format module. Returns the zip's path (in a temporary
    directory of its own, which L{main} removes once Spark stopped), or None."""
    conf = spark.sparkContext.getConf()
    if conf.get("spark.submit.pyFiles", ""):
        return None
    master = spark.sparkContext.master
    if master == "local" or master.startswith("local["):
        # The Python workers run here, with this interpreter, its environment and this
        # working directory: they import this code as the driver did, C speedups
        # included, which a zip ahead of them on the workers' path would hide.
        return None
    from spark.audit.package import build_pyfiles

    path = build_pyfiles(os.path.join(tempfile.mkdtemp(prefix="mqaudit-"), "mqserver_audit.zip"))
    spark.sparkContext.addPyFile(path)
    return path


# -- file system (Hadoop's, so HDFS/S3 paths work too) ----------------------------------


def _hpath(spark, path):
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p, p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def list_dir(spark, path):
    """Return C{[(name, is_dir, uri)]} of C{path}'s children, [] when it is missing."""
    p, fs = _hpath(spark, path)
    if not fs.exists(p):
        return []
    return [(s.getPath().getName(), s.isDirectory(), s.getPath().toString()) for s in fs.listStatus(p)]


def exists(spark, path):
    """Return True when C{path} exists."""
    p, fs = _hpath(spark, path)
    return bool(fs.exists(p))


def write_text(spark, path, text):
    """Write C{text} to C{path} (UTF-8), replacing it."""
    p, fs = _hpath(spark, path)
    out = fs.create(p, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()


def _abs(path):
    return path if "://" in path or path.startswith("file:") else os.path.abspath(path)


# -- reading ------------------------------------------------------------------------------


def read_json_file(spark, path):
    """Read a small JSON file on the driver through Hadoop's file system (the one Spark
    lists the directory with: local, HDFS, S3...); returns C{(data, mtime_ms)}, or
    C{(None, None)} when it is missing, C{(None, mtime_ms)} when it is not JSON. (The
    C{binaryFile} reader ran a Spark job of its own for each file.)"""
    p, fs = _hpath(spark, path)
    if not fs.exists(p):
        return None, None
    mtime = int(fs.getFileStatus(p).getModificationTime())
    stream = fs.open(p)
    try:
        content = bytes(spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()
    try:
        return json.loads(content), mtime
    except ValueError:
        return None, mtime


def list_files(spark, path):
    """Return C{[(name, uri, length)]} of the files in C{path} ([] when it is missing).
    C{uri} is the absolute, percent-encoded URI executors open (L{ranges.Reader})."""
    p, fs = _hpath(spark, path)
    if not fs.exists(p):
        return []
    return [
        (s.getPath().getName(), s.getPath().toUri().toString(), s.getLen())
        for s in fs.listStatus(p) if not s.isDirectory()
    ]  # fmt: skip


def one_task_each(spark, tasks, fn, ddl):
    """Return the DataFrame (schema C{ddl}) of C{fn(tasks, batches)} run as
    C{mapInArrow}, one Spark task per element of C{tasks}: the JVM numbers them
    (C{spark.range}, one number per partition) and each worker looks its own up
    (L{ranges.numbered})."""
    n = max(1, len(tasks))
    return spark.range(0, len(tasks), 1, n).mapInArrow(functools.partial(fn, tasks), ddl)


#: The most rows the compact form's decode (and its consume queues' decode) may leave
#: for the driver, where each is a dict of its values (a few hundred bytes). A log leaves
#: a few per range, queue, minute and block, and one per admin record or CRC failure;
#: each task may make its share, and past it (tens of thousands of topics, millions of
#: delays) the directory is audited in the per-record form, whose rows stay in Spark.
COMPACT_ROWS_MAX = 500_000


class TooManyRows(Exception):
    """The compact form's decode would leave more than L{COMPACT_ROWS_MAX} rows."""


def compact_rows(spark, tasks, fn, ddl, flag):
    """Run C{fn} over C{tasks} (L{one_task_each}), each task capped at its share of
    L{COMPACT_ROWS_MAX} rows, and collect the rows as L{Item}s; L{TooManyRows} when a
    task made more than its share (it then sent a row whose C{flag} column is
    L{ranges.OVERFLOW})."""
    share = max(1, COMPACT_ROWS_MAX // max(1, len(tasks)))
    rows = one_task_each(spark, tasks, functools.partial(fn, cap=share), ddl).collect()
    items = [Item((k, v) for k, v in r.asDict().items() if v is not None) for r in rows]
    over = [r for r in items if r[flag] == R.OVERFLOW]
    if over:
        n = max(r["n"] for r in over)
        raise TooManyRows(f"a task of the compact decode made {n:,} rows (its share: {share:,})")
    return items


class Item(dict):
    """A collected row, holding only its values that are not null; the others read as
    None."""

    def __missing__(self, key):
        return None


def _decode(spark, tasks):
    """Run L{ranges.decode_ranges} over C{tasks} (tuples of L{ranges.RANGE_FIELDS}), one
    task each."""
    return one_task_each(spark, tasks, R.decode_ranges, rec.ITEM_DDL)


def _range_rows(items):
    return [r.asDict() for r in items.where("kind = 'range'").collect()]


def cap_listing(listing, limit):
    """Clip a commit-log listing C{[(name, uri, length)]} to the offsets below C{limit}
    (None: no limit). Returns C{(listing, bytes left out)}."""
    if limit is None:
        return listing, 0
    out, left = [], 0
    for name, uri, length in listing:
        keep = length
        if len(name) == 20 and name.isdigit():
            keep = max(0, min(length, limit - int(name)))
            if keep == 0 and int(name) >= limit:
                left += length
                continue
        left += length - keep
        out.append((name, uri, keep))
    return out, left


def log_listing(spark, data_dir, limit=None):
    """The commit-log files of C{data_dir}, C{[(name, uri, length)]}, clipped to the
    offsets below C{limit}; returns C{(listing, bytes left out)}."""
    log_dir = data_dir.rstrip("/") + "/commitlog"
    return cap_listing([f for f in list_files(spark, log_dir) if f[0][:1].isdigit()], limit)


def read_items(spark, data_dir, split=R.DEFAULT_SPLIT, digest=True, limit=None, skip=frozenset(), live=None,
               resume=None):
    """Decode every commit-log segment of C{data_dir} into the items DataFrame (cached),
    one task per byte range of C{split} bytes (see L{spark.audit.ranges}), reading only
    the offsets below C{limit} when given (C{--live}), and not the segment files named
    in C{skip} (carried by L{spark.audit.state}), and the segment files named in
    C{resume} (C{{name: (offset, records before it, CRC-32 of the bytes before it)}})
    only from that offset on. With
    C{live} (JSON C{{topic:
    create_event_id}}) the records come in the compact form (partial aggregates and the
    few records checked one by one, L{spark.audit.columns.compact_batches}).

    Returns C{(items, bytes not read, full)}: C{full()} decodes the same ranges again
    into one item per record, for the checks that need every record once a summary
    shows a finding (C{None} when C{items} has every record already). In the compact
    form C{items} are dicts, collected as each decode ends (a few per range), else a
    DataFrame over the cached decodes."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    listing, skipped = log_listing(spark, data_dir, limit)
    listing = [f for f in listing if f[0] not in skip]
    good, bad = R.segment_files(listing)
    extra = [R.bad_name_item(name, length) for name, _, length in bad]
    compact = live is not None
    if not good:
        if compact:
            return [Item(r) for r in extra], skipped, lambda: spark.createDataFrame([], rec.ITEM_DDL)
        return spark.createDataFrame([tuple(r.get(c) for c in _ITEM_NAMES) for r in extra], rec.ITEM_DDL), skipped, None
    resume = resume or {}
    tasks = R.plan(good, split, digest, live, {name: v[0] for name, v in resume.items()})
    begin = {int(name): v for name, v in resume.items()}
    by_key = {(t[1], t[3]): t for t in tasks}
    final = dict(by_key)  # the task whose decode of each range counts
    # Each round decodes some ranges (all, then those to walk again); a range's items
    # come from the last round that decoded it, and only while it is kept.

    def decode(ranges):
        if compact:  # a few rows per range: here at once
            return compact_rows(spark, ranges, R.decode_ranges, rec.ITEM_DDL, "kind")
        return _decode(spark, ranges).persist(StorageLevel.MEMORY_AND_DISK)

    def range_rows(gen):
        return [r for r in gen if r["kind"] == "range"] if compact else _range_rows(gen)

    gens = [decode(tasks)]
    decoded = [set(by_key)]
    rows = {(r["segment"], r["range_start"]): (0, r) for r in range_rows(gens[0])}
    for _ in range(64):
        segments, keep, rewalk = R.consolidate([r for _, r in rows.values()], begin)
        if not rewalk:
            break
        again = [by_key[(seg, a)][:5] + (start, digest, live) for seg, a, start in rewalk]
        final.update({(t[1], t[3]): t for t in again})
        gens.append(decode(again))
        decoded.append({(seg, a) for seg, a, _ in rewalk})
        for r in range_rows(gens[-1]):
            rows[(r["segment"], r["range_start"])] = (len(gens) - 1, r)
    else:
        raise RuntimeError("segment ranges did not chain after 64 rounds")
    full = None
    if compact:
        # The kept ranges decode the same from the same starting points: no rewalk.
        again = [final[k][:7] + (None,) for k in sorted(keep)]
        full = lambda: _decode(spark, again).where("kind = 'record'")  # noqa: E731
        items = []
        for g, got in enumerate(gens):
            wanted = {k for k in keep if rows[k][0] == g}
            every = wanted == decoded[g]
            items += [r for r in got if r["kind"] != "range" and (every or (r["segment"], r["range_start"]) in wanted)]
        return items + [Item(r) for r in segments + extra], skipped, full
    parts = []
    for g, df in enumerate(gens):
        wanted = {k for k in keep if rows[k][0] == g}
        df = df.where("kind != 'range'")
        if wanted != decoded[g]:
            keys = spark.createDataFrame(sorted(wanted), "segment bigint, range_start bigint")
            df = df.join(F.broadcast(keys), ["segment", "range_start"], "left_semi")
        parts.append(df)
    local = [tuple(r.get(c) for c in _ITEM_NAMES) for r in segments + extra]
    parts.append(spark.createDataFrame(local, rec.ITEM_DDL))
    items = parts[0]
    for df in parts[1:]:
        items = items.unionByName(df)
    return items, skipped, full  # over cached decodes: not cached again


def _cq_listing(spark, data_dir, low=None):
    """C{[(uri, length)]} of the consume-queue files of C{data_dir}; with C{low}
    (C{{(topic, queue id): offset}}) not those whose entries all lie below it."""
    from spark.audit.state import cq_file_wanted

    root = data_dir.rstrip("/") + "/consumequeue"
    files = []
    for name, is_dir, uri in list_dir(spark, root):
        if is_dir and not name.startswith("."):
            for qname, d, qdir in list_dir(spark, uri):
                if d:
                    files += [(u, n) for name2, u, n in list_files(spark, qdir)
                              if name2[:1].isdigit() and cq_file_wanted(low, name, qname, name2, n)]  # fmt: skip
    return files


def read_cq(spark, data_dir, low=None):
    """Decode every consume-queue file of C{data_dir} in bulk (topic directories are
    listed here, so names Spark would hide, such as ones starting with C{_}, are still
    read; C{.trash} is not). C{low}: C{{(topic, queue id): offset}}, files whose entries
    all lie below it are not read (an incremental audit checked them)."""
    from pyspark import StorageLevel

    files = _cq_listing(spark, data_dir, low)
    if not files:
        return spark.createDataFrame([], rec.CQ_DDL)
    groups = [(g, None, None) for g in R.group_files(files)]
    df = one_task_each(spark, groups, R.decode_cq_groups, rec.CQ_DDL)
    return df.persist(StorageLevel.MEMORY_AND_DISK)


def read_cq_compact(spark, data_dir, durable=None, limit=None):
    """The consume queues of C{data_dir} in their compact form (dicts of
    C{CQ_COMPACT_DDL}: problems, and per-block signatures,
    L{spark.audit.columns.cq_compact_file}: a few rows per file), collected; with
    C{durable} (C{[(topic, queue_id, length)]}) and C{limit}, only the entries a
    checkpoint made durable (C{--live})."""
    files = _cq_listing(spark, data_dir)
    if not files:
        return []
    spec = json.dumps(durable) if durable is not None else None
    groups = [(g, spec, limit) for g in R.group_files(files)]
    return compact_rows(spark, groups, R.decode_cq_compact, rec.CQ_COMPACT_DDL, "problem")


def topic_rows(meta):
    """The live topics of the checkpoint C{meta}, as L{checks.TOPICS_DDL} tuples."""
    return [
        (t["name"], int(t.get("queues", 1)), int(t.get("create_event_id", 0)),
         int(t.get("expire_at", 0)), int(t.get("create_ts", 0)))
        for t in (meta.get("state") or {}).get("topics", [])
    ]  # fmt: skip


def topics_frame(spark, meta, recs):
    """The live topics: from the checkpoint's state, or derived from the log when the
    directory has no checkpoint."""
    if meta is None:
        return T.topics_from_log(recs)
    return spark.createDataFrame(topic_rows(meta), K.TOPICS_DDL)


def pending_rows(meta):
    """Pending delays from the checkpoint (each C{[eventId, triggerMs, topic, logOffset,
    size, count, applied]}), as L{transforms.PENDING_DDL} tuples."""
    return [
        (int(d[0]), int(d[1]), d[2], int(d[5]), int(d[6]) if len(d) > 6 else 0)
        for d in ((meta or {}).get("state") or {}).get("delays", [])
    ]


def position_rows(spark, data_dir, meta):
    """Every consumer position the broker keeps (L{spark.audit.consumers}): RocketMQ's
    C{consumerOffset.json}, and the checkpoint's channels (NSQ, msgout queues and
    subscriptions) and msgout push subscriptions, as L{transforms.OFFSETS_DDL} tuples."""
    from spark.audit import consumers

    data, _ = read_json_file(spark, data_dir.rstrip("/") + "/consumerOffset.json")
    table = data.get("offsetTable") if isinstance(data, dict) else None
    return consumers.position_rows(table, meta)


# -- the job ------------------------------------------------------------------------------


def live_topics(meta):
    """The live topics of a checkpoint as JSON C{{topic: create_event_id}} (what the
    compact decode needs to sign the entries the consume queues must hold)."""
    topics = (meta.get("state") or {}).get("topics", [])
    return json.dumps({t["name"]: int(t.get("create_event_id", 0)) for t in topics}, sort_keys=True)


def audit_directory(spark, data_dir, args, progress, with_cq=True, state_dir=None, full_reason=None):
    """Read and check one directory. Returns C{(items, recs, tables, facts)}: the
    decoded items, the records, DataFrames by name and the small facts (metadata,
    floors) the summary needs.

    The records are decoded in the compact form (partial aggregates, see
    L{spark.audit.columns.compact_batches}) when the checkpoint names the live topics
    and no comparison needs every record's digest; otherwise (C{--full}, C{--compare},
    no checkpoint) one item per record. Both give the same tables: where the compact
    form shows a duplicate eventId or a consume-queue block that differs, the records
    are decoded again in full for that check.

    With C{state_dir} (C{--since-state}) the segments the state carries are not read,
    the tables cover them through their kept parts (in the compact form, their items
    join the items read, so every table and check covers them as if decoded; a check
    that needs their records makes the run a full one, L{spark.audit.state.FullAudit}),
    and C{facts["carry"]} is the L{spark.audit.carry.Carry} (C{full_reason}: carry
    nothing)."""

    from spark.audit import summary as S

    progress.step("read", data_dir)
    meta, meta_mtime = read_json_file(spark, data_dir.rstrip("/") + "/metadata.json")
    # A running broker appends past its checkpoint (records, consume-queue entries, the
    # torn tail of a write in progress): with --live only what the checkpoint made
    # durable is read, the checkpoint being read first.
    limit = int(meta.get("logOffset") or 0) if args.live and meta else None
    compact = meta is not None and not args.compare and not getattr(args, "full", False)
    # Digests are only compared with another directory's.
    split = max(4096, int(args.split_mb * (1 << 20)))
    carry = None
    if state_dir:
        listing = log_listing(spark, data_dir, limit)[0]
        from spark.audit.carry import Carry

        form = state_mod().COMPACT if compact else state_mod().RECORDS
        carry = Carry.open(spark, state_dir, listing, full_reason, form)
    skip = carry.skip if carry else frozenset()
    live = live_topics(meta) if compact else None
    interpreted(spark, compact)
    durable = None
    if limit is not None:  # entries past the checkpoint's queue lengths are not durable yet
        durable = [(t, int(q), int(n)) for t, qs in (meta.get("queues") or {}).items() for q, n in qs.items()]
    cq_compact = None
    if with_cq and compact:
        # The compact consume queues do not depend on the log's decode: read them in a
        # job of their own from another thread, whose tasks fill the cores the decode's
        # last tasks leave idle instead of running after it (docs/audit.md).
        cq_compact = _in_background(lambda: read_cq_compact(spark, data_dir, durable, limit))
    items, skipped, full = read_items(
        spark, data_dir, split, digest=bool(args.compare), limit=limit, skip=skip, live=live,
        resume=carry.resume if carry else None,
    )  # fmt: skip
    if compact and carry:  # the carried segments' items join what was read: whole-log tables
        items = carry.absorb_items(items)
    progress.step("decode", "commit-log segments")
    facts = {"carry": carry, "compact": compact, "read_up_to": None}
    if limit is not None:
        facts["read_up_to"] = {"offset": limit, "source": "checkpoint logOffset (--live)", "bytes_not_read": skipped}
    if compact:
        tables = compact_tables(spark, data_dir, args, progress, items, cq_compact, full, facts, meta,
                                meta_mtime, with_cq, durable, limit)  # fmt: skip
        return items, None, _cached(tables), facts
    recs = T.records(items)
    segs = RW.dicts(T.segments(items), ["segment"])
    totals = None
    if carry:
        carry.absorb(items, recs)
        segs = carry.segments(segs)
        carry.totals = carry.segment_totals(recs)
        totals = state_mod().merge_totals(list(carry.totals.values()))
    facts.update(S.log_facts(recs, segs, meta, meta_mtime, args, known=totals))
    # The tables merge the carried parts with the records read.
    merged = carry is not None and bool(carry.carried)
    tables = {
        "segments": spark.createDataFrame(segs, T.segments(items).schema) if carry else T.segments(items),
        "problems": T.problems(items).unionByName(carry.changed_problems()) if carry else T.problems(items),
        "queue_stats": RW.collected(carry.queue_stats() if merged else T.queue_stats(recs), K.QUEUE_STATS_DDL),
        "throughput": carry.throughput() if merged else T.throughput(recs),
    }
    progress.step("integrity", "eventIds")
    runs = [(r["start"], r["end"], r["copies"]) for r in (carry.runs() if merged else T.event_runs(items)).collect()]
    intervals = K.duplicate_intervals(runs)
    tables["event_gaps"] = K.event_gaps(runs, facts["event_floor"])
    if merged:
        carry.check_duplicates(intervals)
    tables["event_duplicates"] = T.event_id_duplicates_in(recs, _intervals(spark, intervals), bool(intervals))
    whole = carry.skeleton(recs) if merged else recs  # what the carried segments add to topics and delays
    topics = RW.collected(topics_frame(spark, meta, whole).select(*RW.ddl_names(K.TOPICS_DDL)), K.TOPICS_DDL)
    if carry and carry.carried:
        carry.check_topics(topics)
    tables["topics"] = topics
    if with_cq:
        progress.step("consume queues")
        cq = read_cq(spark, data_dir, low=carry.cq_lows(recs) if merged else None)
        if merged:
            cq = carry.cq_entries(cq)
        cq = _durable_cq(spark, cq, durable, limit)
        tables["cq_mismatches"] = T.cq_mismatches(recs, cq, topics.frame(spark), facts["log_min_offset"])
        tables["cq_problems"] = T.cq_problems(cq)
        ends = T.queue_ends(cq)
        ends = RW.collected(carry.queue_ends(ends) if carry else ends, K.ENDS_DDL)
        if carry:
            carry.ends = ends
        logged = [r.asDict() for r in T.logged_delays(whole).collect()]
        fired = {r["delay_id"]: r["n"] for r in T.fired_counts(whole).collect()}
        consumption(spark, data_dir, args, progress, tables, facts, meta, ends, logged, fired)
    return items, recs, _cached(tables), facts


def _intervals(spark, intervals):
    """The eventId intervals C{[(lo, hi)]} as a DataFrame (to join records with)."""
    return spark.createDataFrame(intervals, "lo bigint, hi bigint")


def consumption(spark, data_dir, args, progress, tables, facts, meta, ends, logged, fired):
    """Add the consumption tables (L{spark.audit.checks}) to C{tables}: every consumer's
    lag against the queue lengths C{ends}, retry and dead-letter volumes, the delays
    (C{logged} DELAY records, C{fired} counts, and the checkpoint's pending ones) and the
    expired topics."""
    progress.step("consumption")
    names = RW.ddl_names(T.OFFSETS_DDL)
    positions = [dict(zip(names, p)) for p in position_rows(spark, data_dir, meta)]
    tables["consumer_lag"] = K.consumer_lag(positions, ends)
    tables["retry_dlq"] = K.retry_dlq(tables["queue_stats"])
    as_of, grace = facts["as_of_ms"], args.grace_ms
    pending = [dict(zip(RW.ddl_names(T.PENDING_DDL), p)) for p in pending_rows(meta)]
    tables["delays"] = K.delays(logged, fired, pending, tables["topics"], as_of, grace)
    tables["expired_topics"] = K.expired_topics(tables["topics"], as_of, grace)


def compact_tables(spark, data_dir, args, progress, parts, cq_compact, full, facts, meta, meta_mtime, with_cq,
                   durable, limit):
    """The compact form's tables (L{spark.audit.compact}, on the driver) from the
    decode's C{parts} (dicts); fills C{facts}. Where the parts show an eventId held
    twice or a consume-queue block that differs, the records are decoded again in full
    (C{full()}) and that check runs in Spark over them."""
    from spark.audit import compact as C
    from spark.audit import summary as S
    from spark.audit.rows import Rows, ddl_names

    carry = facts["carry"]
    segs = C.segments(parts)
    if carry:
        carry.totals = C.totals(parts, by_segment=True)
    facts.update(S.log_facts(None, segs.rows, meta, meta_mtime, args, known=C.totals(parts)))
    facts["lag_parts"] = C.lag_parts(parts)
    more = carry.changed_rows() if carry else ()
    tables = {"segments": segs, "problems": C.problems(parts, more), "queue_stats": C.queue_stats(parts),
              "throughput": C.throughput(parts)}  # fmt: skip
    progress.step("integrity", "eventIds")
    runs = C.runs(parts)
    intervals = K.duplicate_intervals(runs)
    tables["event_gaps"] = K.event_gaps(runs, facts["event_floor"])
    tables["event_duplicates"] = Rows(K.DUPLICATES_DDL)
    if intervals:
        if carry:
            carry.need_records("an eventId is held twice")
        every = every_record(spark, full)
        tables["event_duplicates"] = T.event_id_duplicates_in(every, _intervals(spark, intervals), True)
    topics = Rows(K.TOPICS_DDL, [dict(zip(ddl_names(K.TOPICS_DDL), t)) for t in topic_rows(meta)])
    if carry and (carry.carried or carry.resumed):
        carry.check_topics(topics)
    tables["topics"] = topics
    if not with_cq:
        return tables
    progress.step("consume queues")
    cq = cq_compact.result()
    tables["cq_problems"] = C.cq_problems(cq)
    ends = C.queue_ends(cq)
    if carry:
        carry.ends = ends
    tables["cq_mismatches"] = Rows(K.CQ_MISMATCHES_DDL)
    if C.differing_blocks(parts, cq):
        if carry:
            carry.need_records("the consume queues differ from the log")
        every = T.records(every_record(spark, full))
        entries = _durable_cq(spark, read_cq(spark, data_dir), durable, limit)
        tables["cq_mismatches"] = T.cq_mismatches(every, entries, topics.frame(spark), facts["log_min_offset"])
    consumption(spark, data_dir, args, progress, tables, facts, meta, ends, *C.delay_inputs(parts))
    return tables


def _cached(tables):
    """C{tables} with each DataFrame among them cached: it feeds both its Parquet file
    and the summary, computed once. Caching a table plans its query (about 0.15 s each
    on a JVM just started): planned at once."""
    from spark.audit import summary as S
    from spark.audit.rows import is_local

    planned = S.at_once(**{name: t.persist for name, t in tables.items() if not is_local(t)})
    return dict(tables, **planned)


def every_record(spark, full):
    """The compact form's C{full()}: every record again, one row each, compiled (the
    rows are as many as the log's)."""
    interpreted(spark, False)
    return full()


def _in_background(work):
    """Run C{work()} in a thread of its own; returns its C{Future}. (Spark runs the jobs
    of several threads at once; pyspark pins each Python thread to a JVM thread.)"""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-background")
    try:
        return pool.submit(work)
    finally:
        pool.shutdown(wait=False)


def audit_main(spark, data_dir, args, progress):
    """L{audit_directory} of the main directory, in the per-record form when the compact
    form's rows would be too many for the driver (L{COMPACT_ROWS_MAX})."""
    try:
        return _audit_main(spark, data_dir, args, progress)
    except TooManyRows as e:
        progress.step("read", f"again, in the per-record form: {e}")
        spark.catalog.clearCache()
        return _audit_main(spark, data_dir, argparse.Namespace(**dict(vars(args), full=True)), progress)


def _audit_main(spark, data_dir, args, progress):
    """L{audit_directory}, with C{--since-state}: a damaged state is bad input (exit 2);
    what the carried parts cannot answer is audited in full."""
    if not args.since_state:
        return audit_directory(spark, data_dir, args, progress)
    st = state_mod()
    root = _abs(args.since_state)
    reason = "--compare matches every record of both directories" if args.compare else None
    try:
        try:
            return audit_directory(spark, data_dir, args, progress, state_dir=root, full_reason=reason)
        except st.FullAudit as e:
            progress.step("read", f"again, in full: {e}")
            spark.catalog.clearCache()
            return audit_directory(spark, data_dir, args, progress, state_dir=root, full_reason=str(e))
    except st.StateError as e:
        raise SystemExit(f"error: the state in {args.since_state} cannot be used: {e}\n"
                         "(move it away to start again with a full audit)") from None  # fmt: skip


def series(tables, facts, items, recs, carry, other_recs):
    """The report's time series (L{spark.audit.charts}) from the per-minute parts."""
    from spark.audit import charts as C

    if carry and carry.parts and "lag" in carry.parts:
        lags = carry.parts["lag"]
    else:
        lags = facts["lag_parts"] if facts["compact"] else C.lag_parts(recs)
    return C.collect(tables, facts["totals"], lags, recs, other_recs)


def state_mod():
    """L{spark.audit.state}, imported when an audit keeps a state."""
    from spark.audit import state

    return state


def _durable_cq(spark, cq, durable, limit):
    """Keep the consume-queue entries below the checkpoint's queue lengths C{durable}
    (C{[(topic, queue_id, length)]}) pointing below C{limit} (C{--live}); all when None."""
    from pyspark.sql import functions as F

    if durable is None:
        return cq
    lengths = spark.createDataFrame(durable, "topic string, queue_id int, durable bigint")
    cq = cq.join(F.broadcast(lengths), ["topic", "queue_id"]).where(F.col("queue_offset") < F.col("durable"))
    return cq.where(F.col("log_offset").isNull() | (F.col("log_offset") < limit)).drop("durable")


def wanted_tables(spec, tables):
    """The names of C{tables} that C{--tables} C{spec} asks for (C{all}, C{none} or
    comma-separated names); a name the run has no table of is bad input."""
    spec = (spec or "none").strip()
    if spec == "none":
        return []
    if spec == "all":
        return list(tables)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in tables]
    if unknown:
        raise SystemExit(f"error: --tables: no table {unknown[0]!r} in this run (tables: {', '.join(sorted(tables))})")
    return names


def run(spark, args, progress=None, clear_cache=True):
    """Run the audit with an existing session. Returns C{(summary, exit_code)}. With
    C{clear_cache} the session's cached tables are dropped at the end (the session goes
    on to other work)."""
    from spark.audit import report as R
    from spark.audit import summary as S

    progress = progress or Progress(enabled=not args.quiet)
    data_dir = _abs(args.data_dir)
    if not exists(spark, data_dir.rstrip("/") + "/commitlog"):
        raise SystemExit(f"error: {args.data_dir} has no commitlog/ directory: not an mqserver data directory")
    items, recs, tables, facts = audit_main(spark, data_dir, args, progress)
    carry = facts["carry"]
    if args.compare:
        progress.step("compare", args.compare)
        other_dir = _abs(args.compare)
        if not exists(spark, other_dir.rstrip("/") + "/commitlog"):
            raise SystemExit(f"error: {args.compare} has no commitlog/ directory")
        _, other_recs, other_tables, other_facts = audit_directory(
            spark, other_dir, args, Progress(enabled=False), with_cq=False
        )
        floor = max(facts["event_floor"], other_facts["event_floor"])
        tables["compare"] = T.compare_records(recs, other_recs, floor).persist()
        tables["other_problems"] = other_tables["problems"]
    out = _abs(args.out).rstrip("/")
    progress.step("write", out)
    wanted = wanted_tables(args.tables, tables)
    # The tables are small next to the decoding; writing them from a few threads
    # overlaps the per-job latency of Spark's scheduler and output committer. Each is
    # a few Spark jobs: only those asked for are written.
    with ThreadPoolExecutor(max_workers=4) as pool:
        def write(name):
            frame(spark, tables[name]).write.mode("overwrite").parquet(f"{out}/tables/{name}")

        jobs = [pool.submit(write, name) for name in wanted]
        for j in jobs:
            j.result()
    summary = S.summarize(tables, facts, args)
    if args.compare:
        summary["compare"] = S.compare_summary(tables["compare"], other_tables, other_facts, floor, args)
    if carry:
        summary["incremental"] = carry.summary(facts["segments"])
    summary["exit_code"] = S.exit_code(summary)
    write_text(spark, f"{out}/summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    progress.step("report")
    charts = S.chart_data(tables)
    charts.update(series(tables, facts, items, recs, carry, other_recs if args.compare else None))
    write_text(spark, f"{out}/report.html", R.render(summary, charts))
    if carry:  # only after a run that completed
        progress.step("report", f"saving the state in {args.since_state}")
        carry.save_run(tables, facts, summary)
    if clear_cache:
        spark.catalog.clearCache()
    progress.step("report", f"done: {summary['verdict']} (exit {summary['exit_code']})")
    return summary, summary["exit_code"]


def main(argv=None):
    """Command-line entry point; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("error: pyspark is not installed: pip install 'mqserver[spark]'", file=sys.stderr)
        return 2
    archive = class_archive(args)
    try:
        spark = build_session(args, archive)
    except Exception as e:  # the JVM did not start: almost always a missing Java
        print(f"error: Spark did not start ({e}).\nInstall a Java runtime (Debian: "
              "apt-get install default-jre-headless) or set JAVA_HOME.", file=sys.stderr)  # fmt: skip
        return 2
    code = 2
    shipped = None
    try:
        shipped = ship_code(spark)
        # The session stops next, which drops every cache. Clearing them first only raced
        # the stop: the block manager's removals, answered from a pool being shut down,
        # printed a stack trace on stderr for each answer refused.
        summary, code = run(spark, args, clear_cache=False)
        from spark.audit.summary import console_summary

        print(json.dumps(console_summary(summary), indent=2))
        print(f"report: {_abs(args.out).rstrip('/')}/report.html")
    except SystemExit as e:  # bad input, said by run()
        print(e, file=sys.stderr)
        code = 2
    except Exception as e:  # a Spark failure (a task, an executor, the JVM itself)
        print(f"error: the audit job failed: {failure_cause(e)}", file=sys.stderr)
        code = 2
    finally:
        stop_bounded(spark, code)
        if shipped is not None:  # its temporary directory, once the workers are gone
            shutil.rmtree(os.path.dirname(shipped), ignore_errors=True)
        if archive is not None:
            archive.finish(jvm_process(spark))
    return code


def failure_cause(e):
    """Return the root cause of a Spark failure in a few lines: the Java exception's
    first lines, or the Python error, without py4j's whole stack."""
    text = str(e).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    causes = [ln.strip() for ln in lines if ln.strip().startswith(("Caused by:", "org.apache.spark.", "java."))]
    head = lines[:1] + causes[:4] if lines else [type(e).__name__]
    return "\n  ".join(dict.fromkeys(head))


def stop_bounded(spark, code):
    """Stop Spark, but never wait more than C{STOP_TIMEOUT_S}: after a failure the JVM
    may be gone or stuck, and the process must still end with C{code}."""
    import threading

    t = threading.Thread(target=spark.stop, name="spark-stop", daemon=True)
    t.start()
    t.join(STOP_TIMEOUT_S)
    if t.is_alive():
        print(f"error: Spark did not stop within {STOP_TIMEOUT_S}s; exiting", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
