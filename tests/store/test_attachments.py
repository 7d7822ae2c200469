"""Attachments through the real ingress and PostgreSQL: the type from the bytes, metadata stripped, limits
refused before anything is stored, and served back as a download the browser may not re-interpret."""

from __future__ import annotations

import asyncio
import hashlib
import io
import uuid

import httpx
import psycopg
from PIL import Image
from psycopg_pool import AsyncConnectionPool

from tests import tables
from tests.pg import DB
from tests.served import ingress_server

ELF = b"\x7fELF\x02\x01\x01\x00" + bytes(8) + b"\x02\x00\x3e\x00" + bytes(200)
SVG = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>\n'


def png_with_exif() -> bytes:
    img = Image.new("RGB", (40, 30), (200, 10, 10))
    img.putpixel((3, 4), (1, 2, 3))
    exif = Image.Exif()
    exif[0x010F] = "PhoneMaker"  # Make
    exif[0x8825] = {2: (48.0, 51.0, 24.0)}  # GPSInfo: a latitude
    out = io.BytesIO()
    img.save(out, format="PNG", exif=exif)
    return out.getvalue()


async def _announce_only(url: str, length: int) -> bytes:
    """A multipart upload that announces `length` bytes and sends none: the answer comes from the headers
    alone (a client library would be cut off mid-send by the early answer)."""
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST /api/attachments HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {length}\r\n"
                 "Content-Type: multipart/form-data; boundary=b\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), 30)
    writer.close()
    return answer


def _count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return tables.count(conn, "attachments")


def _stored(dsn: str, attachment_id: str) -> tuple[bytes, bytes, str, str]:
    data, digest, media_type, sent_by = tables.row(dsn, "attachments", attachment_id, "data", "sha256", "media_type",
                                                   "sent_by")
    return bytes(data), bytes(digest), media_type, sent_by


async def test_a_png_is_stored_without_its_exif_with_the_same_pixels_and_served_inline(db: DB) -> None:
    original = png_with_exif()
    assert Image.open(io.BytesIO(original)).getexif()  # the control: the upload does carry EXIF
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        # the client's name and header say text: the bytes decide
        up = await http.post("/api/attachments", files={"file": ("../../shot.txt", original, "text/plain")})
        got = await http.get(f"/api/attachments/{up.json()['id']}")
    assert up.status_code == 201, up.text
    body = up.json()
    data, digest, media_type, sent_by = _stored(db.admin_dsn, body["id"])
    assert media_type == body["media_type"] == "image/png" and body["name"] == "shot.txt" and sent_by == "open"
    assert hashlib.sha256(data).digest() == digest and body["sha256"] == digest.hex() and body["size"] == len(data)
    stored = Image.open(io.BytesIO(data))
    assert not stored.getexif() and b"PhoneMaker" not in data and "exif" not in stored.info
    assert stored.convert("RGB").tobytes() == Image.open(io.BytesIO(original)).convert("RGB").tobytes()
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-type"] == "image/png" and got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-disposition"].startswith("inline;")


async def test_a_jpeg_photo_loses_its_gps_location(db: DB) -> None:
    img = Image.new("RGB", (64, 48), (10, 120, 240))
    exif = Image.Exif()
    exif[0x8825] = {1: "N", 2: (48.0, 51.0, 24.0)}
    exif[0x010F] = "PhoneMaker"
    out = io.BytesIO()
    img.save(out, format="JPEG", exif=exif)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        up = await http.post("/api/attachments", files={"file": ("photo.jpg", out.getvalue(), "image/jpeg")})
    assert up.status_code == 201, up.text
    data = _stored(db.admin_dsn, up.json()["id"])[0]
    assert up.json()["media_type"] == "image/jpeg"
    assert not Image.open(io.BytesIO(data)).getexif() and b"PhoneMaker" not in data and b"Exif\x00" not in data


