"""Errors of the audit jobs, rooted in the project's tree (:mod:`outbox.errors`).

::

    OutboxError
    └── AuditError                  the audit could not give a verdict
        ├── AuditConfigError        bad arguments or settings (a ConfigurationError too): exit 2
        └── AuditSourceError        a source could not be read (Kafka, the evidence DB): exit 3

A finding is never an error: violations are data, returned as DataFrames and exit code 1.
"""

from __future__ import annotations

from outbox.errors import ConfigurationError, OutboxError


class AuditError(OutboxError):
    """Raised when the audit cannot give a verdict."""


class AuditConfigError(AuditError, ConfigurationError):
    """Raised when the audit's arguments or settings are missing, malformed or contradictory."""


class AuditSourceError(AuditError):
    """Raised when Kafka or the evidence database cannot be reached or read."""
