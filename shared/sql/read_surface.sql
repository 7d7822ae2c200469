-- name: handoffs_for_scope --
-- Newest first, for whatever scope the id names: a task, a session (and the workers it dispatched) or a project.
SELECT event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, tier, created_at, payload
FROM journal
WHERE event_type = 'handoff'
  AND (task_id = %(scope)s OR session_id = %(scope)s OR project_id = %(scope)s
       OR task_id IN (SELECT t.id FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
                      WHERE p.session_id = %(scope)s))
ORDER BY seq DESC
LIMIT %(limit)s

-- name: project_by_id --
SELECT id, name, workdir, plan, created_at FROM projects WHERE id = %(id)s

-- name: create_project --
INSERT INTO projects (name, workdir, plan) VALUES (%(name)s, %(workdir)s, %(plan)s) RETURNING id

-- name: project_latest_tasks --
-- The latest task of each plan task id, and what became of it.
SELECT DISTINCT ON (coalesce(plan_ref, id::text)) coalesce(plan_ref, '') AS plan_ref, id, status, activity,
       status_reason, ended_at
FROM tasks
WHERE project_id = %(id)s AND role = 'worker'
ORDER BY coalesce(plan_ref, id::text), created_at DESC

-- name: matching_rule_outs --
-- Prior rule-outs in the scope whose approach's words (English stems) mostly appear in the candidate.
WITH candidate AS (SELECT tsvector_to_array(to_tsvector('english', %(candidate)s)) AS words),
rule_outs AS (
    SELECT j.seq, j.task_id, r ->> 'approach' AS approach, r ->> 'reason' AS reason,
           tsvector_to_array(to_tsvector('english', coalesce(r ->> 'approach', ''))) AS words
    FROM journal j, jsonb_array_elements(
        CASE WHEN jsonb_typeof(j.payload -> 'ruled_out') = 'array' THEN j.payload -> 'ruled_out' ELSE '[]' END) r
    WHERE j.event_type = 'handoff'
      AND (j.task_id = %(scope)s OR j.session_id = %(scope)s OR j.project_id = %(scope)s
           OR j.task_id IN (SELECT t.id FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
                            WHERE p.session_id = %(scope)s))
)
SELECT r.seq, r.task_id, r.approach, r.reason,
       (SELECT count(*) FROM unnest(r.words) w WHERE w = ANY (c.words))::float
           / greatest(cardinality(r.words), 1) AS overlap
FROM rule_outs r, candidate c
WHERE cardinality(r.words) > 0
ORDER BY overlap DESC, r.seq DESC
LIMIT 20

-- name: status_tasks --
SELECT id, role, status, activity, brief, last_output_at, started_at FROM tasks
WHERE status IN ('pending', 'running') ORDER BY created_at

-- name: status_queue --
SELECT id, thread_id, origin, left(text, 120) AS text, created_at FROM chat_queue
WHERE status IN ('pending', 'claimed') ORDER BY created_at

-- name: status_asks --
SELECT id, tool_use_id, task_id, questions, created_at FROM questions WHERE status = 'pending' ORDER BY created_at

-- name: journal_filtered --
SELECT event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, tier, created_at, payload
FROM journal
WHERE seq > %(after)s
  AND (%(task_id)s::uuid IS NULL OR task_id = %(task_id)s::uuid)
  AND (%(thread_id)s::uuid IS NULL OR session_id = %(thread_id)s::uuid
       OR task_id IN (SELECT id FROM tasks WHERE session_id = %(thread_id)s::uuid
                      UNION SELECT t.id FROM tasks t JOIN tasks p ON p.id = t.parent_task_id
                            WHERE p.session_id = %(thread_id)s::uuid))
  AND event_type <> 'stream.stream_event'
ORDER BY seq
LIMIT %(limit)s

-- name: status_last_events --
SELECT seq, event_type, task_id, created_at FROM (
    SELECT seq, event_type, task_id, created_at FROM journal ORDER BY seq DESC LIMIT 5) last
ORDER BY seq

-- name: status_executors --
-- The fleet: every executor the database knows, its load and how old its lease is. `state`: live, stopped
-- (a clean stop), lost (a survivor took it over) or expired (not renewed, not yet taken over).
SELECT e.name, e.labels, e.capacity, e.version, e.epoch, e.started_at,
       (SELECT count(*) FROM tasks t WHERE t.executor_name = e.name AND t.status = 'running')::int AS load,
       round(extract(epoch FROM now() - e.renewed_at)::numeric, 1)::float8 AS lease_age_s,
       CASE WHEN e.lost_at IS NOT NULL THEN 'lost' WHEN e.stopped_at IS NOT NULL THEN 'stopped'
            WHEN e.lease_until < now() THEN 'expired' ELSE 'live' END AS state
FROM executors e ORDER BY e.name
