"""Asking producer instances about transactions: signed batch requests, with fail-over.

Each request carries the half messages it asks about (:mod:`outbox.protocol.check`), a fresh
nonce, and the id of the instance it is addressed to. An instance that refuses a request as
stale tells its own time: the request is signed again with it, once, and later requests to that
instance are signed on its clock, so a producer host whose clock is off still answers.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from outbox.checks.auth import sign
from outbox.protocol.check import (
    CHECK_PATH,
    CheckedTransaction,
    encode_request,
    endpoint_time,
    new_nonce,
    states_in,
)
from outbox.protocol.registry import Registration
from outbox.protocol.states import LocalTransactionState

log = logging.getLogger("checker")


class NoAnswer(Exception):
    """No instance of the group answered: ``asked`` is False when none was live to ask;
    ``known`` is False when which instances are live is not known (the registry unread): not
    held against the group."""

    def __init__(self, message: str, *, asked: bool = True, known: bool = True) -> None:
        super().__init__(message)
        self.asked = asked
        self.known = known


class CheckClient:
    """Sends check requests; safe to share between threads.

    Args:
        secret: the HMAC key shared with the endpoints; None sends unsigned requests.
        timeout_s: one request's timeout.
        max_request_bytes: largest request body (values that do not fit are left out, and the
            endpoint reads them back from the half topic).
    """

    def __init__(
        self, secret: bytes | None, timeout_s: float, *, max_request_bytes: int = 1024 * 1024
    ) -> None:
        self.secret = secret
        self.timeout_s = timeout_s
        self.max_request_bytes = max_request_bytes
        #: Seconds to add to this host's clock to sign for an instance (by check URL).
        self._offsets: dict[str, float] = {}
        self._lock = threading.Lock()

    def check(
        self, instances: Sequence[Registration], transactions: Sequence[CheckedTransaction]
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
                return self._ask(instance, transactions)
            except (OSError, ValueError, http.client.HTTPException) as err:
                errors.append(f"{instance.check_url}: {err}")
                log.warning(
                    "check of %d txns at %s failed: %s",
                    len(transactions),
                    instance.check_url,
                    err,
                )
        raise NoAnswer("; ".join(errors) or "no live instance")

    def _ask(
        self, instance: Registration, transactions: Sequence[CheckedTransaction]
    ) -> dict[str, LocalTransactionState]:
        body = encode_request(
            transactions,
            nonce=new_nonce(),
            instance_id=instance.instance_id,
            max_bytes=self.max_request_bytes,
        )
        txn_ids = [t.txn_id for t in transactions]
        try:
            return states_in(self._post(instance, body), txn_ids)
        except urllib.error.HTTPError as err:
            their_time = endpoint_time(err.read()) if err.code == 401 else None
            if their_time is None or self.secret is None:
                raise
            offset = their_time - time.time()
            log.warning(
                "the check endpoint %s refused a stale request: its clock is %+.0f s from "
                "ours; signing with its clock",
                instance.check_url,
                offset,
            )
            with self._lock:
                self._offsets[instance.check_url] = offset
        return states_in(self._post(instance, body), txn_ids)

    def _post(self, instance: Registration, body: bytes) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.secret:
            with self._lock:
                offset = self._offsets.get(instance.check_url, 0.0)
            headers.update(sign(self.secret, "POST", CHECK_PATH, body, now=time.time() + offset))
        request = urllib.request.Request(
            instance.check_url.rstrip("/") + CHECK_PATH, data=body, headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            reply: bytes = response.read()
        return reply
