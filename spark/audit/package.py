"""Build the zip that ships the audit's Python code to Spark executors (``--py-files``).

It holds the ``spark`` package, the storage format modules (``mqserver/store/format.py``
and the ``mqserver/layout.py`` it derives its struct layouts with, and
``mqserver/speedups.py``, which finds no C hash in the zip, so the executors run the
Python one) with their two package markers (``mqserver/__init__.py``,
``mqserver/store/__init__.py``; nothing else of the core, so no Twisted), and
``construct``, the format module's only dependency, so the executors need nothing but
Python and pyspark.

``python -m spark.audit.package OUT.zip`` writes it for ``spark-submit``.

test-case-name: tests.unit.test_audit_records
"""

import os
import sys
import zipfile

import construct

import spark

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(spark.__file__)))
_CORE = ["mqserver/__init__.py", "mqserver/layout.py", "mqserver/store/__init__.py",
         "mqserver/store/format.py", "mqserver/speedups.py"]


def _tree(base, package_dir, arc_prefix):
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                full = os.path.join(dirpath, name)
                yield full, os.path.join(arc_prefix, os.path.relpath(full, base))


def build_pyfiles(dest):
    """Write the zip to C{dest} (a path) and return C{dest}."""
    entries = list(_tree(_ROOT, os.path.join(_ROOT, "spark"), ""))
    entries += [(os.path.join(_ROOT, p), p) for p in _CORE]
    cdir = os.path.dirname(os.path.abspath(construct.__file__))
    entries += list(_tree(os.path.dirname(cdir), cdir, ""))
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for full, arc in sorted(set(entries), key=lambda e: e[1]):
            z.write(full, arc)
    return dest


def main(argv=None):
    """Write the zip named on the command line (default C{mqserver-audit.zip})."""
    argv = sys.argv[1:] if argv is None else argv
    dest = argv[0] if argv else "mqserver-audit.zip"
    print(build_pyfiles(dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
