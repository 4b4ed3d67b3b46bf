"""Every error the library raises, in one tree.

::

    OutboxError
"""

from __future__ import annotations


class OutboxError(Exception):
    """Raised for any failure of this project; catch it to catch them all."""
