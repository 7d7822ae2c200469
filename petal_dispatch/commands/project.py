"""`petal-dispatch project create`: a project loaded from the command line, checked as the API checks it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from psycopg_pool import AsyncConnectionPool

from petal_dispatch import executor_wiring
from petal_dispatch.commands import with_pool
from petal_dispatch.config import Settings
from shared import errors
from shared.read_surface import plan_tasks


def create(args: argparse.Namespace, settings: Settings) -> int:
    from executor.projects import service as projects

    workdir: Path | None = None
    if args.workdir is not None:
        # the API's check and message (executor/projects/service.py): under PETAL_PROJECT_ROOTS once `..` and
        # symlinks are resolved, and a directory; a relative path is taken from here, as a shell would
        given = args.workdir if args.workdir.is_absolute() else Path.cwd() / args.workdir
        roots = projects.ProjectsConfig(settings.project_root_paths).resolved_roots()
        try:
            workdir = projects.check_workdir(str(given), roots, executor_wiring.protected_paths(settings, None))
        except projects.Refused as exc:
            raise errors.ConfigError(str(exc)) from None
    plan = plan_path = None
    if args.plan is not None:
        if not args.plan.is_file():
            raise errors.ConfigError(f"--plan {args.plan} is not a file")
        plan = args.plan.read_text(encoding="utf-8")
        where = args.plan.resolve()
        # as the API stores it: relative to the workdir when the plan is in it, else where it was read from
        plan_path = str(where.relative_to(workdir)) if workdir and workdir in where.parents else str(where)

    async def insert(pool: AsyncConnectionPool) -> dict[str, object]:
        project_id = await projects.insert_project(
            pool, args.slug, workdir=str(workdir) if workdir else None, plan=plan, plan_path=plan_path)
        if project_id is None:
            raise errors.ConfigError(f"a project {args.slug!r} exists already")
        return {"project_id": str(project_id), "slug": args.slug, "workdir": str(workdir) if workdir else None,
                "plan_path": plan_path, "plan_tasks": len(plan_tasks(plan))}

    print(json.dumps(with_pool(settings, insert)))
    return 0
