-- name: list_threads --
-- resume_command: what continues the thread's CLI conversation in a terminal (set at its first turn, or
-- when it was made from a stored conversation); adopted_session_id: the conversation it was made from;
-- routine_id: the routine whose run the thread is (the page lists run threads apart). Newest first, a page
-- at a time (keyset: the last row's created_at and id); threads still being made come on the first page.
SELECT s.id, s.title, s.mode, s.lifecycle, s.created_at, s.updated_at, false AS pending, s.project_id,
       s.resume_command, s.adopted_session_id, s.executor_name,
       (SELECT r.routine_id FROM routine_runs r WHERE r.thread_id = s.id LIMIT 1) AS routine_id,
       -- live in a terminal (migration 0047): who holds its screen (NULL: detached), and whether a message waits
       (SELECT jsonb_build_object('task_id', ts.task_id, 'held_by', ts.held_by, 'input_waiting', ts.input_waiting,
                                  'cwd', ts.cwd, 'started_at', ts.started_at, 'sandboxed', ts.sandboxed)
        FROM terminal_sessions ts WHERE ts.thread_id = s.id AND ts.ended_at IS NULL) AS terminal
FROM sessions s WHERE s.role = 'orchestrator'
  AND (%(before_at)s::timestamptz IS NULL OR (s.created_at, s.id) < (%(before_at)s, %(before_id)s::uuid))
UNION ALL
SELECT q.thread_id, q.args ->> 'title', coalesce(q.args ->> 'mode', 'interactive'), 'creating', q.created_at,
       q.created_at, true, (q.args ->> 'project_id')::uuid,
       NULL, q.args -> 'adopt' ->> 'session_id', q.args -> 'adopt' ->> 'executor', NULL, NULL
FROM thread_control_queue q
WHERE q.action = 'create' AND q.status IN ('pending', 'claimed') AND %(before_at)s::timestamptz IS NULL
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = q.thread_id)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: list_pending_chat --
-- with each message's files (no bytes), in the order sent: the page shows them on the pending message
SELECT id, thread_id, text, client_msg_id, origin, status, created_at,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('id', a.id, 'name', a.name, 'media_type', a.media_type,
                                                     'size', a.size_bytes)
                                  ORDER BY array_position(c.attachment_ids, a.id)), '[]'::jsonb)
        FROM attachments a WHERE a.id = ANY(c.attachment_ids)) AS attachments
FROM chat_queue c
WHERE status IN ('pending', 'claimed') AND (%(thread_id)s::uuid IS NULL OR thread_id = %(thread_id)s::uuid)
ORDER BY created_at

