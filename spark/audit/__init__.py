"""The audit job: proves from the data files that nothing was lost, corrupted or diverged.

Run it with ``python -m spark.audit DATA_DIR [--compare OTHER_DIR] [--out OUT_DIR]`` or
through ``spark-submit`` (see ``docs/audit.md``).
"""
