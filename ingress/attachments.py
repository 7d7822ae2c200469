"""Attachments: a file uploaded from the phone (a screenshot, a photo, a log), stored in PostgreSQL and served
back. The type is decided by the bytes, never by the file's name or the client's header; images are
re-encoded from their pixels, so no metadata (EXIF: the photo's location) is kept."""

from __future__ import annotations

import asyncio
import hashlib
import io
import re
import unicodedata
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import filetype
from PIL import Image, ImageOps, UnidentifiedImageError
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response

from ingress.auth import ATTACHMENT_MAX_BYTES, BodyTooLarge, size_text
from ingress.http import ingress_queries, path_uuid, respond, who
from ingress.problems import Problem

# the raster formats taken, by their detected type, with Pillow's name for each
IMAGES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}
TEXT = "text/plain"
PDF = "application/pdf"
ACCEPTED = (*IMAGES, PDF, TEXT)
# An image is decoded into memory to be re-encoded: a small file may declare a huge canvas (a decompression
# bomb). 50 megapixels is above any phone camera's JPEG.
MAX_IMAGE_PIXELS = 50_000_000
_READ_CHUNK = 256 * 1024
# SVG is text, but markup a browser would run: refused even as text/plain
_SVG = re.compile(rb"<svg[\s>/]", re.IGNORECASE)


@dataclass(frozen=True)
class Accepted:
    """What is stored: the bytes (images re-encoded), the type they were found to be, and an image's copy
    for the model when it is over the CLI's limits (`model_copy`)."""

    data: bytes
    media_type: str
    model_data: bytes | None = None
    model_media_type: str | None = None


def sniff(data: bytes) -> str:
    """The accepted type these bytes are, or Problem 415. Magic numbers first (filetype), then text: UTF-8
    that holds no NUL; SVG and any other markup format are refused."""
    kind = filetype.guess(data[:8192]) if data else None
    if kind is not None:
        mime = str(kind.mime)
        if mime in IMAGES or mime == PDF:
            return mime
        raise Problem(415, f"files of type {mime} are not accepted (images: PNG, JPEG, WebP, GIF; PDF; text)",
                      accepted=list(ACCEPTED))
    if b"\x00" in data:
        raise Problem(415, "binary files are not accepted (images: PNG, JPEG, WebP, GIF; PDF; text)",
                      accepted=list(ACCEPTED))
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise Problem(415, "a text file must be UTF-8", accepted=list(ACCEPTED)) from None
    if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<") and _SVG.search(data[:65536]):
        raise Problem(415, "SVG is not accepted (it is markup a browser runs); send a PNG", accepted=list(ACCEPTED))
    return TEXT


def strip_image(data: bytes, media_type: str) -> bytes:
    """The image re-encoded from its pixels alone: EXIF, XMP, comments and text chunks are not carried over
    (a JPEG's orientation is applied to the pixels first). An animated GIF keeps its first frame."""
    fmt = IMAGES[media_type]
    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as img:
            if img.width * img.height > MAX_IMAGE_PIXELS:
                raise Problem(413, f"image of {img.width}×{img.height} pixels (at most {MAX_IMAGE_PIXELS})")
            img.seek(0)
            oriented = ImageOps.exif_transpose(img) if fmt == "JPEG" else img
            oriented.load()
            if oriented.mode == "P":
                # palette images keep their indices and palette, so their pixels are exactly the same
                clean = Image.frombytes("P", oriented.size, oriented.tobytes())
                clean.putpalette(oriented.getpalette() or [])
                extra: dict[str, Any] = {"transparency": oriented.info["transparency"]} if "transparency" in oriented.info else {}
            else:
                mode = oriented.mode if oriented.mode in _MODES[fmt] else ("RGBA" if fmt != "JPEG" else "RGB")
                source = oriented if oriented.mode == mode else oriented.convert(mode)
                # a new image from the raw pixels: nothing of the file's info dict comes along
                clean = Image.frombytes(mode, source.size, source.tobytes())
                extra = {}
    except Image.DecompressionBombError:
        raise Problem(413, f"image of more than {MAX_IMAGE_PIXELS} pixels") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise Problem(415, f"the file is not a readable {fmt} image ({type(exc).__name__})") from None
    out = io.BytesIO()
    options: dict[str, Any] = _SAVE_OPTIONS.get(fmt, {})
    clean.save(out, format=fmt, **options, **extra)
    return out.getvalue()


# JPEG cannot keep its pixels through a re-encoding: a high quality keeps what the eye sees
_SAVE_OPTIONS: dict[str, dict[str, Any]] = {"JPEG": {"quality": 95}, "WEBP": {"lossless": True}}
# the pixel modes each format writes as they are (others are converted)
_MODES = {"PNG": ("1", "L", "LA", "RGB", "RGBA", "I;16"), "JPEG": ("L", "RGB", "CMYK"),
          "WEBP": ("RGB", "RGBA"), "GIF": ("L",)}


def clean_name(raw: str | None) -> str:
    """A display name from the client's file name: its last path part, no control characters, at most 255
    characters. Never used to decide the type."""
    name = re.split(r"[\\/]", raw or "")[-1]
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C").strip()
    return name[:255] or "attachment"


