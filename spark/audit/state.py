"""Incremental audits (C{--since-state DIR}): what an audit proved, kept per segment, and
carried into the next audit so it reads only new or changed segments.

The state is one I{generation} directory under C{DIR} (C{gen-<ms>}): C{manifest.json}
(one entry per proven segment: length, records, first/last eventId and store time, last
record offset, SHA-256 of the bytes audited; per consume queue the entries checked; the
live topics' incarnations) and Parquet tables of the per-segment parts the whole-log
tables are merged from (L{PARTS}). The manifest is written last, under a temporary name
renamed into place, and a generation without one is ignored, so a run that stops half way
leaves the previous state intact; older generations are removed afterwards.

A segment is I{carried} (not decoded again) when it was closed when proven (sealed by a
BLANK, or not the newest segment), had no problem of any kind, and its file still has
the same length and digest. A closed segment whose length or digest differs, or an open
one whose proven prefix differs, is an integrity finding (C{changed_segments}) and is
audited again in full; the newest, open segment is always read again.

test-case-name: tests.spark.test_incremental
"""

import hashlib
import json
import time

from pyspark.sql import functions as F

from mqserver.store import format as fmt
from spark.audit import charts
from spark.audit import ranges as R
from spark.audit import transforms as T

VERSION = 1
MANIFEST = "manifest.json"
#: The per-segment parts kept as Parquet, each with a C{segment} column.
PARTS = ("queue", "throughput", "runs", "admin", "fired", "lag")
_CHUNK = 8 << 20

#: How each column of L{transforms.queue_stats} merges across segments.
_QUEUE_MERGE = {
    "messages": F.sum, "bytes": F.sum, "body_bytes": F.sum, "first_store_ts": F.min, "last_store_ts": F.max,
    "first_event_id": F.min, "last_event_id": F.max, "min_queue_offset": F.min, "max_queue_offset": F.max,
    "delay_level_messages": F.sum, "delayed_fired": F.sum,
}  # fmt: skip
#: How the per-segment totals merge into the log's totals (L{summary.log_facts}).
_TOTALS_MERGE = {
    "records": sum, "messages": sum, "admin_records": sum, "bytes": sum, "first_event_id": min,
    "last_event_id": max, "first_store_ts": min, "last_store_ts": max,
}  # fmt: skip


class StateError(Exception):
    """The state directory cannot be used (damaged, another version)."""


class FullAudit(Exception):
    """Something the carried state cannot answer: audit the whole log instead."""


# -- file system -------------------------------------------------------------------------


def _fs(spark, path):
    jvm = spark.sparkContext._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p, p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), jvm


def _generations(spark, root):
    p, fs, jvm = _fs(spark, root)
    if not fs.exists(p):
        return []
    gens = [s.getPath() for s in fs.listStatus(p) if s.isDirectory() and s.getPath().getName().startswith("gen-")]
    done = [g for g in gens if fs.exists(jvm.org.apache.hadoop.fs.Path(g, MANIFEST))]
    return sorted((g.toString() for g in done), key=lambda u: int(u.rsplit("gen-", 1)[1]))


def _read_text(spark, path):
    p, fs, jvm = _fs(spark, path)
    stream = fs.open(p)
    try:
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)).decode("utf-8")
    finally:
        stream.close()


