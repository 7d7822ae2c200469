"""The embedded default: with no DATABASE_URL the command starts its own server in the data directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from tests import tables
from tests.pg import DB

# fetchone() is typed as possibly None: the queries indexed under `# type: ignore[index]` always return a row
# (RETURNING, an aggregate, a row the test made)


def _run(args: list[str], data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PETAL_DATABASE_URL")}
    base.update(PETAL_DATA_DIR=str(data_dir), PETAL_LOG_FORMAT="json", **env)
    return subprocess.run(
        [sys.executable, "-m", "petal_dispatch.cli", *args], env=base, capture_output=True, text=True, timeout=120
    )


def test_migrate_twice_on_the_embedded_server_then_status_reports_it_current(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"

    first = _run(["migrate"], data_dir)
    second = _run(["migrate"], data_dir)
    # `db status` never starts a server (tests/e2e/test_startup_refusals.py): ask while one runs
    script = ("import subprocess, sys\n"
              "from petal_dispatch import config, dbserver\n"
              "dbserver.resolve(config.load())\n"
              "print(subprocess.run([sys.executable, '-m', 'petal_dispatch.cli', 'db', 'status', '--json'], "
              "capture_output=True, text=True).stdout)\n")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(PETAL_DATA_DIR=str(data_dir), PETAL_LOG_FORMAT="json")
    status = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)

    assert first.returncode == 0, first.stderr
    assert "applied 0001_journal.sql" in first.stdout
    assert second.returncode == 0, second.stderr
    assert "nothing to apply" in second.stdout
    report = json.loads(status.stdout)
    assert report["embedded"] is True
    assert report["migrations"]["current"] is True and report["migrations"]["pending"] == []
    assert "petal_executor" in report["dsn"]["executor"] and "petal_ingress" in report["dsn"]["ingress"]
    assert (data_dir / "pgdata" / "PG_VERSION").exists()


def test_data_survives_a_restart_of_the_embedded_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    assert _run(["migrate"], data_dir).returncode == 0
    # each command stops the server when it exits: start it again, write, stop, read
    script = (
        "import sys, psycopg\n"
        "from petal_dispatch import config, dbserver\n"
        "info = dbserver.resolve(config.load())\n"
        "with psycopg.connect(info.admin_dsn, autocommit=True) as c:\n"
        "    if sys.argv[1] == 'write':\n"
        "        c.execute(\"INSERT INTO projects (name) VALUES ('kept')\")\n"
        "    print(c.execute('SELECT name FROM projects').fetchall())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PETAL_DATA_DIR"] = str(data_dir)
    wrote = subprocess.run([sys.executable, "-c", script, "write"], env=env, capture_output=True, text=True, timeout=120)
    read = subprocess.run([sys.executable, "-c", script, "read"], env=env, capture_output=True, text=True, timeout=120)
    assert wrote.returncode == 0, wrote.stderr
    assert read.stdout.strip() == "[('kept',)]"


def test_with_database_url_the_given_server_is_used_and_none_is_started(tmp_path: Path, empty_db: DB) -> None:
    data_dir = tmp_path / "var"
    out = _run(["migrate"], data_dir, DATABASE_URL=empty_db.admin_dsn)
    status = _run(["db", "status", "--json"], data_dir, DATABASE_URL=empty_db.admin_dsn)

    assert out.returncode == 0, out.stderr
    assert json.loads(status.stdout)["embedded"] is False
    assert not (data_dir / "pgdata").exists()
    with psycopg.connect(empty_db.admin_dsn) as conn:
        assert tables.count(conn, "schema_migrations") >= 4


def test_a_bad_database_url_fails_with_a_clear_message_and_no_traceback(tmp_path: Path) -> None:
    out = _run(["db", "status"], tmp_path, DATABASE_URL="postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2")
    assert out.returncode == 2
    assert "petal-dispatch:" in out.stderr and "Traceback" not in out.stderr


def test_db_status_never_prints_a_password(tmp_path: Path, empty_db: DB) -> None:
    secret = "s3cret-pw-4a7f"
    params = psycopg.conninfo.conninfo_to_dict(empty_db.admin_dsn)
    url = psycopg.conninfo.make_conninfo("", **{**params, "password": secret})  # trust auth takes any password
    for args in (["db", "status"], ["db", "status", "--json"]):
        out = _run(args, tmp_path / "var", DATABASE_URL=url)
        assert out.returncode == 0, out.stderr
        assert secret not in out.stdout + out.stderr
        assert "***" in out.stdout  # the DSN is still shown, its password masked


def test_every_command_that_reads_the_store_finds_a_server_by_data_dir_as_up_does(tmp_path: Path) -> None:
    """`up --data-dir X` starts the server in X: `status`, `journal`, `db status`, `contract` and `project`
    find it with the same `--data-dir X`, with no PETAL_DATA_DIR set (and from another directory)."""
    data_dir = tmp_path / "elsewhere"
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "PETAL_DATABASE_URL", "PETAL_DATA_DIR", "PETAL_EXECUTOR_DSN",
                        "PETAL_INGRESS_DSN")}
    env.update(PETAL_LOG_FORMAT="json", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    migrated = subprocess.run([sys.executable, "-m", "petal_dispatch.cli", "migrate", "--data-dir", str(data_dir)], env=env,
                              cwd=cwd, capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    # the server stays up while the script runs (as under `up`); each command is asked with --data-dir only
    script = (
        "import json, os, subprocess, sys\n"
        "from petal_dispatch import config, dbserver\n"
        "dbserver.resolve(config.load().model_copy(update={'data_dir': __import__('pathlib').Path(sys.argv[1])}))\n"
        "out = {}\n"
        "for name, cmd in [('db', ['db', 'status', '--json']), ('status', ['status', '--json']),\n"
        "                  ('journal', ['journal']), ('contract', ['contract', 'list', '--json']),\n"
        "                  ('project', ['project', 'create', '--slug', 'by-data-dir'])]:\n"
        "    r = subprocess.run([sys.executable, '-m', 'petal_dispatch.cli', *cmd, '--data-dir', sys.argv[1]],\n"
        "                       capture_output=True, text=True)\n"
        "    out[name] = [r.returncode, r.stdout, r.stderr]\n"
        "r = subprocess.run([sys.executable, '-m', 'petal_dispatch.cli', 'status', '--json'], capture_output=True, text=True)\n"
        "out['without'] = [r.returncode, r.stdout, r.stderr]\n"
        "print(json.dumps(out))\n"
    )
    ran = subprocess.run([sys.executable, "-c", script, str(data_dir)], env=env, cwd=cwd, capture_output=True,
                         text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    for name in ("db", "status", "journal", "contract", "project"):
        assert out[name][0] == 0, (name, out[name][2])
    assert json.loads(out["db"][1])["embedded"] is True
    assert set(json.loads(out["status"][1])) >= {"tasks", "queue", "asks", "executors"}
    assert json.loads(out["contract"][1])["fields"]
    assert json.loads(out["project"][1])["slug"] == "by-data-dir"
    # the control: without --data-dir (and no PETAL_DATA_DIR) it looks in ./var of its directory, finds nothing
    assert out["without"][0] == 2 and "the database is down" in out["without"][2]
    assert not (cwd / "var").exists()
