-- name: insert_routine --
INSERT INTO routines (id, name, project_id, mode, prompt, enabled, cron, tz, missed, overlap, scheduled_through,
                      next_fire_at, webhook_secret, fire_token_sha256, usd_per_run, runtime_s, usd_per_day,
                      max_workers, created_by)
VALUES (%(id)s, %(name)s, %(project_id)s, %(mode)s, %(prompt)s, %(enabled)s, %(cron)s, %(tz)s, %(missed)s,
        %(overlap)s, %(now)s, %(next_fire_at)s, %(webhook_secret)s, %(fire_token_sha256)s, %(usd_per_run)s,
        %(runtime_s)s, %(usd_per_day)s, %(max_workers)s, %(created_by)s)
RETURNING id, name, project_id, mode, prompt, enabled, cron, tz, missed, overlap, next_fire_at,
          usd_per_run::float8 AS usd_per_run, usd_per_day::float8 AS usd_per_day,
          runtime_s, max_workers, created_by, created_at, webhook_secret IS NOT NULL AS webhook

-- name: list_routines --
SELECT r.id, r.name, r.project_id, r.mode, r.prompt, r.enabled, r.cron, r.tz, r.missed, r.overlap,
       r.next_fire_at, r.usd_per_run::float8 AS usd_per_run, r.runtime_s, r.usd_per_day::float8 AS usd_per_day,
       r.max_workers, r.created_by, r.created_at, r.updated_at, r.webhook_secret IS NOT NULL AS webhook,
       (SELECT to_jsonb(x) FROM (SELECT l.id, l.trigger, l.status, l.reason, l.scheduled_at, l.created_at,
                                        l.started_at, l.ended_at, l.cost_usd, l.thread_id
                                 FROM routine_runs l WHERE l.routine_id = r.id
                                 ORDER BY l.created_at DESC LIMIT 1) x) AS last_run,
       (SELECT count(*) FROM routine_runs o WHERE o.routine_id = r.id AND o.status IN ('queued', 'running'))
           AS open_runs
FROM routines r WHERE r.deleted_at IS NULL AND (%(id)s::uuid IS NULL OR r.id = %(id)s::uuid)
ORDER BY r.created_at

-- name: get_routine_for_edit --
SELECT id, name, prompt, mode, enabled, cron, tz, missed, overlap, usd_per_run::float8 AS usd_per_run, runtime_s,
       usd_per_day::float8 AS usd_per_day, max_workers, next_fire_at
FROM routines WHERE id = %(id)s AND deleted_at IS NULL FOR UPDATE

-- name: update_routine --
-- `reschedule`: the schedule changed or the routine was enabled again: instants before now are not owed.
UPDATE routines SET name = %(name)s, prompt = %(prompt)s, mode = %(mode)s, enabled = %(enabled)s, cron = %(cron)s,
                    tz = %(tz)s, missed = %(missed)s, overlap = %(overlap)s, usd_per_run = %(usd_per_run)s,
                    runtime_s = %(runtime_s)s, usd_per_day = %(usd_per_day)s, max_workers = %(max_workers)s,
                    next_fire_at = %(next_fire_at)s,
                    scheduled_through = CASE WHEN %(reschedule)s THEN %(now)s ELSE scheduled_through END,
                    updated_at = now()
WHERE id = %(id)s
RETURNING id

-- name: delete_routine --
UPDATE routines SET deleted_at = now(), enabled = false, next_fire_at = NULL, updated_at = now()
WHERE id = %(id)s AND deleted_at IS NULL
RETURNING id

-- name: get_routine_secret --
-- What the trigger endpoints verify against: the webhook's key, the fire token's hash.
SELECT id, enabled, webhook_secret, fire_token_sha256 FROM routines WHERE id = %(id)s AND deleted_at IS NULL

-- name: record_hook_body --
-- A GitHub-style delivery's body (its sha256), remembered from `now`: no row when the routine accepted the same body
-- since `since` (a replay, whatever X-GitHub-Delivery it came with). The routine's receipts older than `since` go.
WITH expired AS (
    DELETE FROM routine_hook_bodies
    WHERE routine_id = %(routine_id)s AND received_at < %(since)s AND body_sha256 <> %(body_sha256)s
)
INSERT INTO routine_hook_bodies (routine_id, body_sha256, received_at)
VALUES (%(routine_id)s, %(body_sha256)s, %(now)s)
ON CONFLICT (routine_id, body_sha256) DO UPDATE SET received_at = excluded.received_at
    WHERE routine_hook_bodies.received_at < %(since)s
RETURNING received_at

-- name: enqueue_routine_trigger --
INSERT INTO routine_queue (routine_id, trigger, event, delivery_id, requested_by)
VALUES (%(routine_id)s, %(trigger)s, %(event)s, %(delivery_id)s, %(requested_by)s)
ON CONFLICT (routine_id, delivery_id) DO NOTHING
RETURNING id, routine_id, trigger, delivery_id, created_at

-- name: list_routine_runs --
-- The trigger's event only as an excerpt: a webhook's payload may be a megabyte, and a page of runs 200 of them.
SELECT id, routine_id, trigger, scheduled_at, status, reason, prompt, thread_id, task_id, cost_usd, gate_denials,
       left(event::text, 2000) AS event_excerpt, created_at, started_at, ended_at,
       extract(epoch FROM (ended_at - started_at))::float8 AS duration_s
FROM routine_runs WHERE routine_id = %(id)s
ORDER BY created_at DESC, id LIMIT %(limit)s

-- name: list_quota_windows --
-- The account's rate-limit windows as the CLI last reported them; exhausted: unattended runs wait for resets_at.
SELECT kind, status, utilization, resets_at, updated_at,
       coalesce((status = 'rejected' OR utilization >= 1) AND resets_at > now(), false) AS exhausted
FROM quota_windows ORDER BY kind
