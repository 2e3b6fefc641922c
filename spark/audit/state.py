"""Incremental audits (C{--since-state DIR}): what an audit proved, kept per segment, so
the next audit reads only new or changed segments (L{spark.audit.carry} merges the
carried part with what was read).

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
audited again in full. An open segment whose proven prefix still has its digest is
I{resumed} in the compact form: its prefix's items are carried and only the bytes after
it are decoded (the per-record form reads it again whole). The digest of the prefix is
checked by hashing it (no decoding), and the same pass hashes on to the file's end, so
the next state's digest needs no second read when the records end there.

test-case-name: tests.spark.test_incremental
"""

import hashlib
import json
import time

from pyspark.sql import functions as F

from mqserver.store import format as fmt
from spark.audit import ranges as R
from spark.audit.rows import frame

VERSION = 1
MANIFEST = "manifest.json"
#: The forms of an audit (L{spark.audit.job.audit_directory}); a state keeps the parts of
#: the form that wrote it (manifest C{form}; a manifest without one is C{RECORDS}).
COMPACT, RECORDS = "compact", "per-record"
#: The per-segment parts kept as Parquet, each with a C{segment} column: per form.
PARTS = {COMPACT: ("items",), RECORDS: ("queue", "throughput", "runs", "admin", "fired", "lag")}
_CHUNK = 8 << 20

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


def file_digest(uri, n, more=None):
    """Return the SHA-256 (hex) of the first C{n} bytes of C{uri}, how many it read, and
    with C{more} (> C{n}) the SHA-256 of the first C{more} bytes, hashed on in the same
    pass (else None)."""
    reader = R.Reader(uri)
    h = hashlib.sha256()
    got, first = 0, None
    end = max(n, more or 0)
    try:
        while got < end:
            if got == n:
                first = h.hexdigest()
            stop = n if got < n else end
            b = reader.read_at(got, min(_CHUNK, stop - got))
            if not b:
                break
            h.update(b)
            got += len(b)
    finally:
        reader.close()
    if first is None:
        return h.hexdigest(), got, None
    return first, n, h.hexdigest() if got == end else None


def digests(spark, wanted):
    """Digest C{[(name, uri, n)]} or C{[(name, uri, n, more)]} on the executors; returns
    C{{name: (hex, bytes read, hex of the first C{more} bytes or None)}}."""
    if not wanted:
        return {}
    rdd = spark.sparkContext.parallelize(wanted, len(wanted))
    return dict(rdd.map(digest_task).collect())


def digest_task(w):
    """The executors' function of L{digests}: C{(name, (hex, bytes read, hex or None))}
    of one C{(name, uri, n[, more])}, its worker settled first (L{ranges.settle_worker})."""
    R.settle_worker()
    return w[0], file_digest(*w[1:])


# -- the plan -----------------------------------------------------------------------------


def plan(spark, manifest, listing):
    """Decide what to carry. C{listing} is the commit log C{[(name, uri, length)]}.

    Returns C{(carried, changed, info, resumed)}: the manifest entries carried (by name),
    the changed-segment findings C{[(segment, detail)]}, counts for the summary, and the
    open segments whose proven prefix is intact and that grew, C{{name: (entry, length,
    SHA-256 of the whole file)}} (an open one that did not grow is carried)."""
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
            candidates.append((s["name"], uri, s["proven"], length))
    sums = digests(spark, candidates)
    carried, resumed = {}, {}
    by_name = {s["name"]: s for s in manifest["segments"]}
    for name, _, n, length in candidates:
        s = by_name[name]
        if sums[name][0] != s["digest"]:
            changed.append((s["segment"], f"digest of the first {n} bytes differs from the audited one"))
        elif s["closed"] or length == n:
            carried[name] = s
        else:
            resumed[name] = (s, length, sums[name][2])
    info = {
        "segments_verified": len(candidates),
        "bytes_verified": sum(v[1] for v in sums.values()),
        "segments_removed": removed,
    }
    return carried, sorted(changed), info, resumed


def write_generation(spark, root, entries, parts, cq, form=RECORDS):
    """Write a new generation under C{root}: the C{parts} (DataFrames or rows by name) of the
    segments of C{entries}, then the manifest (under a temporary name, renamed, saying
    the audit's C{form}), then remove the older generations."""
    gen = f"{root.rstrip('/')}/gen-{int(time.time() * 1000)}"
    keep = [e["segment"] for e in entries]
    for name, df in parts.items():
        frame(spark, df).where(F.col("segment").isin(keep)).write.mode("overwrite").parquet(f"{gen}/parts/{name}")
    manifest = {"version": VERSION, "written_ms": int(time.time() * 1000), "segments": entries, "cq": cq,
                "form": form}
    _write_atomically(spark, f"{gen}/{MANIFEST}", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    name = gen.rsplit("/", 1)[1]
    for old in _generations(spark, root):
        if old.rstrip("/").rsplit("/", 1)[1] != name:
            _delete(spark, old)


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
