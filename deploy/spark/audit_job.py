"""The audit's entry point for ``spark-submit``: ``checker.audit.cli.main`` with its arguments.

spark-submit runs a file; this one imports the installed package (``pip install
'kafka-outbox[audit]'`` in the Python that ``PYSPARK_DRIVER_PYTHON`` or ``PYSPARK_PYTHON`` names;
spark-submit falls back to ``python3`` on PATH). Arguments and exit codes: docs/audit.md.

A driver Python without the package exits 2 (usage or configuration) with the fix: the
traceback's exit code, 1, would read as "violations found".
"""

from __future__ import annotations

import sys

#: The audit's exit code for bad usage or configuration (checker.audit.cli.EXIT_USAGE).
EXIT_USAGE = 2

if __name__ == "__main__":
    try:
        from checker.audit.cli import main
    except ImportError as err:
        print(
            f"audit: {sys.executable} cannot import the audit ({err}): pip install "
            "'kafka-outbox[audit]' there, or point PYSPARK_PYTHON (or PYSPARK_DRIVER_PYTHON) at "
            "a Python that has it",
            file=sys.stderr,
        )
        sys.exit(EXIT_USAGE)
    sys.exit(main(sys.argv[1:]))