async def test_a_text_file_is_stored_as_text_and_served_as_a_download(db: DB) -> None:
    log = "2026-12-01 ERROR état inconnu\n".encode() * 10
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        up = await http.post("/api/attachments", files={"file": ("app.log", log, "application/octet-stream")})
        got = await http.get(f"/api/attachments/{up.json()['id']}")
        missing = await http.get("/api/attachments/00000000-0000-0000-0000-000000000000")
    assert up.status_code == 201 and up.json()["media_type"] == "text/plain" and up.json()["name"] == "app.log"
    assert got.content == log and got.headers["content-type"] == "text/plain; charset=utf-8"
    assert got.headers["content-disposition"].startswith("attachment;")
    assert got.headers["x-content-type-options"] == "nosniff"
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"


async def test_an_executable_an_svg_an_11_mib_file_and_a_json_body_are_refused_and_nothing_is_stored(db: DB) -> None:
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        exe = await http.post("/api/attachments", files={"file": ("cat.png", ELF, "image/png")})
        svg = await http.post("/api/attachments", files={"file": ("logo.png", SVG, "image/png")})
        # just over the file limit, inside the body's cap for the multipart framing: the route's own check
        over = await http.post("/api/attachments", files={"file": ("o.txt", b"a" * (10 * 1024 * 1024 + 1), "text/plain")})
        fake = await http.post("/api/attachments", files={"file": ("x.png", b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png")})
        as_json = await http.post("/api/attachments", json={"file": "aGVsbG8="})
        empty = await http.post("/api/attachments", files={"other": ("a.txt", b"hi", "text/plain")})
        big = await _announce_only(url, 11 * 1024 * 1024)
    assert exe.status_code == 415 and "application/x-executable" in exe.json()["detail"], exe.text
    assert svg.status_code == 415 and "SVG" in svg.json()["detail"]
    assert big.startswith(b"HTTP/1.1 413") and b"application/problem+json" in big, big[:300]
    assert over.status_code == 413
    assert fake.status_code == 415  # PNG magic, no PNG behind it
    assert as_json.status_code == 415 and empty.status_code == 422
    assert all(r.headers["content-type"] == "application/problem+json" for r in (exe, svg, over, fake, as_json))
    assert _count(db.admin_dsn) == 0


def _chat_rows(dsn: str) -> list[tuple[str, list[object]]]:
    return [(text, list(ids)) for text, ids in tables.rows(dsn, "chat_queue", "text", "attachment_ids")]


def _links(dsn: str) -> dict[str, object]:
    return {str(i): message for i, message in tables.rows(dsn, "attachments", "id", "chat_message_id")}


async def test_a_message_and_its_attachments_are_queued_together_or_not_at_all(db: DB) -> None:
    seven_mib = b"x" * (7 * 1024 * 1024)
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
        ids = [(await http.post("/api/attachments", files={"file": (f"f{i}.txt", seven_mib, "text/plain")})).json()["id"]
               for i in range(3)]
        unknown = await http.post("/api/chat", json={"text": "look", "attachment_ids": [ids[0], str(uuid.uuid4())]})
        too_big = await http.post("/api/chat", json={"text": "look", "attachment_ids": ids})
        twice = await http.post("/api/chat", json={"text": "look", "attachment_ids": [ids[0], ids[0]]})
        assert _chat_rows(db.admin_dsn) == [] and set(_links(db.admin_dsn).values()) == {None}
        sent = await http.post("/api/chat", json={"text": "look", "attachment_ids": ids[:2], "client_msg_id": "m1"})
        retry = await http.post("/api/chat", json={"text": "look", "attachment_ids": ids[:2], "client_msg_id": "m1"})
        reused = await http.post("/api/chat", json={"text": "again", "attachment_ids": [ids[1]]})
    assert unknown.status_code == 422 and too_big.status_code == 413 and twice.status_code == 422, too_big.text
    assert sent.status_code == 202 and sent.json()["attachment_ids"] == ids[:2], sent.text
    assert retry.status_code == 202 and retry.json()["duplicate"] and retry.json()["id"] == sent.json()["id"]
    assert reused.status_code == 409
    assert _chat_rows(db.admin_dsn) == [("look", [uuid.UUID(i) for i in ids[:2]])]
    links = _links(db.admin_dsn)
    assert [links[i] for i in ids] == [uuid.UUID(sent.json()["id"])] * 2 + [None]


async def test_the_limits_are_settings_the_page_reads_and_a_file_or_message_over_them_is_refused(db: DB) -> None:
    async with ingress_server(db.ingress_dsn, attachment_max_bytes=4096, message_attachments_max_bytes=6000) as url, \
            httpx.AsyncClient(base_url=url, timeout=60) as http:
        info = (await http.get("/api/info")).json()
        over = await http.post("/api/attachments", files={"file": ("a.txt", b"a" * 4097, "text/plain")})
        # far over the file limit yet under the default one: the body cap follows the setting
        big = await _announce_only(url, 1024 * 1024)
        ids = [(await http.post("/api/attachments", files={"file": (f"{i}.txt", b"b" * 4096, "text/plain")})).json()["id"]
               for i in range(2)]
        together = await http.post("/api/chat", json={"text": "look", "attachment_ids": ids})
        one = await http.post("/api/chat", json={"text": "look", "attachment_ids": ids[:1]})
    assert (info["attachment_max_bytes"], info["message_attachments_max_bytes"]) == (4096, 6000)
    # in the unit the limits are documented in, not a count of bytes
    assert over.status_code == 413 and over.json()["detail"] == "an attachment is at most 4 KiB"
    assert big.startswith(b"HTTP/1.1 413") and b"an attachment is at most 4 KiB" in big, big[:300]
    assert together.status_code == 413 and "at most 5.9 KiB together (8 KiB given)" in together.json()["detail"], \
        together.text
    assert one.status_code == 202
    assert _count(db.admin_dsn) == 2 and [len(r[1]) for r in _chat_rows(db.admin_dsn)] == [1]


def _attachment(conn: psycopg.Connection, name: str, days_old: int, message: uuid.UUID | None) -> uuid.UUID:
    data = name.encode()
    return tables.insert(conn, "attachments", sha256=hashlib.sha256(data).digest(), size_bytes=len(data),
                         media_type="text/plain", name=name, data=data, created_at=tables.from_now(days=-days_old),
                         chat_message_id=message)


async def test_a_purge_deletes_old_files_of_archived_threads_and_unsent_uploads_and_journals_their_hashes(
    db: DB, pool: AsyncConnectionPool
) -> None:
    from executor.settle import threads

    archived, live = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        for thread, lifecycle in ((archived, "archived"), (live, "idle")):
            tables.insert_thread(conn, thread, lifecycle=lifecycle)
        old_msg, live_msg = (tables.insert(conn, "chat_queue", thread_id=t, text="m", status="delivered")
                             for t in (archived, live))
        gone = {_attachment(conn, "old-archived.log", 40, old_msg),
                _attachment(conn, "never-sent.log", 40, None)}
        kept = {_attachment(conn, "new-archived.log", 2, old_msg),  # younger than the cut-off
                _attachment(conn, "old-live.log", 40, live_msg)}  # its thread is not archived
    purged = await threads.purge_attachments(pool, 30 * 86400)
    again = await threads.purge_attachments(pool, 30 * 86400)
    left = {i for (i,) in tables.rows(db.admin_dsn, "attachments", "id")}
    records = tables.payloads(db.admin_dsn, "attachments.purged")
    assert {p["id"] for p in purged} == gone and left == kept and again == []
    (record,) = records
    assert {(a["name"], a["sha256"]) for a in record["attachments"]} == {
        ("old-archived.log", hashlib.sha256(b"old-archived.log").hexdigest()),
        ("never-sent.log", hashlib.sha256(b"never-sent.log").hexdigest())}
