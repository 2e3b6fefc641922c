"""The carried part of an incremental audit (C{--since-state}), merged with what was read
into the whole log's tables; the state on disk is L{spark.audit.state}.

test-case-name: tests.spark.test_incremental
"""

from pyspark.sql import functions as F

from spark.audit import charts
from spark.audit import rows as RW
from spark.audit import state as st
from spark.audit import transforms as T


class Carry:
    """The carried part of one audit and the merging of it with what was read.

    With no manifest (a first run, or a full audit) nothing is carried and every hook
    returns what was read, so the job has one flow; L{save} still writes the state."""

    def __init__(self, spark, root, manifest=None, gen=None, carried=None, changed=(), info=None, reason=None,
                 form=st.RECORDS):
        self.spark, self.root, self.form = spark, root, form
        self.manifest, self.gen = manifest, gen
        self.carried = carried or {}
        #: open segments resumed after their proven prefix (the compact form):
        #: name -> (manifest entry, file length, SHA-256 of the whole file or None)
        self.resumed = {}
        self.changed = list(changed)
        self.info = dict(info or {})
        self.reason = reason
        self.parts = self.ends = self.totals = None
        self.listing = []

    @classmethod
    def open(cls, spark, root, listing, full_reason=None, form=st.RECORDS):
        """Load the state under C{root} and plan the carry over C{listing} for an audit
        in C{form} (L{st.COMPACT} or L{st.RECORDS}: the parts a state keeps are those
        of the form that wrote it). Raises L{StateError} when the state is damaged."""
        manifest, gen = st.load(spark, root)
        if manifest is None:
            c = cls(spark, root, reason="no state yet", form=form)
            c.listing = listing
            return c
        # A changed segment is a finding whether or not anything is carried.
        carried, changed, info, resumed = st.plan(spark, manifest, listing)
        if not full_reason and manifest.get("cq") is None:
            full_reason = "the state's run had consume-queue findings"
        kept = manifest.get("form", st.RECORDS)
        if not full_reason and kept != form:
            full_reason = f"the state holds the parts of the {kept} form, this audit runs in the {form} form"
        if full_reason:
            carried, resumed = {}, {}
        c = cls(spark, root, manifest, gen, carried, changed, info, full_reason, form)
        if form == st.COMPACT:
            c.resumed = resumed
        c.listing = listing
        return c

    @property
    def skip(self):
        """The segment file names not to decode."""
        return frozenset(self.carried)

    @property
    def resume(self):
        """C{{segment file name: (offset to decode from, records before it, CRC-32 of
        the bytes before it)}} of the resumed open segments."""
        return {name: (e["proven"], e["records"], e.get("crc32")) for name, (e, _, _) in self.resumed.items()}

    def _old(self, part, resumed=False):
        df = self.spark.read.parquet(f"{self.gen}/parts/{part}")
        starts = [s["segment"] for s in self.carried.values()]
        if resumed:
            starts += [e["segment"] for e, _, _ in self.resumed.values()]
        return df.where(F.col("segment").isin(starts))

    # -- the compact form: the carried segments' items ------------------------------------

    def absorb_items(self, items):
        """The compact form's C{items} (dicts: what was read) with the items of the
        carried segments (their partial aggregates, eventId runs, segment rows and the
        records checked one by one), so every table and check of the compact form covers
        the whole log; the result is also the part the state keeps."""
        from spark.audit.records import ITEM_DDL

        if self.carried or self.resumed:
            old = self._old("items", resumed=True)
            if self.resumed:  # a resumed segment's row is the one read, its records merged
                mine = [e["segment"] for e, _, _ in self.resumed.values()]
                old = old.where(~((F.col("kind") == "segment") & F.col("segment").isin(mine)))
            names = RW.ddl_names(ITEM_DDL)
            items = items + [{c: r[c] for c in names} for r in old.select(*names).collect()]
        self.parts = {"items": RW.Rows(ITEM_DDL, items)}
        return items

    def need_records(self, what):
        """Raise L{FullAudit} when a check of the compact form needs the records (C{what}
        it found) and some segments were carried, not decoded."""
        if self.carried or self.resumed:
            raise st.FullAudit(f"{what}: the check needs the records of every segment")

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
        keys = ("segment", "file_length", "records", "records_end", "sealed", "declared_segment_size", "crc32",
                "first_event_id", "last_event_id")
        carried = [{"segment": s["segment"], "file_length": s["length"], "records": s["records"],
                    "records_end": s["records_end"], "sealed": s["sealed"],
                    "declared_segment_size": s.get("declared_segment_size"), "crc32": s.get("crc32"),
                    "first_event_id": s["totals"].get("first_event_id"),
                    "last_event_id": s["totals"].get("last_event_id")}
                   for s in self.carried.values()]  # fmt: skip
        return sorted([{k: r[k] for k in keys} for r in segs] + carried, key=lambda r: r["segment"])

    # -- the whole log's tables -----------------------------------------------------------

    def queue_stats(self):
        """L{transforms.queue_stats} of the whole log, merged from the parts."""
        q = self.parts["queue"].groupBy("topic", "queue_id").agg(
            *T.queue_stats_columns("parts", named=True)
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
        """Raise L{FullAudit} when an eventId held twice (C{intervals}: C{[(lo, hi)]})
        lies in a carried segment: its records are needed to list the copies."""
        if not self.carried or not intervals:
            return
        runs = self._old("runs").collect()
        for lo, hi in intervals:
            if any(r["start"] <= hi and r["end"] >= lo for r in runs):
                raise st.FullAudit(f"eventIds {lo}-{hi} are held twice, some in a carried segment")

    def skeleton(self, recs):
        """C{recs} plus, for the carried segments, their admin records, one message row
        per topic, and one message row per fired delayed message: what
        L{transforms.topics_from_log}, L{transforms.logged_delays} and
        L{transforms.fired_counts} read."""
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
        records in the carried segments no longer belong in its queues. In the compact
        form also when it was deleted: the carried signatures still expect its entries."""
        known = self.manifest["cq"].get("topics", {})
        now = {r["topic"]: r["create_event_id"] for r in RW.dicts(topics)}
        for topic, created in now.items():
            if topic in known and known[topic] != created:
                raise st.FullAudit(f"topic {topic} was created again (eventId {created})")
        gone = sorted(set(known) - set(now))
        if self.form == st.COMPACT and gone:
            raise st.FullAudit(f"topic {gone[0]} was deleted")

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

    def changed_rows(self):
        """The changed-segment findings as rows (dicts) of the C{problems} table."""
        return [{"segment": seg, "offset": seg, "problem": "changed", "detail": detail} for seg, detail in self.changed]

    def changed_problems(self):
        """L{changed_rows} as a DataFrame."""
        from spark.audit.checks import PROBLEMS_DDL

        return RW.Rows(PROBLEMS_DDL, self.changed_rows()).frame(self.spark)

    def summary(self, segs, skipped_bytes=0):
        """The C{incremental} part of the summary: what was read, carried, verified."""
        carried = set(self.carried)
        read = [s for s in segs if f"{s['segment']:020d}" not in carried]
        resume = self.resume
        return {
            "state_dir": self.root,
            "mode": "incremental" if self.carried or self.resumed else "full",
            "full_reason": self.reason,
            "segments_read": len(read),
            "bytes_read": sum(s["file_length"] - resume.get(f"{s['segment']:020d}", (0, 0))[0] for s in read),
            "segments_resumed": len(resume),
            "bytes_resumed_after": sum(v[0] for v in resume.values()),
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
        bad = RW.values(RW.where(tables["problems"], "segment", "set"), "segment")
        integ = summary["integrity"]
        cq_ok = not any(integ[k] for k in ("cq_missing", "cq_extra", "cq_wrong", "cq_torn_files"))
        cq_state = None
        if cq_ok and self.ends is not None:
            cq_state = {}
            for r in RW.dicts(self.ends):
                cq_state.setdefault(r["topic"], {})[str(r["queue_id"])] = r["max_offset"]
        topics = {r["topic"]: r["create_event_id"] for r in RW.dicts(tables["topics"])}
        return self.save(facts["segments"], self.totals, bad, cq_state, topics)

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
            _, length, whole = self.resumed.get(name, (None, None, None))
            known = whole if whole is not None and proven == length == s["file_length"] else None
            entries.append({
                "segment": s["segment"], "name": name, "length": s["file_length"], "proven": proven,
                "closed": closed, "records": s["records"], "records_end": s["records_end"],
                "sealed": bool(s["sealed"]), "declared_segment_size": s["declared_segment_size"],
                "crc32": s.get("crc32"),
                "totals": {k: v for k, v in totals[s["segment"]].items() if k != "segment"}, "digest": known,
            })  # fmt: skip
            if known is None:  # a resumed segment's was hashed on when its prefix was checked
                to_digest.append((name, uris[name], proven))
        sums = st.digests(self.spark, to_digest)
        for e in entries:
            if e["digest"] is None:
                e["digest"] = sums[e["name"]][0]
        cq = None if cq_state is None else {"checked": cq_state, "topics": topics}
        st.write_generation(self.spark, self.root, entries, self.parts, cq, self.form)
        return {"digested_segments": len(to_digest), "bytes_digested": sum(v[1] for v in sums.values())}
