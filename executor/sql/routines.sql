-- name: claim_routine_triggers --
-- Triggers the ingress verified become queued runs, once: the queue row is marked done in the statement
-- that inserts its run (queue_id is unique), whichever executor takes it.
WITH claimed AS (
    SELECT id FROM routine_queue WHERE status = 'pending' ORDER BY created_at LIMIT 20 FOR UPDATE SKIP LOCKED
), done AS (
    UPDATE routine_queue q SET status = 'done' FROM claimed c WHERE q.id = c.id
    RETURNING q.id, q.routine_id, q.trigger, q.event
)
INSERT INTO routine_runs (routine_id, trigger, queue_id, event)
SELECT routine_id, trigger, id, event FROM done
ON CONFLICT (queue_id) DO NOTHING
RETURNING id, routine_id, trigger

-- name: claim_due_routine --
-- A routine whose next instant has come (by the scheduler's clock). Locked, so executors that race for it
-- agree on the missed-instant policy; the run's unique (routine_id, scheduled_at) is what makes each instant
-- run at most once even without the lock. NO KEY UPDATE: a trigger queued meanwhile (its row's key check on the
-- routine) does not wait for it.
SELECT id, name, cron, tz, missed, scheduled_through, next_fire_at FROM routines
WHERE next_fire_at <= %(now)s AND enabled AND deleted_at IS NULL AND cron IS NOT NULL
ORDER BY next_fire_at LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED

-- name: insert_scheduled_run --
INSERT INTO routine_runs (routine_id, trigger, scheduled_at, event)
VALUES (%(routine_id)s, 'schedule', %(scheduled_at)s, %(event)s)
ON CONFLICT (routine_id, scheduled_at) DO NOTHING
RETURNING id

-- name: mark_routine_scheduled --
UPDATE routines SET scheduled_through = greatest(scheduled_through, %(through)s), next_fire_at = %(next_fire_at)s
WHERE id = %(id)s

-- name: get_next_routine_fire --
-- The earliest instant any routine waits for: the scheduler's timer sleeps until then.
SELECT min(next_fire_at) AS at FROM routines WHERE enabled AND deleted_at IS NULL AND next_fire_at IS NOT NULL

-- name: claim_queued_run --
-- The oldest queued run that may be decided now, its routine locked with it (overlap and budgets are decided
-- under that lock, so two executors never both start the one run a routine may have). A routine whose
-- overlap is `queue` offers only its oldest queued run, and only once none of its runs is running.
SELECT r.id, r.routine_id, r.trigger, r.scheduled_at, r.event, r.created_at,
       rt.name, rt.project_id, rt.mode, rt.prompt, rt.overlap, rt.usd_per_run, rt.runtime_s, rt.usd_per_day,
       rt.deleted_at, rt.cron, rt.tz,
       EXISTS (SELECT 1 FROM routine_runs o WHERE o.routine_id = r.routine_id AND o.status = 'running') AS overlapping
FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
WHERE r.status = 'queued'
  AND NOT (rt.overlap = 'queue' AND rt.deleted_at IS NULL AND (
      EXISTS (SELECT 1 FROM routine_runs o WHERE o.routine_id = r.routine_id AND o.status = 'running')
      OR EXISTS (SELECT 1 FROM routine_runs o WHERE o.routine_id = r.routine_id AND o.status = 'queued'
                 AND (o.created_at, o.id) < (r.created_at, r.id))))
ORDER BY r.created_at LIMIT 1
FOR NO KEY UPDATE OF r, rt SKIP LOCKED

-- name: get_routine_spend_today --
-- What a routine's runs since `since` cost: ended runs their cost, running ones their per-run cap with what the
-- user raised it by (the most they may still spend), so a day's cap holds while runs are under way.
SELECT coalesce(sum(CASE WHEN r.status = 'running' THEN (coalesce(rt.usd_per_run, 0) + r.usd_raised)::float8
                         ELSE coalesce(r.cost_usd, 0) END), 0)::float8 AS usd
FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
WHERE r.routine_id = %(routine_id)s AND r.started_at >= %(since)s

-- name: get_project_routine_spend_today --
-- The same over every routine of a project (the per-project day cap).
SELECT coalesce(sum(CASE WHEN r.status = 'running' THEN (coalesce(rt.usd_per_run, 0) + r.usd_raised)::float8
                         ELSE coalesce(r.cost_usd, 0) END), 0)::float8 AS usd
FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
WHERE rt.project_id = %(project_id)s AND r.started_at >= %(since)s

-- name: stop_overdue_runs --
-- A run past its routine's runtime is stopped: every running task of it (turns, workers, extractors), once.
WITH RECURSIVE overdue AS (
    SELECT r.id AS run_id, r.thread_id FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
    WHERE r.status = 'running' AND rt.runtime_s IS NOT NULL
      AND r.started_at + make_interval(secs => rt.runtime_s) < %(now)s
), marked AS (
    UPDATE routine_runs r SET reason = 'runtime cap' FROM overdue o WHERE r.id = o.run_id AND r.reason IS NULL
), run_tasks AS (
    SELECT o.run_id, t.id, t.status FROM overdue o JOIN tasks t ON t.session_id = o.thread_id
    UNION ALL
    SELECT x.run_id, c.id, c.status FROM run_tasks x JOIN tasks c ON c.parent_task_id = x.id
)
INSERT INTO stop_queue (task_id, reason)
SELECT x.id, 'the routine''s runtime cap' FROM run_tasks x
WHERE x.status = 'running' AND NOT EXISTS (SELECT 1 FROM stop_queue q WHERE q.task_id = x.id)
RETURNING task_id

-- name: mark_run_skipped --
UPDATE routine_runs SET status = 'skipped', reason = %(reason)s, ended_at = now() WHERE id = %(id)s

-- name: mark_run_failed --
UPDATE routine_runs SET status = 'failed', reason = %(reason)s, prompt = %(prompt)s, ended_at = now()
WHERE id = %(id)s

-- name: mark_run_started --
UPDATE routine_runs SET status = 'running', prompt = %(prompt)s, thread_id = %(thread_id)s, task_id = %(task_id)s,
                        started_at = now(), reason = NULL
WHERE id = %(id)s

-- name: create_routine_thread --
-- The run's own thread, in the routine's project and mode: its conversation is the run's history.
INSERT INTO sessions (id, role, lifecycle, title, mode, project_id)
VALUES (%(id)s, 'orchestrator', 'idle', %(title)s, %(mode)s, %(project_id)s)

-- name: get_routine_project --
SELECT id, name, workdir, plan FROM projects WHERE id = %(id)s

-- name: list_ended_runs --
-- Running runs whose work has all ended and been settled: no turn or worker (or its extractor) of the run's
-- thread still open, and no message waiting in the thread (a worker's handoff starts another turn).
WITH RECURSIVE run_tasks AS (
    SELECT r.id AS run_id, t.id, t.status, t.settled_at
    FROM routine_runs r JOIN tasks t ON t.session_id = r.thread_id WHERE r.status = 'running'
    UNION ALL
    SELECT x.run_id, c.id, c.status, c.settled_at FROM run_tasks x JOIN tasks c ON c.parent_task_id = x.id
)
SELECT r.id FROM routine_runs r
WHERE r.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM run_tasks x WHERE x.run_id = r.id
                  AND (x.status IN ('pending', 'running') OR x.settled_at IS NULL))
  AND NOT EXISTS (SELECT 1 FROM chat_queue c WHERE c.thread_id = r.thread_id AND c.status IN ('pending', 'claimed'))
  -- paused on a budget ask: the run goes on or ends with the user's answer (migration 0045)
  AND NOT EXISTS (SELECT 1 FROM escalations e WHERE e.run_id = r.id AND e.status = 'open')
ORDER BY r.started_at LIMIT 20

-- name: claim_running_run --
SELECT r.id, r.routine_id, r.trigger, r.scheduled_at, r.thread_id, r.task_id, r.started_at, rt.name, rt.project_id,
       rt.runtime_s, r.reason = 'runtime cap' AS overran
FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
WHERE r.id = %(id)s AND r.status = 'running' FOR UPDATE OF r SKIP LOCKED

-- name: get_run_outcome --
-- What the run's tasks came to: its last turn's status, a process not started for the run's budget, the cost
-- of every run's result line, the gate's denials (tool and summary).
WITH RECURSIVE run_tasks AS (
    SELECT t.id, t.role, t.status, t.status_reason, t.created_at FROM tasks t WHERE t.session_id = %(thread_id)s
    UNION ALL
    SELECT c.id, c.role, c.status, c.status_reason, c.created_at FROM run_tasks x JOIN tasks c ON c.parent_task_id = x.id
), budget_asks AS (
    SELECT e.reason, e.created_at FROM escalations e JOIN routine_runs r ON r.id = e.run_id
    WHERE r.thread_id = %(thread_id)s AND e.kind = 'budget'
)
SELECT (SELECT status FROM run_tasks WHERE role = 'orchestrator' ORDER BY created_at DESC LIMIT 1) AS last_status,
       (SELECT status_reason FROM run_tasks WHERE role = 'orchestrator' ORDER BY created_at DESC LIMIT 1) AS last_reason,
       -- with budget asks, the last one says (NULL: raised, the run went on); without, a process not started
       CASE WHEN EXISTS (SELECT 1 FROM budget_asks)
            THEN (SELECT reason FROM budget_asks ORDER BY created_at DESC LIMIT 1)
            ELSE (SELECT status_reason FROM run_tasks WHERE status = 'skipped' AND status_reason LIKE 'budget:%%'
                  ORDER BY created_at LIMIT 1) END AS budget_reason,
       (SELECT coalesce(sum(stream_cost_usd(j.payload)), 0)::float8 FROM journal j
        WHERE j.event_type = 'stream.result' AND j.task_id IN (SELECT id FROM run_tasks)) AS cost_usd,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('tool', j.payload ->> 'tool', 'summary', j.payload ->> 'summary',
                                                     'category', j.payload ->> 'category') ORDER BY j.seq), '[]')
        FROM journal j WHERE j.event_type = 'gate.decided' AND j.payload ->> 'decision' = 'deny'
          AND j.task_id IN (SELECT id FROM run_tasks)) AS gate_denials

