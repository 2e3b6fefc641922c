"""Entry point: ``python -m spark.audit`` and the main file given to ``spark-submit``."""

import sys

from spark.audit.job import main

if __name__ == "__main__":
    sys.exit(main())
