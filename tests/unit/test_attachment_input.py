"""What decides an attachment's type, its display name, and how a turn's files become content blocks."""

from __future__ import annotations

import base64
import io
import os
import uuid
from pathlib import Path

import orjson
import pytest
from PIL import Image

from executor.run import substrate, user_input
from executor.run.user_input import Attachment
from ingress.attachments import MODEL_MAX_BYTES, MODEL_MAX_PIXELS, MODEL_MAX_SIDE, clean_name, model_copy, sniff
from ingress.problems import Problem


@pytest.mark.parametrize(("data", "expected"), [
    (b"\x89PNG\r\n\x1a\n" + bytes(16), "image/png"),
    (b"%PDF-1.7\n", "application/pdf"),
    ("naïve log line\n".encode(), "text/plain"),
    (b"\xef\xbb\xbfwith a BOM\n", "text/plain"),
    (b"<html><body>not svg</body></html>", "text/plain"),  # shown as text, served as a download
    (b"", "text/plain"),
])
def test_accepted_types_are_read_from_the_bytes(data: bytes, expected: str) -> None:
    assert sniff(data) == expected


@pytest.mark.parametrize(("data", "why"), [
    (b"\x7fELF\x02\x01\x01\x00" + bytes(64), "x-executable"),
    (b"MZ\x90\x00" + bytes(64), "not accepted"),
    (b"PK\x03\x04" + bytes(64), "zip"),
    (b"<!-- drawn -->\n<svg xmlns='http://www.w3.org/2000/svg'/>", "SVG"),
    (b"\xef\xbb\xbf  <SVG\nviewBox='0 0 1 1'></SVG>", "SVG"),
    ("latin-1 caf\xe9\n".encode("latin-1"), "UTF-8"),
    (b"text with a \x00 NUL", "binary"),
])
def test_anything_else_is_refused_415(data: bytes, why: str) -> None:
    with pytest.raises(Problem) as refused:
        sniff(data)
    assert refused.value.status == 415 and why in refused.value.detail


def test_a_display_name_loses_its_path_and_control_characters() -> None:
    assert clean_name("C:\\Users\\me\\shot.png") == "shot.png"
    assert clean_name("../../etc/passwd") == "passwd"
    assert clean_name("a\x00b\r\nc.txt") == "abc.txt"
    assert clean_name("") == clean_name(None) == "attachment"
    assert len(clean_name("x" * 1000)) == 255


def _attachment(name: str, media_type: str, data: bytes) -> Attachment:
    return Attachment(id=uuid.uuid4(), name=name, media_type=media_type, data=data)


def test_images_and_documents_come_first_and_text_files_inline_after_the_brief_cut_to_a_bound() -> None:
    long_log = ("x" * (user_input.MAX_INLINE_TEXT_CHARS + 10)).encode()
    blocks = user_input.content_blocks("what is this?", [
        _attachment("a.png", "image/png", b"PNGDATA"), _attachment("a.log", "text/plain", long_log),
        _attachment("b.pdf", "application/pdf", b"%PDF")])
    assert [b["type"] for b in blocks] == ["image", "document", "text"]
    assert base64.b64decode(blocks[0]["source"]["data"]) == b"PNGDATA" and blocks[1]["title"] == "b.pdf"
    text = blocks[2]["text"]
    assert text.startswith("what is this?") and '[attached file "a.log"]' in text
    assert "cut: the file has" in text and len(text) < user_input.MAX_INLINE_TEXT_CHARS + 500


def test_a_spawn_with_content_reads_stream_json_and_one_without_reads_its_prompt_as_before() -> None:
    plain = substrate.SpawnSpec(role="orchestrator", prompt="hello", session_uuid=str(uuid.uuid4()))
    rich = substrate.SpawnSpec(role="orchestrator", prompt="hello", session_uuid=plain.session_uuid,
                               content=tuple(user_input.content_blocks("hello", [])))
    config = substrate.SubstrateConfig(claude_bin="claude")
    assert "--input-format" not in substrate.build_command(config, plain)
    cmd = substrate.build_command(config, rich)
    assert cmd[cmd.index("--input-format") + 1] == "stream-json"
    assert substrate.stdin_input(plain) == b"hello"
    line = substrate.stdin_input(rich)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert orjson.loads(line)["message"] == {"role": "user", "content": [{"type": "text", "text": "hello"}]}


