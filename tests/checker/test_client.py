"""The check client against endpoints that answer something other than a check reply.

Each one must count as not answering (fail over to the next instance, else NoAnswer): any other
exception would escape the checker's worker threads and stop the checker for every group.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from checker.client import CheckClient, NoAnswer
from outbox.protocol import new_transaction_id
from outbox.protocol.check import CheckedTransaction
from outbox.protocol.registry import Registration
from outbox.protocol.states import LocalTransactionState

TXN = new_transaction_id()
ASKED = [CheckedTransaction(TXN)]


def http(status: str, body: bytes, *, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (
        f"HTTP/1.1 {status}\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n".encode() + body
    )


class CannedEndpoint:
    """A TCP server that reads one request and writes ``reply`` byte for byte, then closes."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests += 1
                conn.sendall(self.reply)

    def registration(self, instance: str) -> Registration:
        return Registration("g", instance, self.url, "test")

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def good() -> Iterator[CannedEndpoint]:
    endpoint = CannedEndpoint(http("200 OK", f'{{"states": {{"{TXN}": "COMMIT"}}}}'.encode()))
    yield endpoint
    endpoint.close()


GARBAGE = {
    "a JSON list": (http("200 OK", b"[]"), "no \"states\" object: b'[]'"),
    "JSON null": (http("200 OK", b"null"), 'no "states" object'),
    "states as a list": (http("200 OK", b'{"states": []}'), 'no "states" object'),
    "not JSON": (http("200 OK", b"<html>bad gateway</html>"), "not JSON"),
    "the transaction left out": (http("200 OK", b'{"states": {}}'), f"{TXN} is missing"),
    "an unknown state": (
        http("200 OK", f'{{"states": {{"{TXN}": "MAYBE"}}}}'.encode()),
        "the state 'MAYBE', not one of COMMIT, ROLLBACK, UNKNOWN",
    ),
    "a state that is no string": (
        http("200 OK", f'{{"states": {{"{TXN}": ["COMMIT"]}}}}'.encode()),
        "the state ['COMMIT']",
    ),
    "an error status": (http("500 Internal Server Error", b"boom"), "500"),
    "another protocol on the port": (b"SSH-2.0-OpenSSH_9.2\r\n", "SSH-2.0"),
    "a cut-off body": (http("200 OK", b'{"sta', length=100), "IncompleteRead"),
}


@pytest.mark.parametrize("reply, message", GARBAGE.values(), ids=GARBAGE.keys())
def test_a_reply_that_is_no_check_answer_counts_as_no_answer_and_fails_over(
    reply: bytes, message: str, good: CannedEndpoint
) -> None:
    bad = CannedEndpoint(reply)
    client = CheckClient(secret=None, timeout_s=5)
    try:
        # Given only that instance, the client says no one answered, naming it and why
        with pytest.raises(NoAnswer) as raised:
            client.check([bad.registration("bad")], ASKED)
        assert raised.value.asked
        assert bad.url in str(raised.value) and message in str(raised.value)
        # With a good instance after it, the good one's answer is taken
        answer = client.check([bad.registration("bad"), good.registration("good")], ASKED)
        assert answer == {TXN: LocalTransactionState.COMMIT}
        assert bad.requests == 2 and good.requests == 1
    finally:
        bad.close()
