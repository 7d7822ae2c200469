"""Upgrades keep working: a data directory made by an earlier release's code starts on today's, nothing lost.

The earlier code is taken out of this repository's history (`git archive`) and run as it was — its own
`shared`/`petal_dispatch`, the current venv's libraries, the embedded PostgreSQL in a fresh data directory —
to migrate and to make threads (one archived), a turn waiting on a question, and journal records. Today's
`petal-dispatch migrate` then runs on the same directory and the store is compared, row by row.

Two earlier installs: the 0.1.0 release (849db0e), made before migration 0017's comment was edited (ea58037),
which today's code refused with `migration 0017_gates.sql changed after it was applied`; and one made by the code
just before the fix (after the edit), whose checksums are today's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from shared import migrate, migration_manifest

pytestmark = pytest.mark.shipped

ROOT = Path(__file__).resolve().parents[2]
RELEASE_0_1_0 = "849db0e"  # v0.1.0: migrations 0001-0022, 0017 with its comment as first landed
BEFORE_THE_FIX = "19465aa"  # after the edit, before migrations/checksums.json: 0017 as it is now, 0001-0036


def _has_history(*commits: str) -> bool:
    if not (ROOT / ".git").exists():
        return False
    return all(subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{c}^{{commit}}"],
                              capture_output=True).returncode == 0 for c in commits)


needs_history = pytest.mark.skipif(not _has_history(RELEASE_0_1_0, BEFORE_THE_FIX),
                                   reason="needs this repository's git history (a clone, not a shallow one)")


def _checkout(commit: str, into: Path) -> Path:
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _env(data_dir: Path, code: Path | None) -> dict[str, str]:
    """The environment of a command on `data_dir`: the embedded server (no DATABASE_URL); `code` an old checkout
    whose packages stand first on the path (run with `python -S`, so this checkout's editable install is not
    on it at all), else today's: this checkout's, as the test itself imports it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "PETAL_DATABASE_URL", "PETAL_EXECUTOR_DSN", "PETAL_INGRESS_DSN", "PYTHONPATH")}
    env.update(PETAL_DATA_DIR=str(data_dir), PETAL_LOG_FORMAT="json")
    if code is None:
        env["PYTHONPATH"] = str(ROOT)
    else:
        libraries = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        env["PYTHONPATH"] = os.pathsep.join([str(code), *libraries])
    return env


