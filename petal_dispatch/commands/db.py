"""`petal-dispatch migrate` and `petal-dispatch db status`: the schema and where the database is."""

from __future__ import annotations

import argparse
import json

from petal_dispatch import dbserver
from petal_dispatch.config import Settings
from shared import migrate as migrations


def migrate(args: argparse.Namespace, settings: Settings) -> int:
    info = dbserver.resolve(settings, auto_migrate=False)
    applied = migrations.migrate(dbserver.admin(info))
    if applied:
        for mig in applied:
            print(f"applied {mig.path.name}")
    else:
        print("migrations current: nothing to apply")
    return 0


def status(args: argparse.Namespace, settings: Settings) -> int:
    info = dbserver.resolve(settings, auto_migrate=False, start=False)  # read-only: never starts a server
    state = migrations.status(info.admin_dsn or info.executor_dsn)
    # shown, never their passwords (a terminal's scrollback and a pasted bug report are not secret)
    dsns = {role: dbserver.redacted(dsn) if dsn else dsn for role, dsn in
            (("admin", info.admin_dsn), ("executor", info.executor_dsn), ("ingress", info.ingress_dsn))}
    report = {
        "server": info.location,
        "embedded": info.embedded,
        "dsn": dsns,
        "migrations": {"current": state.current, "applied": state.applied, "pending": state.pending},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"server:       {report['server']}")
        for role, dsn in dsns.items():
            print(f"{role + ' dsn:':<14}{dsn}")
        pending = ", ".join(f"{v:04d}" for v in state.pending)
        print(f"migrations:   {'current' if state.current else 'pending ' + pending} ({len(state.applied)} applied)")
    return 0
