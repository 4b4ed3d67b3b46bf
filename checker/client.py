"""Asking producer instances about transactions: signed batch requests, with fail-over."""

from __future__ import annotations

import http.client
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

        An instance that answers something else than a check reply (an error status, another
        service on its port, a proxy's page, a cut-off body) counts as not answering.

        Raises:
            NoAnswer: every instance failed (or there were none).
        """
        errors = []
        for instance in instances:
            try:
                return self._ask(instance, txn_ids)
            except (OSError, ValueError, http.client.HTTPException) as err:
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
            reply = response.read()
        return states_in(reply, txn_ids)


def states_in(reply: bytes, txn_ids: Sequence[str]) -> dict[str, LocalTransactionState]:
    """The state of each of ``txn_ids`` in a check endpoint's reply.

    Raises:
        ValueError: the reply is not ``{"states": {txn_id: state}}`` naming every one asked, with
            a state of :class:`LocalTransactionState`; the message quotes the reply's start.
    """
    start = reply[:120]
    try:
        document = json.loads(reply)
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"the reply is not JSON ({err}): {start!r}") from err
    states = document.get("states") if isinstance(document, dict) else None
    if not isinstance(states, dict):
        raise ValueError(f'the reply has no "states" object: {start!r}')
    missing = [t for t in txn_ids if t not in states]
    if missing:
        raise ValueError(
            f"the reply names {len(txn_ids) - len(missing)} of the {len(txn_ids)} transactions "
            f"asked about; {missing[0]} is missing: {start!r}"
        )
    answer = {}
    for txn_id in txn_ids:
        try:
            answer[txn_id] = LocalTransactionState(states[txn_id])
        except ValueError:  # the enum's own refusal, whatever the value's type
            known = ", ".join(LocalTransactionState)
            raise ValueError(
                f"the reply gives {txn_id} the state {states[txn_id]!r}, not one of {known}"
            ) from None
    return answer
