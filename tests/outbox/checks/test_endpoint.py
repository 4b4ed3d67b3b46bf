"""The check endpoint over real HTTP: signed batches answered; everything else refused untouched."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence

import pytest
import sqlalchemy as sa

from outbox.checks import CHECK_PATH
from outbox.checks.auth import HEADER_SIGNATURE, HEADER_TIMESTAMP, sign, signature
from outbox.checks.handler import CheckSettings
from outbox.checks.resolver import FencedResolver
from outbox.checks.server import CheckServer
from outbox.errors import ConfigurationError
from outbox.protocol import LocalTransactionState, new_transaction_id
from outbox.protocol.check import CheckedTransaction
from tests.producer_fixtures import evidence_ids

pytestmark = pytest.mark.integration
SECRET = b"s3cret"


class CountingResolver:
    """The fenced resolver, counting the calls that reach the database."""

    def __init__(self, inner: FencedResolver) -> None:
        self.inner = inner
        self.calls = 0

    def resolve(self, checks: Sequence[CheckedTransaction]) -> dict[str, LocalTransactionState]:
        self.calls += 1
        return self.inner.resolve(checks)


@pytest.fixture
def resolver(engine: sa.Engine) -> CountingResolver:
    return CountingResolver(FencedResolver(engine, "orders", lock_timeout_s=1))


@pytest.fixture
def server(resolver: CountingResolver) -> Iterator[CheckServer]:
    settings = CheckSettings(secret=SECRET, max_body_bytes=4096, max_batch=5)
    running = CheckServer(settings, resolver, "127.0.0.1", 0)
    yield running
    running.close()


def post(server: CheckServer, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(
        server.url + CHECK_PATH, data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def signed(body: bytes) -> dict[str, str]:
    return sign(SECRET, "POST", CHECK_PATH, body)


def test_a_signed_batch_gets_an_answer_per_id_and_unknown_ids_are_fenced(
    server: CheckServer, engine: sa.Engine
) -> None:
    ids = [new_transaction_id() for _ in range(3)]
    body = json.dumps({"txn_ids": ids}).encode()
    status, answer = post(server, body, signed(body))
    assert status == 200
    assert answer == {"states": {t: "ROLLBACK" for t in ids}}
    assert all(evidence_ids(engine)[t] == "fence" for t in ids)


def _bad_requests() -> dict[str, tuple[bytes, dict[str, str] | None, int, str]]:
    """Built when a test runs, not at collection: signed headers carry a timestamp, and a run
    of the suite takes longer than the allowed clock skew."""
    good = json.dumps({"txn_ids": [new_transaction_id()]}).encode()
    stale_ts = str(int(time.time()) - 3600)
    too_many = json.dumps({"txn_ids": [new_transaction_id() for _ in range(6)]}).encode()
    return {
        "missing signature": (good, {}, 401, "missing"),
        "wrong signature": (good, {**signed(good), HEADER_SIGNATURE: "0" * 64}, 401, "wrong"),
        "wrong secret": (good, sign(b"other", "POST", CHECK_PATH, good), 401, "wrong"),
        "stale": (
            good,
            {
                HEADER_TIMESTAMP: stale_ts,
                HEADER_SIGNATURE: signature(SECRET, "POST", CHECK_PATH, stale_ts, good),
            },
            401,
            "stale",
        ),
        "too large": (b"x" * 5000, {}, 413, "over the limit"),
        "not json": (b"{nope", None, 400, "not JSON"),
        "no txn_ids": (b'{"ids": []}', None, 400, "txn_ids"),
        "bad id": (b'{"txn_ids": ["42"]}', None, 400, "txn_ids[0]"),
        "too many": (too_many, None, 400, "batch limit of 5"),
    }


@pytest.mark.parametrize("case", list(_bad_requests()))
def test_bad_requests_get_their_status_and_change_nothing(
    server: CheckServer, resolver: CountingResolver, engine: sa.Engine, case: str
) -> None:
    body, headers, status, message = _bad_requests()[case]
    before = evidence_ids(engine)
    got, answer = post(server, body, signed(body) if headers is None else headers)
    assert got == status
    assert message in answer["error"]
    assert resolver.calls == 0
    assert evidence_ids(engine) == before


def test_a_check_server_without_a_secret_refuses_to_start() -> None:
    with pytest.raises(ConfigurationError, match="needs the secret it shares"):
        CheckSettings()
    assert CheckSettings(insecure_local=True).secret is None


def test_a_replayed_request_is_refused_without_touching_the_database(
    server: CheckServer, resolver: CountingResolver, engine: sa.Engine
) -> None:
    ids = [new_transaction_id()]
    body = json.dumps({"txn_ids": ids, "nonce": "n-1"}).encode()
    headers = signed(body)
    assert post(server, body, headers)[0] == 200
    before = evidence_ids(engine)
    status, answer = post(server, body, headers)
    assert (status, answer["error"]) == (401, "replayed request: this signature was already used")
    assert resolver.calls == 1 and evidence_ids(engine) == before
    # the same transactions asked again in a new request (a new nonce) are answered
    again = json.dumps({"txn_ids": ids, "nonce": "n-2"}).encode()
    assert post(server, again, signed(again)) == (200, {"states": {ids[0]: "ROLLBACK"}})


def test_a_stale_refusal_tells_the_endpoints_clock_and_a_request_on_it_is_answered(
    server: CheckServer,
) -> None:
    body = json.dumps({"txn_ids": [new_transaction_id()]}).encode()
    late = sign(SECRET, "POST", CHECK_PATH, body, now=time.time() - 3600)
    status, answer = post(server, body, late)
    assert status == 401 and "stale" in answer["error"]
    assert abs(answer["time"] - time.time()) < 5
    on_their_clock = sign(SECRET, "POST", CHECK_PATH, body, now=answer["time"])
    assert post(server, body, on_their_clock)[0] == 200


def test_a_request_addressed_to_another_instance_is_refused(resolver: CountingResolver) -> None:
    settings = CheckSettings(secret=SECRET)
    running = CheckServer(settings, resolver, "127.0.0.1", 0, instance_id="instance-a")
    try:
        for addressed, status in (("instance-b", 421), ("instance-a", 200)):
            body = json.dumps(
                {"txn_ids": [new_transaction_id()], "instance_id": addressed}
            ).encode()
            assert post(running, body, signed(body))[0] == status
        assert resolver.calls == 1
    finally:
        running.close()
