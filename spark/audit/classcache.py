"""The audit's class-data archive: the JVM's classes kept from one local run for the next.

A local audit starts a JVM that loads and verifies about 18,000 classes (Spark, Spark
SQL, Hadoop, Arrow) before it decodes anything. Java's application class-data sharing
(CDS, JDK 13 and later) keeps those classes, parsed and verified, in an archive the next
JVM maps instead: the first run writes it as its JVM exits
(C{-XX:ArchiveClassesAtExit}), later runs start from it (C{-XX:SharedArchiveFile}).

One archive per Java runtime and pyspark (their versions, the java binary, Spark's jars
are in its name), in C{--class-cache DIR} (default C{$XDG_CACHE_HOME/mqserver}, else
C{~/.cache/mqserver}); C{--class-cache none} turns it off. An archive is only given its
name, which holds its length, once the JVM that wrote it exited cleanly. A JVM maps an
archive cut short past its end and crashes, so one whose length is not its name's is
deleted unused; the JVM checks the rest (C{-XX:+VerifySharedSpaces}: the checksums of
its regions) and runs without an archive that fails them; and one that still fails to
start a JVM is deleted and the JVM started without it (L{ClassArchive.discard}).

test-case-name: tests.spark.test_class_cache
"""

import glob
import hashlib
import os
import shutil
import time

#: Java's first release with dynamic archives (-XX:ArchiveClassesAtExit).
MIN_JAVA = 13
#: How long the JVM may take to exit (and write the archive) after Spark stopped.
EXIT_WAIT_S = 60
#: Unfinished archives older than this are left over from a killed run.
STALE_S = 24 * 3600
#: The JVM's CDS messages (skipped classes of signed jars...) go to stdout by default,
#: where the audit prints its summary: off.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def default_dir():
    """The default cache directory: C{$XDG_CACHE_HOME/mqserver} or C{~/.cache/mqserver}."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mqserver")


def java_home():
    """The Java home the Spark launcher will use (C{$JAVA_HOME}, else the C{java} on
    C{PATH}, links resolved), or None."""
    if os.environ.get("JAVA_HOME"):
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    else:
        java = shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    return os.path.dirname(os.path.dirname(os.path.realpath(java)))


def java_release(home):
    """The C{release} file of Java home C{home} as a dict (C{JAVA_VERSION}...); empty
    when it has none."""
    out = {}
    try:
        with open(os.path.join(home, "release"), encoding="utf-8", errors="replace") as f:
            for line in f:
                key, eq, value = line.strip().partition("=")
                if eq:
                    out[key] = value.strip().strip('"')
    except OSError:
        pass
    return out


def feature_version(version):
    """The feature release of a C{JAVA_VERSION} string (C{"17.0.15"} -> 17, C{"1.8.0_402"}
    -> 8), or None."""
    parts = version.split(".")
    try:
        major = int(parts[0])
        return int(parts[1]) if major == 1 and len(parts) > 1 else major
    except ValueError:
        return None


def _spark_jars():
    import pyspark

    jars = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")
    try:
        return pyspark.__version__, sorted(os.listdir(jars))
    except OSError:
        return pyspark.__version__, []


class ClassArchive:
    """The archive of one local audit run: the JVM options that use or write it, and
    what to do once the JVM exited.

    @ivar path: the archive this run's JVM maps (None: none).
    @ivar writing: the file this run's JVM writes its archive to (None: none).
    """

    def __init__(self, path=None, writing=None):
        self.path = path
        self.writing = writing

    @classmethod
    def find(cls, directory):
        """The archive for this Java and pyspark in C{directory} (C{"none"}: none): the
        one to map, or else the file to write one to."""
        if directory in (None, "", "none"):
            return cls()
        home = java_home()
        release = java_release(home) if home else {}
        feature = feature_version(release.get("JAVA_VERSION", ""))
        if feature is None or feature < MIN_JAVA:
            return cls()
        spark_version, jars = _spark_jars()
        key = hashlib.sha256("\n".join(
            [home, release.get("JAVA_RUNTIME_VERSION", release["JAVA_VERSION"]), spark_version, *jars]
        ).encode()).hexdigest()[:16]  # fmt: skip
        prefix = os.path.join(os.path.abspath(directory), f"audit-jvm-{key}")
        found = None
        for path in sorted(glob.glob(glob.escape(prefix) + "-*.jsa")):
            if found is None and _whole(path, prefix):
                found = path
            else:  # cut short, or a second one from a concurrent first run
                _unlink(path)
        if found:
            return cls(path=found)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError:
            return cls()
        if not os.access(directory, os.W_OK):
            return cls()
        _remove_stale(directory)
        return cls(writing=f"{prefix}.{os.getpid()}.tmp")

    def options(self):
        """The JVM options for this run (a leading space; empty without an archive)."""
        if self.writing:
            return f" -XX:ArchiveClassesAtExit={self.writing} {QUIET}"
        if self.path is None:
            return ""
        # A JVM that still fails on the archive writes its crash report here, not in the
        # user's working directory.
        crash = os.path.join(os.path.dirname(self.path), "hs_err_pid%p.log")
        return f" -XX:SharedArchiveFile={self.path} -XX:+VerifySharedSpaces -XX:ErrorFile={crash} {QUIET}"

    def discard(self):
        """The JVM did not start with the archive: delete it, run without one."""
        if self.path is not None:
            _unlink(self.path)
        self.path = self.writing = None

    def finish(self, proc, wait_s=EXIT_WAIT_S):
        """After Spark stopped: let the JVM C{proc} (a C{Popen}, or None) exit and, when
        this run wrote an archive and the JVM exited cleanly, give it its name. Returns
        the archive's path, or None."""
        tmp = self.writing
        if not tmp:
            return None
        done = None
        try:
            if proc is not None:
                # The gateway JVM exits when its stdin closes; it writes the archive then.
                if proc.stdin is not None:
                    proc.stdin.close()
                size = os.path.getsize(tmp) if proc.wait(wait_s) == 0 else 0
                if size:
                    done = f"{tmp.rsplit('.', 2)[0]}-{size}.jsa"  # PREFIX.PID.tmp -> PREFIX-SIZE.jsa
                    os.replace(tmp, done)
        except Exception:  # noqa: BLE001 - no archive this time; the audit's result stands
            done = None
        finally:
            if done is None:
                _unlink(tmp)
        return done


def _whole(path, prefix):
    # The archive's length is the number its name ends with.
    try:
        return int(path[len(prefix) + 1:-len(".jsa")]) == os.path.getsize(path)
    except (ValueError, OSError):
        return False


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_stale(directory):
    # Archives a killed run never finished.
    now = time.time()
    for path in glob.glob(os.path.join(glob.escape(directory), "audit-jvm-*.tmp")):
        try:
            stale = now - os.path.getmtime(path) > STALE_S
        except OSError:
            continue
        if stale:
            _unlink(path)
