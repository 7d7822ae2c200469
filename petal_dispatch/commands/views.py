"""`petal-dispatch journal` and `petal-dispatch status`: the store read as terminal lines, as the ingress
role (read-only: they never start a server)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from petal_dispatch import dbserver
from petal_dispatch.commands import ids
from petal_dispatch.config import Settings
from petal_dispatch.journal_view import inert, line
from shared.database import Database
from shared.journal import read_lines


def journal(args: argparse.Namespace, settings: Settings) -> int:
    limit = 500
    info = dbserver.resolve(settings, start=False)  # read-only: never starts a server

    async def run() -> None:
        async with Database(info.ingress_dsn, name="petal-journal", max_size=2) as db:
            # ids as `status` prints them: a unique prefix names one
            task_id = await ids.resolve_on(db.pool, "task", args.task) if args.task else None
            thread_id = await ids.resolve_on(db.pool, "thread", args.thread) if args.thread else None
            listener = db.listener(["journal"]) if args.follow else None
            sub = listener.subscribe() if listener else None
            listening = asyncio.create_task(listener.run()) if listener else None
            after = 0
            try:
                while True:
                    events = await read_lines(db.pool, after=after, task_id=task_id, thread_id=thread_id, limit=limit)
                    for e in events:
                        print(line(e), flush=True)
                        after = e.seq
                    if len(events) == limit:
                        continue
                    if sub is None:
                        return
                    await sub.get()
            finally:
                if listening:
                    listening.cancel()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


def status(args: argparse.Namespace, settings: Settings) -> int:
    from ingress import reads

    info = dbserver.resolve(settings, start=False)  # read-only: never starts a server

    async def gather() -> dict[str, list[dict[str, Any]]]:
        async with Database(info.ingress_dsn, name="petal-status", max_size=1) as db:
            return await reads.status(db.pool)

    state = asyncio.run(gather())
    if args.json:
        print(json.dumps(state, default=str, indent=2))
        return 0
    print(f"tasks ({len(state['tasks'])} open)")
    for t in state["tasks"]:
        activity = (t["activity"] or t["status"]).upper() if t["activity"] in ("stalled", "awaiting_user") else (
            t["activity"] or t["status"])
        last = t["last_output_at"].strftime("%H:%M:%S") if t["last_output_at"] else "-"
        brief = " ".join(str(t["brief"]).split())[:70]
        print(inert(f"  {str(t['id'])[:8]} {t['role']:<12} {activity:<14} last output {last}  {brief}"))
    print(f"queued messages ({len(state['queue'])})")
    for q in state["queue"]:
        print(inert(f"  {str(q['id'])[:8]} thread {str(q['thread_id'])[:8]} {q['origin']:<8} {q['text']}"))
    print(f"pending asks ({len(state['asks'])})")
    for a in state["asks"]:
        questions = " / ".join(str(x.get("question", "")) for x in a["questions"])
        print(inert(f"  {a['tool_use_id']} task {str(a['task_id'])[:8]}  {questions}"))
    print(f"executors ({len(state['executors'])})")
    for x in state["executors"]:
        labels = ",".join(x["labels"]) or "-"
        print(inert(f"  {x['name']:<20} {x['state']:<8} load {x['load']}/{x['capacity']}  lease age "
                    f"{x['lease_age_s']}s  labels {labels}  version {x['version']}"))
        if x.get("workdir"):
            print(inert(f"  {'':<20} workdir {x['workdir']}"))
    print("last events")
    for e in state["last_events"]:
        print(f"  {e['seq']:>7} {e['created_at']:%H:%M:%S} {e['event_type']}")
    return 0