-- name: mark_run_ended --
UPDATE routine_runs SET status = %(status)s, reason = %(reason)s, cost_usd = %(cost_usd)s,
                        gate_denials = %(gate_denials)s, ended_at = now()
WHERE id = %(id)s
RETURNING ended_at

-- name: record_quota_windows --
-- The rate_limit_event lines journaled since the cursor: the latest per window is kept, the cursor moves past them.
-- A line is the spawn's word (a process in its sandbox can write the CLI's output): a window's name is a plain word,
-- and no reset is believed further than 8 days past its line (the longest window is a week), so a forged one holds
-- the routines for at most that long, and never under a name no real line would overwrite.
WITH cur AS (
    SELECT seq FROM quota_cursor FOR UPDATE
), lines AS (
    SELECT j.seq, j.created_at, j.payload -> 'rate_limit_info' AS info FROM journal j, cur
    WHERE j.event_type = 'stream.rate_limit_event' AND j.seq > cur.seq ORDER BY j.seq LIMIT 500
), latest AS (
    SELECT DISTINCT ON (coalesce(info ->> 'rateLimitType', 'unknown'))
           coalesce(info ->> 'rateLimitType', 'unknown') AS kind, info, seq, created_at
    FROM lines WHERE jsonb_typeof(info) = 'object' AND coalesce(info ->> 'rateLimitType', 'unknown') ~ '^[a-z0-9_]{1,40}$'
    ORDER BY coalesce(info ->> 'rateLimitType', 'unknown'), seq DESC
), moved AS (
    UPDATE quota_cursor SET seq = (SELECT max(seq) FROM lines) WHERE EXISTS (SELECT 1 FROM lines)
)
INSERT INTO quota_windows (kind, status, utilization, resets_at, seq, updated_at)
SELECT left(kind, 100), left(coalesce(info ->> 'status', 'unknown'), 100),
       CASE WHEN jsonb_typeof(info -> 'utilization') = 'number'
            THEN least(greatest((info ->> 'utilization')::numeric, 0), 1e6)::float8 END,
       CASE WHEN jsonb_typeof(info -> 'resetsAt') = 'number'
            THEN least(to_timestamp(greatest(least((info ->> 'resetsAt')::numeric, 1e10), 0)::float8),
                       created_at + interval '8 days') END,
       seq, created_at
FROM latest
ON CONFLICT (kind) DO UPDATE SET status = EXCLUDED.status, utilization = EXCLUDED.utilization,
    resets_at = EXCLUDED.resets_at, seq = EXCLUDED.seq, updated_at = EXCLUDED.updated_at
WHERE quota_windows.seq < EXCLUDED.seq
RETURNING kind, status, utilization, resets_at

-- name: get_quota_wait --
-- The exhausted window that resets last (a rejected status, or all of it used), while its reset is ahead.
SELECT kind, resets_at FROM quota_windows
WHERE (status = 'rejected' OR utilization >= 1) AND resets_at > %(now)s
ORDER BY resets_at DESC LIMIT 1

-- name: mark_runs_waiting --
UPDATE routine_runs SET reason = %(reason)s WHERE status = 'queued' AND reason IS DISTINCT FROM %(reason)s
RETURNING id
