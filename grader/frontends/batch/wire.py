"""The batch's wire between the parent and a zygote's wardens: one message is a JSON header and a binary payload
(a puzzle's record, record.py's bytes), each message read against a deadline."""

from __future__ import annotations

import json
import socket
import struct
import time

MAX_RECORD_MB = 64  # a puzzle's record is 0.3-5 MB; more is refused
_HEAD = struct.Struct("!IQ")


def send(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    head = json.dumps(header).encode()
    sock.sendall(_HEAD.pack(len(head), len(payload)) + head + payload)


def _exactly(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    parts, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the zygote in time")
            sock.settimeout(left)
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the zygote closed its socket")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def receive(sock: socket.socket, deadline: float | None = None) -> tuple[dict, bytes]:
    head_len, payload_len = _HEAD.unpack(_exactly(sock, _HEAD.size, deadline))
    if head_len > 1 << 20 or payload_len > (MAX_RECORD_MB + 1) << 20:
        raise EOFError("a malformed message from the zygote")
    header = json.loads(_exactly(sock, head_len, deadline))
    return header, _exactly(sock, payload_len, deadline) if payload_len else b""
