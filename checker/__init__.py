"""The checker service (and, later, the Spark audit jobs)."""

from __future__ import annotations

from checker.checker import Checker
from checker.settings import CheckerSettings

__all__ = ["Checker", "CheckerSettings"]