-- name: list_tasks --
-- Newest first, a page at a time (keyset: the last row's created_at and id).
SELECT t.id, t.project_id, t.session_id, t.parent_task_id, t.role, t.brief, t.plan_ref, t.status, t.activity,
       t.status_reason, t.exit_code, t.exit_signal, t.pid, t.attempt, t.last_output_at, t.created_at,
       t.started_at, t.ended_at, t.retry_of, t.not_before
FROM tasks t
WHERE (%(status)s::text IS NULL OR t.status = %(status)s::text)
  AND (%(running)s::boolean IS NULL OR (t.status = 'running') = %(running)s::boolean)
  AND (%(before_at)s::timestamptz IS NULL OR (t.created_at, t.id) < (%(before_at)s, %(before_id)s::uuid))
ORDER BY t.created_at DESC, t.id DESC
LIMIT %(limit)s

-- name: list_thread_tasks --
-- One thread's tasks (its turns and the workers they dispatched), newest first, a page at a time: picked by
-- their indexes, then sorted. Filtered while walking every task newest first (list_tasks' index), a thread's
-- dozen cost a read of the whole table (12 ms on 20,000 tasks, growing with them).
SELECT t.id, t.project_id, t.session_id, t.parent_task_id, t.role, t.brief, t.plan_ref, t.status, t.activity,
       t.status_reason, t.exit_code, t.exit_signal, t.pid, t.attempt, t.last_output_at, t.created_at,
       t.started_at, t.ended_at, t.retry_of, t.not_before
FROM tasks t
WHERE t.id IN (SELECT id FROM tasks WHERE session_id = %(thread_id)s::uuid
               UNION
               SELECT w.id FROM tasks w JOIN tasks p ON p.id = w.parent_task_id
               WHERE p.session_id = %(thread_id)s::uuid)
  AND (%(status)s::text IS NULL OR t.status = %(status)s::text)
  AND (%(running)s::boolean IS NULL OR (t.status = 'running') = %(running)s::boolean)
  AND (%(before_at)s::timestamptz IS NULL OR (t.created_at, t.id) < (%(before_at)s, %(before_id)s::uuid))
ORDER BY t.created_at DESC, t.id DESC
LIMIT %(limit)s

-- name: get_task --
SELECT t.id, t.project_id, t.session_id, t.parent_task_id, t.role, t.brief, t.plan_ref, t.status, t.activity,
       t.status_reason, t.exit_code, t.exit_signal, t.pid, t.attempt, t.last_output_at, t.created_at,
       t.started_at, t.ended_at
FROM tasks t WHERE t.id = %(id)s

-- name: list_events --
-- Records by seq: at most `limit`, and past the first only while those before come to less than %(max_bytes)s as
-- JSON text (a spawn's stdout line is a record, and can be 64 MiB); `rows_in_page`: how many the count alone took.
SELECT * FROM (
    SELECT page.*, sum(octet_length(payload::text)) OVER (ORDER BY seq) - octet_length(payload::text) AS bytes_before,
           count(*) OVER () AS rows_in_page
    FROM (SELECT event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, tier, created_at,
                 payload
          FROM journal
          WHERE seq > %(after)s
            AND (%(tier)s::text IS NULL OR tier = %(tier)s::text)
            AND (%(task_id)s::uuid IS NULL OR task_id = %(task_id)s::uuid)
            AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s::text)
          ORDER BY seq
          LIMIT %(limit)s) page
) sized WHERE bytes_before < %(max_bytes)s ORDER BY seq

-- name: list_task_events --
-- One task's records by seq, read in the order of its index, (task_id, seq). The task is named as a one-element
-- array, not by an equality: with `task_id = …` the planner treats task_id as fixed, orders by seq alone, and
-- may walk the journal's seq index looking for a long task's records (it assumes they are spread evenly over
-- the journal; they sit in one stretch of it), reading everything before that stretch. With `= ANY` the
-- order asked for is (task_id, seq), which only that index gives. (tests/store/test_query_plans.py)
-- Bounded by size as list_events is.
SELECT * FROM (
    SELECT page.*, sum(octet_length(payload::text)) OVER (ORDER BY seq) - octet_length(payload::text) AS bytes_before,
           count(*) OVER () AS rows_in_page
    FROM (SELECT event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, tier, created_at,
                 payload
          FROM journal
          WHERE task_id = ANY(ARRAY[%(task_id)s::uuid]) AND seq > %(after)s
            AND (%(tier)s::text IS NULL OR tier = %(tier)s::text)
            AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s::text)
          ORDER BY task_id, seq
          LIMIT %(limit)s) page
) sized WHERE bytes_before < %(max_bytes)s ORDER BY seq

-- name: get_thread --
SELECT s.id, s.title, s.mode, s.lifecycle, s.substrate_session_id, s.created_at, s.updated_at, s.project_id,
       s.resume_command, s.adopted_session_id, s.cli_session_id, s.cli_workdir, s.executor_name,
       (SELECT r.routine_id FROM routine_runs r WHERE r.thread_id = s.id LIMIT 1) AS routine_id
FROM sessions s WHERE s.id = %(id)s AND s.role = 'orchestrator'

-- name: list_asks --
-- Pending first, then the newest: each part read newest first and cut at `limit` (the pending ones from
-- their partial index, the rest by created_at), so the answered history's length does not count. The scoped
-- questions are written once and inlined into each part (NOT MATERIALIZED), so each keeps its own index.
WITH scoped AS NOT MATERIALIZED (
    SELECT q.id, q.tool_use_id, q.source_session_uuid, q.task_id, q.questions, q.status, q.answers, q.response,
           q.asked_by, q.created_at, q.answered_at, q.answered_by, q.answered_via, q.timed_out_at,
           q.timed_out_at IS NOT NULL AS late,
           coalesce(q.source_session_uuid, t.session_id, p.session_id) AS thread_scope
    FROM questions q
    LEFT JOIN tasks t ON t.id = q.task_id
    LEFT JOIN tasks p ON p.id = t.parent_task_id
    WHERE %(thread_id)s::uuid IS NULL OR q.source_session_uuid = %(thread_id)s::uuid
          OR t.session_id = %(thread_id)s::uuid OR p.session_id = %(thread_id)s::uuid
)
SELECT * FROM (
    (SELECT * FROM scoped WHERE status = 'pending' AND (%(status)s::text IS NULL OR %(status)s::text = 'pending')
     ORDER BY created_at DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM scoped WHERE status <> 'pending' AND (%(status)s::text IS NULL OR status = %(status)s::text)
     ORDER BY created_at DESC LIMIT %(limit)s)
) asks
ORDER BY (status = 'pending') DESC, created_at DESC
LIMIT %(limit)s

-- name: count_applied_migrations --
SELECT count(*) FROM schema_migrations

-- name: list_thread_conversation --
-- What a thread's chat renders: its own records and those of the workers its turns dispatched (and their
-- retries), the newest `limit` of them (before `before`, when paging back), oldest first. Two disjoint parts,
-- each read newest first from its own index and cut at `limit`: the thread's records by (session_id, seq),
-- each worker's by (task_id, event_type, seq). (One scan over `session_id = … OR task_id IN …` walks the
-- journal by seq until it has found `limit`: the older the thread, the more of the journal it reads.)
-- The thread's part also has what its turns said on the way (an assistant message with text, such as the words
-- before a tool call): the final reply is only the last of them.
SELECT * FROM (
SELECT newest_page.*,
       sum(octet_length(payload::text)) OVER (ORDER BY seq DESC) - octet_length(payload::text) AS bytes_after,
       count(*) OVER () AS rows_in_page
FROM (
    SELECT * FROM (
        (SELECT event_id, seq, project_id, session_id, task_id, parent_id, message_id, event_type, tier, created_at,
                payload
         FROM journal
         -- the thread as a one-element array, not an equality: see list_task_events
         WHERE session_id = ANY(ARRAY[%(thread_id)s::uuid]) AND seq > %(after)s
           AND (%(before)s::bigint IS NULL OR seq < %(before)s::bigint)
           AND (event_type = ANY(%(types)s) OR (event_type = 'stream.assistant'
                                                AND payload -> 'message' -> 'content' @> '[{"type": "text"}]'))
         ORDER BY session_id DESC, seq DESC
         LIMIT %(limit)s)
        UNION ALL
        (SELECT j.event_id, j.seq, j.project_id, j.session_id, j.task_id, j.parent_id, j.message_id, j.event_type,
                j.tier, j.created_at, j.payload
         FROM tasks p JOIN tasks w ON w.parent_task_id = p.id
         CROSS JOIN LATERAL (
             SELECT * FROM journal
             WHERE task_id = w.id AND event_type = ANY(%(types)s) AND seq > %(after)s
               AND (%(before)s::bigint IS NULL OR seq < %(before)s::bigint)
               AND session_id IS DISTINCT FROM %(thread_id)s
             ORDER BY seq DESC
             LIMIT %(limit)s) j
         WHERE p.session_id = %(thread_id)s)
    ) parts
    ORDER BY seq DESC
    LIMIT %(limit)s
) newest_page
-- the newest kept while what comes after them comes to less than %(max_bytes)s (see list_events)
) sized WHERE bytes_after < %(max_bytes)s ORDER BY seq

