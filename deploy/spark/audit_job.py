"""The audit's entry point for ``spark-submit``: ``checker.audit.cli.main`` with its arguments.

spark-submit runs a file; this one imports the installed package (``pip install
'kafka-outbox[audit]'`` on the driver's machine). Arguments and exit codes: docs/audit.md.
"""

from __future__ import annotations

import sys

from checker.audit.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