def accept(data: bytes, max_bytes: int = ATTACHMENT_MAX_BYTES) -> Accepted:
    """The checks, in order, before anything is stored: size, type from the bytes, images re-encoded."""
    if len(data) > max_bytes:
        raise Problem(413, f"an attachment is at most {size_text(max_bytes)}")
    media_type = sniff(data)
    if media_type in IMAGES:
        data = strip_image(data, media_type)
        if len(data) > max_bytes:  # a re-encoding can come out larger than its source
            raise Problem(413, f"the image re-encoded without metadata is over {size_text(max_bytes)}")
        copy = model_copy(data, media_type)
        if copy is not None:
            return Accepted(data, media_type, *copy)
    return Accepted(data, media_type)


# What the CLI sends an image as it is (observed, docs/claude-cli.md): a file of at most about 480 KB whose
# sides fit the model's limits (2000 px, and a pixel budget). Anything larger it re-encodes as a JPEG before
# every request of every turn that carries it, a second or more for a phone photo. The copy made here once
# stays inside those limits, so the CLI passes it through; the stored original is what Chat shows and what
# a worker finds in its worktree.
MODEL_MAX_BYTES = 400 * 1024
MODEL_MAX_SIDE = 2000
MODEL_MAX_PIXELS = 3_500_000
_MODEL_QUALITIES = (85, 75, 65, 55)


def model_copy(data: bytes, media_type: str) -> tuple[bytes, str] | None:
    """The image as the model should get it (JPEG bytes and type), or None when the stored bytes already
    fit. Shrinks to the side and pixel limits, then lowers the quality, then the size, to fit the bytes."""
    with Image.open(io.BytesIO(data), formats=[IMAGES[media_type]]) as img:
        img.seek(0)
        w, h = img.size
        if len(data) <= MODEL_MAX_BYTES and max(w, h) <= MODEL_MAX_SIDE and w * h <= MODEL_MAX_PIXELS:
            return None
        scale = min(1.0, MODEL_MAX_SIDE / max(w, h), (MODEL_MAX_PIXELS / (w * h)) ** 0.5)
        rgb = _flatten(img)
    while True:
        size = (max(1, int(w * scale)), max(1, int(h * scale)))
        frame = rgb.resize(size, Image.Resampling.LANCZOS) if size != rgb.size else rgb
        for quality in _MODEL_QUALITIES:
            out = io.BytesIO()
            frame.save(out, format="JPEG", quality=quality)
            if out.tell() <= MODEL_MAX_BYTES:
                return out.getvalue(), "image/jpeg"
        scale *= 0.75


def _flatten(img: Image.Image) -> Image.Image:
    """RGB pixels for a JPEG; transparency over white (a screenshot's clear parts stay light)."""
    rgba = img.convert("RGBA")
    base = Image.new("RGB", rgba.size, (255, 255, 255))
    base.paste(rgba, mask=rgba.getchannel("A"))
    return base


async def _read_capped(upload: UploadFile, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    seen = 0
    while chunk := await upload.read(_READ_CHUNK):
        seen += len(chunk)
        if seen > max_bytes:
            raise Problem(413, f"an attachment is at most {size_text(max_bytes)}")
        chunks.append(chunk)
    return b"".join(chunks)


async def upload(request: Request) -> Response:
    """Store one file (the form field `file`); answers its id, sha256, size, detected type and name."""
    max_bytes: int = request.app.state.auth.upload_max_bytes
    try:
        # one file and a few fields at most; the body itself is capped by the guard (413 past the cap)
        async with request.form(max_files=1, max_fields=4) as form:
            part = form.get("file")
            if not isinstance(part, UploadFile):
                raise Problem(422, "the form needs a file in the field `file`")
            data = await _read_capped(part, max_bytes)
            name = clean_name(part.filename)
    except BodyTooLarge:
        raise Problem(413, f"an attachment is at most {size_text(max_bytes)}") from None
    # decoding and re-encoding an image is CPU work: off the event loop
    accepted = await asyncio.to_thread(accept, data, max_bytes)
    row = await ingress_queries(request).one("insert_attachment", {
        "sha256": hashlib.sha256(accepted.data).digest(), "size_bytes": len(accepted.data),
        "media_type": accepted.media_type, "name": name, "data": accepted.data, "sent_by": who(request),
        "model_data": accepted.model_data, "model_media_type": accepted.model_media_type})
    assert row is not None  # INSERT ... RETURNING
    return respond(_public(row), 201)


def _public(row: dict[str, object]) -> dict[str, object]:
    digest = row["sha256"]
    assert isinstance(digest, bytes | memoryview)
    return {"id": row["id"], "sha256": bytes(digest).hex(), "size": row["size_bytes"],
            "media_type": row["media_type"], "name": row["name"], "created_at": row["created_at"]}


async def download(request: Request) -> Response:
    """The stored bytes, as a download (inline only for raster images); the browser may not guess a type."""
    attachment_id = path_uuid(request, "attachment_id")
    row = await ingress_queries(request).one("get_attachment", {"id": attachment_id})
    if row is None:
        raise Problem(404, f"no attachment {attachment_id}")
    media_type = str(row["media_type"])
    disposition = "inline" if media_type in IMAGES else "attachment"
    name = str(row["name"])
    fallback = name.encode("ascii", "replace").decode().replace('"', "_").replace("\\", "_")
    headers = {
        "Content-Disposition": f"{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}",
        "X-Content-Type-Options": "nosniff",
        # opened directly, it is a document with no powers at all
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Cache-Control": "private, max-age=86400",
        "ETag": f'"{bytes(row["sha256"]).hex()}"',
    }
    charset = "; charset=utf-8" if media_type == TEXT else ""
    return Response(bytes(row["data"]), media_type=media_type + charset, headers=headers)