-- name: list_turn_reruns --
-- Which of these turns a later run already repeats (a failed turn's Retry is then spent).
SELECT retry_of, id FROM tasks WHERE retry_of = ANY(%(ids)s::uuid[])

-- name: list_executors --
-- The fleet: each executor's labels, load against capacity, lease age, version and state (live; stopped:
-- a clean stop; lost: a survivor took it over; expired: not renewed, not yet taken over).
SELECT e.name, e.labels, e.capacity, e.version, e.epoch, e.started_at, e.renewed_at, e.lost_at, e.sandbox,
       e.workdir,
       (SELECT count(*) FROM tasks t WHERE t.executor_name = e.name AND t.status = 'running')::int AS load,
       round(extract(epoch FROM now() - e.renewed_at)::numeric, 1)::float8 AS lease_age_s,
       CASE WHEN e.lost_at IS NOT NULL THEN 'lost' WHEN e.stopped_at IS NOT NULL THEN 'stopped'
            WHEN e.lease_until < now() THEN 'expired' ELSE 'live' END AS state
FROM executors e ORDER BY e.name

-- name: list_open_tasks --
-- `petal-dispatch status`: the tasks not ended, oldest first.
SELECT id, role, status, activity, brief, last_output_at, started_at FROM tasks
WHERE status IN ('pending', 'running') ORDER BY created_at

-- name: list_queued_messages --
SELECT id, thread_id, origin, left(text, 120) AS text, created_at FROM chat_queue
WHERE status IN ('pending', 'claimed') ORDER BY created_at

-- name: list_pending_asks --
SELECT id, tool_use_id, task_id, questions, created_at FROM questions WHERE status = 'pending' ORDER BY created_at

-- name: list_last_events --
SELECT seq, event_type, task_id, created_at FROM (
    SELECT seq, event_type, task_id, created_at FROM journal ORDER BY seq DESC LIMIT 5) last
ORDER BY seq

-- name: list_executor_workdirs --
-- Live executors and where their tasks without a project run (PETAL_WORKDIR): the page's Context and /api/info.
SELECT name, workdir FROM executors
WHERE stopped_at IS NULL AND lost_at IS NULL AND lease_until > now() ORDER BY name

-- name: list_unsandboxed_executors --
-- Live executors whose spawns run unsandboxed (PETAL_SANDBOX=off): the page warns while there is one.
SELECT name FROM executors
WHERE sandbox = 'off' AND stopped_at IS NULL AND lost_at IS NULL AND lease_until > now() ORDER BY name
