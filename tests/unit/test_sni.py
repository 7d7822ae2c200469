"""The TLS ClientHello parser the gateway peeks into a CONNECT tunnel with (executor/sandbox/sni.py): real
ClientHellos made by Python's ssl module (OpenSSL), read whole, split at every byte and fragmented across records;
a valid prefix is "not yet", anything else is refused at once."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.sandbox import sni
from executor.sandbox.sni import ClientHello, NotClientHello

pytestmark = pytest.mark.unit


def real_hello(server_hostname: str | None, tls: ssl.TLSVersion | None = None) -> bytes:
    """What an OpenSSL client sends first: do_handshake on a memory BIO, then the bytes it wrote."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if tls is not None:
        ctx.maximum_version = tls
    tls_object = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls_object.do_handshake()
    return out.read()


def records(hello: bytes, size: int) -> bytes:
    """The same handshake message carried in records of `size` bytes each (RFC 8446 §5.1 allows any split)."""
    message = hello[5:]
    return b"".join(b"\x16\x03\x01" + len(part).to_bytes(2) + part
                    for part in (message[i:i + size] for i in range(0, len(message), size)))


def built(extensions: list[tuple[int, bytes]], after: bytes = b"") -> bytes:
    """A minimal ClientHello with these extensions, in one record (for shapes OpenSSL never sends)."""
    exts = b"".join(kind.to_bytes(2) + len(data).to_bytes(2) + data for kind, data in extensions)
    body = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00" + len(exts).to_bytes(2) + exts
    message = b"\x01" + len(body).to_bytes(3) + body + after
    return b"\x16\x03\x01" + len(message).to_bytes(2) + message


def sni_ext(*names: bytes, kind: int = 0) -> tuple[int, bytes]:
    entries = b"".join(bytes([kind]) + len(n).to_bytes(2) + n for n in names)
    return 0, len(entries).to_bytes(2) + entries


LONG = ".".join(["a" * 63] * 3) + ".example"  # 200 characters


@pytest.mark.parametrize("name", ["allowed.example", "API.Anthropic.COM", LONG])
@pytest.mark.parametrize("tls", [None, ssl.TLSVersion.TLSv1_2])
def test_a_real_client_hello_gives_its_server_name_and_every_prefix_of_it_needs_more(
        name: str, tls: ssl.TLSVersion | None) -> None:
    hello = real_hello(name, tls)
    assert sni.parse(hello) == ClientHello(name.lower(), False)
    for cut in range(len(hello)):
        assert sni.parse(hello[:cut]) is None, cut
    # the bytes a client sends after its hello (TLS 1.3 early data, a ChangeCipherSpec) are not the parser's
    assert sni.parse(hello + b"\x14\x03\x03\x00\x01\x01") == ClientHello(name.lower(), False)


@pytest.mark.parametrize("size", [1, 2, 5, 100, 511])
def test_a_hello_fragmented_across_records_is_reassembled_at_every_split(size: int) -> None:
    hello = records(real_hello("allowed.example"), size)
    assert sni.parse(hello) == ClientHello("allowed.example", False)
    assert all(sni.parse(hello[:cut]) is None for cut in range(len(hello)))


def test_a_hello_without_a_name_says_so() -> None:
    # an address as server_hostname: OpenSSL sends no SNI (RFC 6066 names no addresses), as with none at all
    for hostname in (None, "127.0.0.1"):
        assert sni.parse(real_hello(hostname)) == ClientHello(None, False)
    assert sni.parse(built([])) == ClientHello(None, False)
    assert sni.parse(built([(0x000A, b"\x00\x02\x00\x1d")])) == ClientHello(None, False)


@pytest.mark.parametrize("first, shown_at", [
    (b"GET / HTTP/1.1\r\n", 1), (b"SSH-2.0-OpenSSH_9.6\r\n", 1), (b"\x80\x2e\x01\x03\x01", 1),  # SSLv2-style
    (b"\x17\x03\x03\x00\x10", 1), (b"\x16\x02\x00", 2), (b"\x16\x03\x01\x00\x05\x02", 6)])
def test_bytes_that_are_not_a_tls_client_hello_are_refused_at_the_first_byte_that_shows_it(
        first: bytes, shown_at: int) -> None:
    for cut in range(shown_at):
        assert sni.parse(first[:cut]) is None  # "not yet" only while it could still be a hello
    with pytest.raises(NotClientHello):
        sni.parse(first[:shown_at])


@pytest.mark.parametrize("hello, says", [
    (built([sni_ext(b"a.example"), sni_ext(b"b.example")]), "sent twice"),
    (built([sni_ext(b"a.example", b"b.example")]), "exactly one"),
    (built([sni_ext(b"a.example", kind=1)]), "of type 1"),
    (built([sni_ext(b"")]), "exactly one"),
    (built([sni_ext("é.example".encode())]), "not ASCII"),
    (built([sni_ext(b"a.example")], after=b"\x01\x00\x00\x00"), "after the ClientHello"),
    (built([(0, b"\x00\xff\x00")]), "runs past"),
    (b"\x16\x03\x01\x00\x00", "of 0 bytes"),
    (b"\x16\x03\x01\x40\x01", "of 16385 bytes"),
    (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "not a ClientHello"),
    (b"\x16\x03\x01\x00\x04\x01\x01\x00\x00", "ClientHello of 65536 bytes"),
])
def test_a_malformed_or_ambiguous_hello_is_refused_with_why(hello: bytes, says: str) -> None:
    with pytest.raises(NotClientHello, match=says):
        sni.parse(hello)


def test_an_encrypted_client_hello_is_flagged_whatever_its_outer_name() -> None:
    # ECH: the name in the clear is the provider's public one, the one the server acts on is sealed inside
    assert sni.parse(built([sni_ext(b"public.example"), (0xFE0D, b"\x00" * 40)])) == \
        ClientHello("public.example", True)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_a_hello_a_prefix_or_refused_never_a_crash(data: bytes) -> None:
    try:
        sni.parse(data)
    except NotClientHello:
        pass


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=255))
def test_a_real_hello_with_one_byte_changed_is_read_or_refused_never_a_crash(at: int, value: int) -> None:
    hello = bytearray(real_hello("allowed.example"))
    hello[at % len(hello)] = value
    try:
        sni.parse(bytes(hello))
    except NotClientHello:
        pass
