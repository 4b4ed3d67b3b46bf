"""Asking producer instances about transactions: signed batch requests, with fail-over."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence

from outbox.checks import CHECK_PATH
from outbox.checks.auth import sign
from outbox.protocol.registry import Registration
from outbox.protocol.states import LocalTransactionState

log = logging.getLogger("checker")


class NoAnswer(Exception):
    """No instance of the group answered: ``asked`` is False when none was live to ask."""

    def __init__(self, message: str, *, asked: bool = True) -> None:
        super().__init__(message)
        self.asked = asked


class CheckClient:
    def __init__(self, secret: bytes | None, timeout_s: float) -> None:
        self.secret = secret
        self.timeout_s = timeout_s

    def check(
        self, instances: Sequence[Registration], txn_ids: Sequence[str]
    ) -> dict[str, LocalTransactionState]:
        """Ask the first instance, failing over to the next on error or timeout.

        Raises:
            NoAnswer: every instance failed (or there were none).
        """
        errors = []
        for instance in instances:
            try:
                return self._ask(instance, txn_ids)
            except (OSError, ValueError, KeyError) as err:
                errors.append(f"{instance.check_url}: {err}")
                log.warning(
                    "check of %d txns at %s failed: %s", len(txn_ids), instance.check_url, err
                )
        raise NoAnswer("; ".join(errors) or "no live instance")

    def _ask(
        self, instance: Registration, txn_ids: Sequence[str]
    ) -> dict[str, LocalTransactionState]:
        body = json.dumps({"txn_ids": list(txn_ids)}).encode()
        headers = {"Content-Type": "application/json"}
        if self.secret:
            headers.update(sign(self.secret, "POST", CHECK_PATH, body))
        request = urllib.request.Request(
            instance.check_url.rstrip("/") + CHECK_PATH, data=body, headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            states = json.loads(response.read())["states"]
        return {t: LocalTransactionState(states[t]) for t in txn_ids}