def _python(code: Path | None, data_dir: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    isolated = ["-S"] if code is not None else []
    return subprocess.run([sys.executable, *isolated, "-c", script, *args], env=_env(data_dir, code),
                          cwd=data_dir.parent, capture_output=True, text=True, timeout=180)


def _cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Today's `petal-dispatch`."""
    return subprocess.run([sys.executable, "-m", "petal_dispatch.cli", *args], env=_env(data_dir, None),
                          cwd=data_dir.parent, capture_output=True, text=True, timeout=180)


# Runs under either code: the server found (and started) as that code does it, then `sys.argv[1]` as a
# module-level function of this script with the admin DSN.
SCRIPT = r'''
import asyncio, json, sys, uuid
import psycopg
try:
    from petal_dispatch import config as settings_module, dbserver
except ImportError:  # before the application package (0.1.0): shared.settings, shared.dbserver
    from shared import settings as settings_module, dbserver

def seed(admin):
    """What a user of the old code had: two threads (one archived), a turn waiting on a question, journal."""
    from psycopg_pool import AsyncConnectionPool
    from shared import journal
    from shared.models import NewEvent
    kept, archived, turn, question = (uuid.uuid4() for _ in range(4))
    with psycopg.connect(admin, autocommit=True) as c:
        for thread, title in ((kept, "kept"), (archived, "archived one")):
            c.execute("INSERT INTO sessions (id, role, lifecycle, title, mode) "
                      "VALUES (%s, 'orchestrator', 'idle', %s, 'interactive')", [thread, title])
        c.execute("INSERT INTO tasks (id, session_id, role, brief, status, activity, started_at) "
                  "VALUES (%s, %s, 'orchestrator', 'which colour?', 'running', 'awaiting_user', now())",
                  [turn, kept])
        c.execute("INSERT INTO questions (id, tool_use_id, source_session_uuid, task_id, questions) "
                  "VALUES (%s, 'toolu_upgrade', %s, %s, %s)",
                  [question, kept, turn, json.dumps([{"question": "Which colour?", "header": "Colour",
                                                      "options": [{"label": "red"}, {"label": "blue"}]}])])
        c.execute("UPDATE sessions SET lifecycle = 'archived' WHERE id = %s", [archived])
    events = [NewEvent("thread.created", {"title": "kept"}, session_id=kept),
              NewEvent("thread.created", {"title": "archived one"}, session_id=archived),
              NewEvent("task.user_message", {"text": "pick a colour"}, session_id=kept, task_id=turn),
              NewEvent("question.asked", {"question_id": str(question)}, session_id=kept, task_id=turn),
              NewEvent("thread.archived", {}, session_id=archived)]

    async def append():
        async with AsyncConnectionPool(admin, min_size=1, max_size=1, open=False,
                                       kwargs={"autocommit": True}) as pool:
            for event in events:  # one batch each, as the executor's writer would over time
                await journal.append(pool, [event])
    asyncio.run(append())
    return {"kept": str(kept), "archived": str(archived), "turn": str(turn), "question": str(question)}

def snapshot(admin):
    """The store as rows: compared before and after the upgrade."""
    with psycopg.connect(admin) as c:
        rows = lambda q: [[str(v) for v in r] for r in c.execute(q).fetchall()]
        return {
            "threads": rows("SELECT id, lifecycle, title, mode FROM sessions WHERE role = 'orchestrator' ORDER BY id"),
            "tasks": rows("SELECT id, session_id, status, activity FROM tasks ORDER BY id"),
            "questions": rows("SELECT id, task_id, status, answered_at FROM questions ORDER BY id"),
            "journal": rows("SELECT seq, event_id, event_type, session_id, task_id, payload FROM journal ORDER BY seq"),
            "migrations": rows("SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version"),
        }

def migrate_with(admin, directory):
    """Today's migrate against another copy of migrations/ (the negative control)."""
    from pathlib import Path
    from shared import errors, migrate
    try:
        return {"applied": [m.version for m in migrate.migrate(admin, Path(directory))]}
    except errors.MigrationError as exc:
        return {"refused": str(exc)}

def keeps_archived(admin, thread):
    """0025's trigger on a thread archived before it existed: a turn's lifecycle write leaves it archived."""
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("UPDATE sessions SET lifecycle = 'running' WHERE id = %s", [thread])
        return c.execute("SELECT lifecycle FROM sessions WHERE id = %s", [thread]).fetchone()[0]

def cli(admin):
    """Today's read commands while the server runs (`db status` and `status` never start one)."""
    import subprocess
    run = lambda *a: json.loads(subprocess.run([sys.executable, "-m", "petal_dispatch.cli", *a], check=True,
                                               capture_output=True, text=True).stdout)
    return {"db": run("db", "status", "--json"), "status": run("status", "--json")}

info = dbserver.resolve(settings_module.load(), auto_migrate=sys.argv[1] == "seed")
print(json.dumps(globals()[sys.argv[1]](dbserver.admin(info), *sys.argv[2:])))
'''


def _run(code: Path | None, data_dir: Path, what: str, *args: str) -> Any:
    done = _python(code, data_dir, SCRIPT, what, *args)
    assert done.returncode == 0, f"{what} under {code or 'today'}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])


def _stripped_manifest(tmp_path: Path) -> Path:
    """Today's migrations with no equivalents in the manifest: the checker as it was before."""
    directory = tmp_path / "migrations-without-equivalents"
    directory.mkdir()
    for path in migrate.migrations_dir().iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    manifest = json.loads((directory / migration_manifest.MANIFEST).read_text())
    for entry in manifest["migrations"].values():
        entry.pop("equivalent", None)
    (directory / migration_manifest.MANIFEST).write_text(json.dumps(manifest))
    return directory


def _upgrade_and_check(code: Path, data_dir: Path, tmp_path: Path, *, earlier_0017: bool) -> None:
    made = _run(code, data_dir, "seed")
    before = _run(code, data_dir, "snapshot")
    available = migrate.discover()
    current = {m.version: m.checksum for m in available}

    if earlier_0017:
        # negative control: without the manifest's equivalents today's code refuses this directory, as
        # every release after the edit did; the refusal leaves it as it was
        refused = _run(None, data_dir, "migrate_with", str(_stripped_manifest(tmp_path)))
        assert refused["refused"].startswith("migration 0017_gates.sql changed after it was applied")
        assert _run(None, data_dir, "snapshot") == before

    first = _cli(data_dir, "migrate")
    assert first.returncode == 0, first.stderr[-3000:]
    after = _run(None, data_dir, "snapshot")
    second = _cli(data_dir, "migrate")
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.strip() == "migrations current: nothing to apply"
    assert _run(None, data_dir, "snapshot") == after  # a second start changes nothing

    # the schema: every migration once, today's checksums; the ones applied before kept their time
    old = {int(v): (name, checksum, at) for v, name, checksum, at in before["migrations"]}
    new = {int(v): (name, checksum, at) for v, name, checksum, at in after["migrations"]}
    assert {v: c for v, (_, c, _) in new.items()} == current
    assert {v: (n, at) for v, (n, _, at) in new.items() if v in old} == {v: (n, at) for v, (n, _, at) in old.items()}
    assert sorted(set(new) - set(old)) == [v for v in current if v not in old]
    assert sorted(old) == [m.version for m in migrate.discover(code / "migrations")]  # the old code's own
    assert (old[17][1] != current[17]) is earlier_0017 and new[17][1] == current[17]
    applied = ([] if first.stdout.strip() == "migrations current: nothing to apply"
               else [line.removeprefix("applied ") for line in first.stdout.splitlines()])
    assert applied == [m.path.name for m in available if m.version not in old]

    # the data: nothing lost or duplicated, the same ids, the same journal seqs without a gap
    for table in ("threads", "tasks", "questions", "journal"):
        assert after[table] == before[table], table
    seqs = [int(row[0]) for row in after["journal"]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and len(seqs) >= 5
    threads = {row[0]: row[1] for row in after["threads"]}
    assert threads[made["kept"]] == "idle" and threads[made["archived"]] == "archived"
    assert [row[:3] for row in after["questions"] if row[0] == made["question"]] == [
        [made["question"], made["turn"], "pending"]]

    # today's commands read it: current, the waiting question still pending
    report = _run(None, data_dir, "cli")
    assert report["db"]["migrations"] == {"current": True, "applied": sorted(current), "pending": []}
    assert made["question"] in json.dumps(report["status"])
    assert _run(None, data_dir, "keeps_archived", made["archived"]) == "archived"


@needs_history
def test_a_data_directory_made_by_release_0_1_0_starts_on_today_s_code_with_nothing_lost(tmp_path: Path) -> None:
    code = _checkout(RELEASE_0_1_0, tmp_path / "v0.1.0")
    assert (code / "shared" / "cli.py").exists() and not (code / "migrations" / "0023_identity.sql").exists()
    _upgrade_and_check(code, tmp_path / "var", tmp_path, earlier_0017=True)


@needs_history
def test_a_data_directory_made_since_the_edit_of_0017_starts_on_today_s_code_with_nothing_lost(
        tmp_path: Path) -> None:
    code = _checkout(BEFORE_THE_FIX, tmp_path / "before-the-fix")
    assert not (code / "migrations" / migration_manifest.MANIFEST).exists()
    _upgrade_and_check(code, tmp_path / "var", tmp_path, earlier_0017=False)


# -- the manifest's claims, checked against the history they describe

_TOKENS = re.compile(r"""
    (?P<comment>--[^\n]*|/\*.*?\*/)
  | (?P<text>'(?:[^']|'')*'|"(?:[^"]|"")*"|(?P<dollar>\$[A-Za-z_]*\$).*?(?P=dollar))
  | (?P<space>\s+)
""", re.S | re.X)


def _statements(sql: str) -> str:
    """The SQL without its comments and with its whitespace runs as one space (strings and bodies as written)."""
    out, pos = [], 0
    for m in _TOKENS.finditer(sql):
        out.append(sql[pos:m.start()])
        out.append(m.group("text") or ("" if m.group("comment") else " "))
        pos = m.end()
    out.append(sql[pos:])
    return " ".join("".join(out).split())


def test_statements_ignore_comments_and_spacing_but_not_strings() -> None:
    assert _statements("CREATE TABLE t (x int); -- why\n/* more */  SELECT '--kept';") == (
        "CREATE TABLE t (x int); SELECT '--kept';")
    assert _statements("SELECT 1;") != _statements("SELECT 2;")


@needs_history
def test_each_equivalent_in_the_manifest_shipped_at_its_commit_and_differs_only_in_comments_or_spacing() -> None:
    entries = migration_manifest.load(migrate.migrations_dir())
    listed = [(name, e) for name, entry in entries.items() for e in entry.equivalent]
    assert [name for name, _ in listed] == ["0017_gates.sql"]
    for name, earlier in listed:
        shipped = subprocess.run(["git", "-C", str(ROOT), "show", f"{earlier['commit']}:migrations/{name}"],
                                 capture_output=True, check=True).stdout
        assert hashlib.sha256(shipped).hexdigest() == earlier["sha256"]
        now = (migrate.migrations_dir() / name).read_text(encoding="utf-8")
        assert shipped.decode() != now
        assert _statements(shipped.decode()) == _statements(now), f"{name}: {earlier['sha256'][:12]} is no equivalent"
