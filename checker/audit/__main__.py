"""``python -m checker.audit`` and ``spark-submit checker/audit/__main__.py``: run one audit.

Arguments and exit codes: :mod:`checker.audit.cli`.
"""

from __future__ import annotations

import sys

from checker.audit.cli import main

if __name__ == "__main__":
    sys.exit(main())