def _write_atomically(spark, path, text):
    p, fs, jvm = _fs(spark, path)
    tmp = jvm.org.apache.hadoop.fs.Path(path + ".tmp")
    out = fs.create(tmp, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()
    if not fs.rename(tmp, p):
        raise StateError(f"could not rename {tmp.toString()} to {path}")


def _delete(spark, path):
    p, fs, _ = _fs(spark, path)
    fs.delete(p, True)


# -- loading and checking a manifest ------------------------------------------------------

_SEGMENT_KEYS = {"segment": int, "name": str, "length": int, "proven": int, "closed": bool, "digest": str,
                 "records": int, "records_end": int, "sealed": bool}  # fmt: skip


def check_manifest(m):
    """Return C{m} (a parsed manifest) when it has every field of this version, else
    raise L{StateError} saying what is wrong."""
    if not isinstance(m, dict):
        raise StateError("manifest is not a JSON object")
    if m.get("version") != VERSION:
        raise StateError(f"manifest version {m.get('version')!r}, this audit reads {VERSION}")
    segs = m.get("segments")
    if not isinstance(segs, list):
        raise StateError("manifest has no segments list")
    for s in segs:
        for k, t in _SEGMENT_KEYS.items():
            if not isinstance(s, dict) or not isinstance(s.get(k), t):
                raise StateError(f"segment entry {str(s)[:80]} lacks {k} ({t.__name__})")
        if not isinstance(s.get("totals"), dict):
            raise StateError(f"segment {s['name']} lacks its totals")
    if m.get("cq") is not None and not isinstance(m["cq"], dict):
        raise StateError("manifest cq is not an object")
    return m


def load(spark, root):
    """Return the newest complete manifest under C{root} (and its directory), or
    C{(None, None)} when there is none yet. Raises L{StateError} when it is damaged."""
    gens = _generations(spark, root)
    if not gens:
        return None, None
    gen = gens[-1]
    try:
        text = _read_text(spark, gen + "/" + MANIFEST)
    except Exception as e:  # py4j's error of the JVM's: e.g. Hadoop's checksum of a changed file
        why = str(e).strip().splitlines()
        cause = next((ln.strip() for ln in why if "Exception" in ln and ":" in ln), why[0] if why else type(e).__name__)
        raise StateError(f"{gen}/{MANIFEST} cannot be read ({cause})") from None
    try:
        m = json.loads(text)
    except ValueError as e:
        raise StateError(f"{gen}/{MANIFEST} is not valid JSON ({e})") from None
    return check_manifest(m), gen


# -- digests ------------------------------------------------------------------------------


def file_digest(uri, n):
    """Return the SHA-256 (hex) of the first C{n} bytes of C{uri} and how many it read."""
    reader = R.Reader(uri)
    h = hashlib.sha256()
    got = 0
    try:
        while got < n:
            b = reader.read_at(got, min(_CHUNK, n - got))
            if not b:
                break
            h.update(b)
            got += len(b)
    finally:
        reader.close()
    return h.hexdigest(), got


def digests(spark, wanted):
    """Digest C{[(name, uri, n)]} on the executors; returns C{{name: (hex, bytes read)}}."""
    if not wanted:
        return {}
    rdd = spark.sparkContext.parallelize(wanted, len(wanted))
    return dict(rdd.map(lambda w: (w[0], file_digest(w[1], w[2]))).collect())


# -- the plan -----------------------------------------------------------------------------


def plan(spark, manifest, listing):
    """Decide what to carry. C{listing} is the commit log C{[(name, uri, length)]}.

    Returns C{(carried, changed, info)}: the manifest entries carried (by name), the
    changed-segment findings C{[(segment, detail)]}, and counts for the summary."""
    have = {name: (uri, length) for name, uri, length in listing}
    oldest = min((int(n) for n in have if n.isdigit()), default=None)
    candidates, changed, removed = [], [], 0
    for s in manifest["segments"]:
        if s["name"] not in have:
            if oldest is None or s["segment"] < oldest:
                removed += 1  # retention removed it
            else:
                changed.append((s["segment"], "segment file is gone"))
            continue
        uri, length = have[s["name"]]
        if s["closed"] and length != s["length"]:
            changed.append((s["segment"], f"length {s['length']} -> {length} bytes"))
        elif length < s["proven"]:
            changed.append((s["segment"], f"shorter than the {s['proven']} bytes proven ({length})"))
        else:
            candidates.append((s["name"], uri, s["proven"]))
    sums = digests(spark, candidates)
    carried = {}
    by_name = {s["name"]: s for s in manifest["segments"]}
    for name, _, n in candidates:
        s = by_name[name]
        if sums[name][0] != s["digest"]:
            changed.append((s["segment"], f"digest of the first {n} bytes differs from the audited one"))
        elif s["closed"]:
            carried[name] = s
    info = {
        "segments_verified": len(candidates),
        "bytes_verified": sum(v[1] for v in sums.values()),
        "segments_removed": removed,
    }
    return carried, sorted(changed), info


class Carry:
    """The carried part of one audit and the merging of it with what was read.

    With no manifest (a first run, or a full audit) nothing is carried and every hook
    returns what was read, so the job has one flow; L{save} still writes the state."""

    def __init__(self, spark, root, manifest=None, gen=None, carried=None, changed=(), info=None, reason=None):
        self.spark, self.root = spark, root
        self.manifest, self.gen = manifest, gen
        self.carried = carried or {}
        self.changed = list(changed)
        self.info = dict(info or {})
        self.reason = reason
        self.parts = self.ends = self.totals = None
        self.listing = []

    @classmethod
    def open(cls, spark, root, listing, full_reason=None):
        """Load the state under C{root} and plan the carry over C{listing}. Raises
        L{StateError} when the state is damaged."""
        manifest, gen = load(spark, root)
        if manifest is None:
            c = cls(spark, root, reason="no state yet")
            c.listing = listing
            return c
        # A changed segment is a finding whether or not anything is carried.
        carried, changed, info = plan(spark, manifest, listing)
        if not full_reason and manifest.get("cq") is None:
            full_reason = "the state's run had consume-queue findings"
        if full_reason:
            carried = {}
        c = cls(spark, root, manifest, gen, carried, changed, info, full_reason)
        c.listing = listing
        return c

    @property
    def skip(self):
        """The segment file names not to decode."""
        return frozenset(self.carried)

    def _old(self, part):
        df = self.spark.read.parquet(f"{self.gen}/parts/{part}")
        starts = [s["segment"] for s in self.carried.values()]
        return df.where(F.col("segment").isin(starts))

    # -- parts of what was read ----------------------------------------------------------

    def absorb(self, items, recs):
        """Compute the per-segment parts of the segments read, and with the carried
        ones the parts of the whole log (C{self.parts}, DataFrames by name)."""
        msgs = T.messages(recs)
        new = {
            "queue": T.queue_stats(recs, by=("segment",)).drop("per_minute"),
            "throughput": T.throughput(recs, by=("segment",)),
            "runs": items.where(F.col("kind") == "run").select(
                "segment", F.col("event_id").alias("start"), F.col("run_end").alias("end"),
                F.col("seg_records").alias("copies")),
            "admin": recs.where(F.col("magic") == "admin"),
            "fired": msgs.where(F.col("delay_id").isNotNull()).groupBy("segment", "topic", "delay_id").agg(
                F.count("*").alias("fired")),
            "lag": charts.lag_parts(recs),
        }  # fmt: skip
        if self.carried:
            new = {k: df.unionByName(self._old(k)) for k, df in new.items()}
        self.parts = {k: df.persist() for k, df in new.items()}
        return self.parts

    def segment_totals(self, recs):
        """Per segment read: the totals the summary and the manifest need (collected:
        one row per segment)."""
        from spark.audit.summary import totals_columns

        rows = recs.groupBy("segment").agg(*totals_columns(), F.max("offset").alias("last_offset")).collect()
        out = {r["segment"]: r.asDict() for r in rows}
        for s in self.carried.values():
            out[s["segment"]] = dict(s["totals"], segment=s["segment"])
        return out

    def segments(self, segs):
        """The segment rows read plus the carried ones, in offset order."""
        keys = ("segment", "file_length", "records", "records_end", "sealed", "declared_segment_size")
        carried = [{"segment": s["segment"], "file_length": s["length"], "records": s["records"],
                    "records_end": s["records_end"], "sealed": s["sealed"],
                    "declared_segment_size": s.get("declared_segment_size")}
                   for s in self.carried.values()]  # fmt: skip
        return sorted([{k: r[k] for k in keys} for r in segs] + carried, key=lambda r: r["segment"])

    # -- the whole log's tables -----------------------------------------------------------

    def queue_stats(self):
        """L{transforms.queue_stats} of the whole log, merged from the parts."""
        q = self.parts["queue"].groupBy("topic", "queue_id").agg(
            *[f(c).alias(c) for c, f in _QUEUE_MERGE.items()]
        )
        return T.with_per_minute(q)

    def throughput(self):
        """L{transforms.throughput} of the whole log, merged from the parts."""
        return self.parts["throughput"].groupBy("topic", "minute").agg(
            F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes")
        )

    def runs(self):
        """L{transforms.event_runs} of the whole log."""
        return self.parts["runs"].select("start", "end", "copies")

    def check_duplicates(self, intervals):
        """Raise L{FullAudit} when an eventId held twice lies in a carried segment: its
        records are needed to list the copies."""
        if not self.carried:
            return
        iv = intervals.collect()
        if not iv:
            return
        runs = self._old("runs").collect()
        for lo, hi in iv:
            if any(r["start"] <= hi and r["end"] >= lo for r in runs):
                raise FullAudit(f"eventIds {lo}-{hi} are held twice, some in a carried segment")

    def skeleton(self, recs):
        """C{recs} plus, for the carried segments, their admin records, one message row
        per topic, and one message row per fired delayed message: what
        L{transforms.topics_from_log} and L{transforms.delays} read."""
        if not self.carried:
            return recs
        null = {c: F.lit(None) for c in T.RECORD_COLUMNS}
        cols = recs.schema

        def rows(df, **given):
            return df.select(*[(given.get(c, null[c])).cast(cols[c].dataType).alias(c) for c in T.RECORD_COLUMNS])

        admin = self._old("admin").select(*T.RECORD_COLUMNS)
        topics = rows(self._old("queue").select("segment", "topic").distinct(), segment=F.col("segment"),
                      topic=F.col("topic"), magic=F.lit("message"))  # fmt: skip
        fired = self._old("fired").withColumn("n", F.explode(F.sequence(F.lit(1), F.col("fired"))))
        fired = rows(fired, segment=F.col("segment"), topic=F.col("topic"), magic=F.lit("message"),
                     delay_id=F.col("delay_id"))  # fmt: skip
        return recs.unionByName(admin).unionByName(topics).unionByName(fired)

    def check_topics(self, topics):
        """Raise L{FullAudit} when a topic the state knew was created again since: its
        records in the carried segments no longer belong in its queues."""
        known = self.manifest["cq"].get("topics", {})
        for r in topics.select("topic", "create_event_id").collect():
            if r["topic"] in known and known[r["topic"]] != r["create_event_id"]:
                raise FullAudit(f"topic {r['topic']} was created again (eventId {r['create_event_id']})")

    # -- consume queues -------------------------------------------------------------------

    def cq_lows(self, recs):
        """Per queue: the lowest queue offset to read. Entries below the state's
        checked count that point into carried segments were checked already; below
        that the records read need their entries too."""
        if not self.carried:
            return None
        checked = self.manifest["cq"].get("checked", {})
        low = {(t, int(q)): n for t, qs in checked.items() for q, n in qs.items()}
        for r in T.messages(recs).groupBy("topic", "queue_id").agg(F.min("queue_offset").alias("m")).collect():
            key = (r["topic"], r["queue_id"])
            low[key] = min(low.get(key, 0), r["m"]) if key in low else 0
        return low

    def cq_entries(self, cq):
        """Drop the entries already checked: below the state's checked count and
        pointing into a carried segment."""
        if not self.carried:
            return cq
        checked = [(t, int(q), int(n)) for t, qs in self.manifest["cq"].get("checked", {}).items() for q, n in qs.items()]
        spans = [(s["segment"], s["segment"] + s["length"]) for s in self.carried.values()]
        spark = self.spark
        ck = F.broadcast(spark.createDataFrame(checked, "topic string, queue_id int, checked bigint"))
        sp = F.broadcast(spark.createDataFrame(spans, "lo bigint, hi bigint"))
        old = (
            cq.join(ck, ["topic", "queue_id"])
            .where(F.col("queue_offset") < F.col("checked"))
            .join(sp, (F.col("log_offset") >= F.col("lo")) & (F.col("log_offset") < F.col("hi")), "left_semi")
            .select(*cq.columns)
        )  # fmt: skip
        return cq.join(old, ["topic", "queue_id", "queue_offset"], "left_anti")

    def queue_ends(self, ends):
        """L{transforms.queue_ends} with the carried queue lengths."""
        if not self.carried:
            return ends
        rows = [(t, int(q), int(n)) for t, qs in self.manifest["cq"].get("checked", {}).items() for q, n in qs.items()]
        old = self.spark.createDataFrame(rows, "topic string, queue_id int, max_offset bigint")
        return ends.unionByName(old).groupBy("topic", "queue_id").agg(F.max("max_offset").alias("max_offset"))

    # -- the summary and saving -----------------------------------------------------------

    def changed_problems(self):
        """The changed-segment findings as rows of the C{problems} table."""
        rows = [(seg, seg, None, "changed", detail, None, None) for seg, detail in self.changed]
        ddl = "segment bigint, offset bigint, bytes int, problem string, detail string, event_id bigint, topic string"
        return self.spark.createDataFrame(rows, ddl)

    def summary(self, segs, skipped_bytes=0):
        """The C{incremental} part of the summary: what was read, carried, verified."""
        carried = set(self.carried)
        read = [s for s in segs if f"{s['segment']:020d}" not in carried]
        return {
            "state_dir": self.root,
            "mode": "incremental" if self.carried else "full",
            "full_reason": self.reason,
            "segments_read": len(read),
            "bytes_read": sum(s["file_length"] for s in read),
            "segments_carried": len(carried),
            "bytes_carried": sum(s["length"] for s in self.carried.values()),
            "segments_verified": self.info.get("segments_verified", 0),
            "bytes_verified": self.info.get("bytes_verified", 0),
            "segments_removed": self.info.get("segments_removed", 0),
            "changed_segments": [{"segment": s, "detail": d} for s, d in self.changed],
        }

    def save_run(self, tables, facts, summary):
        """L{save} after a completed run of the job (C{tables}, C{facts}, C{summary} as
        the job has them)."""
        bad = tables["problems"].where(F.col("segment").isNotNull()).select("segment").distinct().collect()
        integ = summary["integrity"]
        cq_ok = not any(integ[k] for k in ("cq_missing", "cq_extra", "cq_wrong", "cq_torn_files"))
        cq_state = None
        if cq_ok and self.ends is not None:
            cq_state = {}
            for r in self.ends.collect():
                cq_state.setdefault(r["topic"], {})[str(r["queue_id"])] = r["max_offset"]
        topics = {r["topic"]: r["create_event_id"] for r in tables["topics"].select("topic", "create_event_id").collect()}
        return self.save(facts["segments"], self.totals, {r["segment"] for r in bad}, cq_state, topics)

    def save(self, segs, totals, problem_segments, cq_state, topics):
        """Write the new state: the parts and a manifest of the segments proven clean
        (digesting the ones read this time).

        C{segs}: the whole log's segment rows; C{totals}: L{segment_totals};
        C{problem_segments}: segments with any problem (not carried next time);
        C{cq_state}: C{{topic: {queue: entries checked}}} or None after consume-queue
        findings; C{topics}: C{{topic: create_event_id}}."""
        uris = {name: uri for name, uri, _ in self.listing}
        last = max((s["segment"] for s in segs), default=None)
        entries, to_digest = [], []
        for s in segs:
            name = f"{s['segment']:020d}"
            if s["segment"] in problem_segments or name not in uris or s["segment"] not in totals:
                continue
            if name in self.carried:
                entries.append(self.carried[name])
                continue
            closed = bool(s["sealed"]) or s["segment"] != last
            proven = s["file_length"] if closed else s["records_end"] - s["segment"]
            entries.append({
                "segment": s["segment"], "name": name, "length": s["file_length"], "proven": proven,
                "closed": closed, "records": s["records"], "records_end": s["records_end"],
                "sealed": bool(s["sealed"]), "declared_segment_size": s["declared_segment_size"],
                "totals": {k: v for k, v in totals[s["segment"]].items() if k != "segment"}, "digest": None,
            })  # fmt: skip
            to_digest.append((name, uris[name], proven))
        sums = digests(self.spark, to_digest)
        for e in entries:
            if e["digest"] is None:
                e["digest"] = sums[e["name"]][0]
        gen = f"{self.root.rstrip('/')}/gen-{int(time.time() * 1000)}"
        keep = [e["segment"] for e in entries]
        for name, df in self.parts.items():
            df.where(F.col("segment").isin(keep)).write.mode("overwrite").parquet(f"{gen}/parts/{name}")
        manifest = {
            "version": VERSION, "written_ms": int(time.time() * 1000), "segments": entries,
            "cq": None if cq_state is None else {"checked": cq_state, "topics": topics},
        }  # fmt: skip
        _write_atomically(self.spark, f"{gen}/{MANIFEST}", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        name = gen.rsplit("/", 1)[1]
        for old in _generations(self.spark, self.root):
            if old.rstrip("/").rsplit("/", 1)[1] != name:
                _delete(self.spark, old)
        return {"digested_segments": len(to_digest), "bytes_digested": sum(v[1] for v in sums.values())}


def merge_totals(parts):
    """Merge per-segment totals (dicts) into the log's totals."""
    out = {}
    for k, f in _TOTALS_MERGE.items():
        vals = [p[k] for p in parts if p.get(k) is not None]
        out[k] = f(vals) if vals else (0 if f is sum else None)
    return out


def cq_file_wanted(low, topic, queue, name, length):
    """Whether the consume-queue file C{name} (its first entry's byte offset) of length
    C{length} holds an entry at or above C{low[(topic, queue)]} (always, without C{low})."""
    if low is None:
        return True
    try:
        floor = low.get((topic, int(queue)), 0)
        end = int(name) // fmt.CQ_ENTRY_SIZE + -(-length // fmt.CQ_ENTRY_SIZE)
    except ValueError:
        return True
    return end > floor