def test_a_purge_age_takes_a_number_and_a_unit() -> None:
    from petal_dispatch.commands.retention import parse_age
    from shared import errors

    assert parse_age("30d") == 30 * 86400 and parse_age("12h") == 43200 and parse_age("1.5m") == 90
    for bad in ("30", "d", "-1d", "30 days"):
        with pytest.raises(errors.ConfigError):
            parse_age(bad)


# ---- a project worker's files in its worktree ---------------------------------------------------------------

def _file(name: str, data: bytes = b"x") -> Attachment:
    return Attachment(id=uuid.uuid4(), name=name, media_type="text/plain", data=data)


def test_worktree_names_are_safe_unique_and_the_same_for_the_same_names() -> None:
    names = ["screen.png", "screen.png", "..", ".bashrc", "a b/c?.log", "ünïcode.txt", ""]
    got = user_input.worktree_names(names)
    assert got == user_input.worktree_names(names)
    assert got[:2] == ["screen.png", "2-screen.png"] and len(set(got)) == len(got)
    assert all(n and not n.startswith(".") and "/" not in n for n in got), got
    assert got[4] == "a_b_c_.log" and got[5] == "ünïcode.txt"


def test_files_are_written_new_under_petal_attachments_and_the_folder_ignores_itself(tmp_path: Path) -> None:
    paths = user_input.place_in_worktree(tmp_path, [_file("a.log", b"one"), _file("a.log", b"two")])
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [".petal/attachments/a.log",
                                                                  ".petal/attachments/2-a.log"]
    assert [p.read_bytes() for p in paths] == [b"one", b"two"]
    assert (tmp_path / ".petal" / ".gitignore").read_text() == "*\n"


@pytest.mark.parametrize("link", [".petal", ".petal/attachments"])
def test_a_repository_that_commits_the_folder_as_a_symlink_gets_nothing_written_outside(
    tmp_path: Path, link: str
) -> None:
    worktree, outside = tmp_path / "worktree", tmp_path / "outside"
    worktree.mkdir()
    outside.mkdir()
    (worktree / ".petal").mkdir(exist_ok=link != ".petal")
    if link == ".petal":
        (worktree / ".petal").rmdir()
    (worktree / link).symlink_to(outside)
    with pytest.raises(OSError):
        user_input.place_in_worktree(worktree, [_file("x.log")])
    assert list(outside.iterdir()) == []


def test_a_file_the_repository_already_has_there_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / ".petal" / "attachments").mkdir(parents=True)
    target = tmp_path / "victim"
    target.write_text("keep")
    (tmp_path / ".petal" / "attachments" / "x.log").symlink_to(target)
    with pytest.raises(FileExistsError):
        user_input.place_in_worktree(tmp_path, [_file("x.log", b"overwrite")])
    assert target.read_text() == "keep"


# ---- an image's copy for the model ------------------------------------------------------------------------

def _noise(w: int, h: int, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (w, h), os.urandom(w * h * 3)).save(out, format=fmt, compress_level=1)
    return out.getvalue()


def test_an_image_within_the_clis_limits_has_no_copy_and_goes_as_stored() -> None:
    small = _noise(200, 150)
    assert model_copy(small, "image/png") is None
    blocks = user_input.content_blocks("look", [Attachment(id=uuid.uuid4(), name="s.png", media_type="image/png",
                                                           data=small)])
    assert base64.b64decode(blocks[0]["source"]["data"]) == small and blocks[0]["source"]["media_type"] == "image/png"


@pytest.mark.parametrize(("w", "h"), [(1321, 1321), (3000, 2000), (1170, 2532)])
def test_a_large_image_gets_a_jpeg_copy_within_the_byte_side_and_pixel_limits(w: int, h: int) -> None:
    copy = model_copy(_noise(w, h), "image/png")
    assert copy is not None
    data, media_type = copy
    size = Image.open(io.BytesIO(data)).size
    assert media_type == "image/jpeg" and len(data) <= MODEL_MAX_BYTES
    assert max(size) <= MODEL_MAX_SIDE and size[0] * size[1] <= MODEL_MAX_PIXELS
    assert abs(size[0] / size[1] - w / h) < 0.01  # the same shape, only smaller
    blocks = user_input.content_blocks("look", [Attachment(id=uuid.uuid4(), name="b.png", media_type="image/png",
                                                           data=b"original", model_data=data,
                                                           model_media_type=media_type)])
    assert base64.b64decode(blocks[0]["source"]["data"]) == data and blocks[0]["source"]["media_type"] == "image/jpeg"
