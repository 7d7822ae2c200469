"""The server name a TLS ClientHello asks for, read from the first bytes a client sends into a CONNECT tunnel
(the gateway peeks, it never terminates TLS): RFC 8446 §4.1.2 and §5.1 (records, handshake fragments across
records), RFC 6066 §3 (server_name).

`parse(data)` is called again as bytes arrive: it says "not yet" (None) only while `data` is a valid beginning of
a ClientHello, so a client that sends anything else is told apart at its first byte.
"""

from __future__ import annotations

from dataclasses import dataclass

_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME = 0x0000
_HOST_NAME = 0x00
_ENCRYPTED_CLIENT_HELLO = 0xFE0D  # draft-ietf-tls-esni: the real name is sealed inside
_MAX_RECORD = 1 << 14
# a ClientHello with post-quantum key shares is some 2 KiB; more than this is no client we serve, and bounds what
# the gateway buffers for a spawn's connection
MAX_HELLO = 32 * 1024
# the most bytes of records that can carry a hello of MAX_HELLO (a 5-byte header per record of at least 1 byte
# would allow 6x: a client fragmenting that finely is refused, not buffered)
MAX_BYTES = MAX_HELLO + 64 * 5


class NotClientHello(ValueError):
    """The bytes are not (the start of) a TLS ClientHello, or it is malformed."""


@dataclass(frozen=True)
class ClientHello:
    server_name: str | None  # the host_name of the server_name extension, lower case; None: not sent
    sealed_name: bool  # an encrypted_client_hello extension: the name the server acts on is not this one


def parse(data: bytes) -> ClientHello | None:
    """The ClientHello at the start of `data`; None if `data` is a valid prefix of one that needs more bytes.
    Raises NotClientHello for anything else."""
    message = _handshake_prefix(data)
    if message is None:
        return None
    return _client_hello(message)


def _handshake_prefix(data: bytes) -> bytes | None:
    """The first handshake message, reassembled from the records it spans; None while incomplete."""
    stream = bytearray()
    at = 0
    while True:
        header = data[at:at + 5]
        if header[:1] and header[0] != _HANDSHAKE:
            raise NotClientHello(f"not a TLS handshake record (first byte 0x{header[0]:02x})")
        if header[1:2] and header[1] != 0x03:
            raise NotClientHello("not a TLS record (version major byte is not 3)")
        if len(header) < 5:
            return None
        length = int.from_bytes(header[3:5])
        if length == 0 or length > _MAX_RECORD:
            raise NotClientHello(f"a handshake record of {length} bytes")
        fragment = data[at + 5:at + 5 + length]
        stream += fragment
        if len(stream) >= 1 and stream[0] != _CLIENT_HELLO:
            raise NotClientHello(f"the first handshake message is type {stream[0]}, not a ClientHello")
        if len(stream) >= 4:
            size = int.from_bytes(stream[1:4])
            if size > MAX_HELLO:
                raise NotClientHello(f"a ClientHello of {size} bytes")
            if len(stream) >= 4 + size:
                if len(stream) > 4 + size or len(fragment) < length:
                    # bytes after the hello in its record: the client sent something no server expects there
                    raise NotClientHello("bytes after the ClientHello in its record")
                return bytes(stream[4:])
        if len(fragment) < length:
            return None
        at += 5 + length


class _Reader:
    """Length-prefixed vectors, each refused when it overruns its container."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise NotClientHello("a ClientHello field runs past its end")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n))

    def vector(self, prefix: int) -> _Reader:
        return _Reader(self.take(self.number(prefix)))

    @property
    def left(self) -> int:
        return len(self.data) - self.at


def _client_hello(body: bytes) -> ClientHello:
    r = _Reader(body)
    r.take(2 + 32)  # legacy_version, random
    r.vector(1)  # legacy_session_id
    r.vector(2)  # cipher_suites
    r.vector(1)  # legacy_compression_methods
    if r.left == 0:  # a hello without extensions (SSL 3.0 style): no name
        return ClientHello(None, False)
    extensions = r.vector(2)
    if r.left:
        raise NotClientHello("bytes after the ClientHello's extensions")
    seen: set[int] = set()
    name: str | None = None
    while extensions.left:
        kind, data = extensions.number(2), extensions.vector(2)
        if kind in seen:
            # which of two a server would act on is its choice: refused rather than guessed
            raise NotClientHello(f"extension {kind} sent twice")
        seen.add(kind)
        if kind == _SERVER_NAME:
            name = _server_name(data)
    return ClientHello(name, _ENCRYPTED_CLIENT_HELLO in seen)


def _server_name(ext: _Reader) -> str:
    names = ext.vector(2)
    if ext.left:
        raise NotClientHello("bytes after the server_name list")
    found: list[str] = []
    while names.left:
        kind, value = names.number(1), names.vector(2).data
        if kind != _HOST_NAME:
            raise NotClientHello(f"a server_name of type {kind}")
        try:
            found.append(value.decode("ascii").lower())
        except UnicodeDecodeError:
            raise NotClientHello("a server_name that is not ASCII (names are sent as A-labels)") from None
    if len(found) != 1 or not found[0]:
        raise NotClientHello(f"{len(found)} host names in server_name (RFC 6066: exactly one)")
    return found[0]
