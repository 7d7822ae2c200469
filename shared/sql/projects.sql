-- name: list_projects --
SELECT p.id, p.name AS slug, p.workdir, p.plan_path, p.plan, p.push_remote, p.created_at,
       (SELECT count(*) FROM tasks t WHERE t.project_id = p.id AND t.branch IS NOT NULL AND t.review IS NULL
            AND t.changes_recorded_at IS NOT NULL) AS branches_waiting
FROM projects p ORDER BY p.created_at DESC

-- name: check_project_exists --
SELECT true AS holds FROM projects WHERE id = %(id)s

-- name: get_project_detail --
SELECT p.id, p.name AS slug, p.workdir, p.plan_path, p.plan, p.push_remote, p.created_at FROM projects p
WHERE p.id = %(id)s

-- name: list_project_plan_runs --
-- The latest worker run of each plan task, and what became of its branch.
SELECT DISTINCT ON (t.plan_ref) t.plan_ref, t.id AS task_id, t.status, t.activity, t.status_reason, t.attempt,
       t.branch, t.review, t.changes_recorded_at, t.started_at, t.ended_at
FROM tasks t
WHERE t.project_id = %(id)s AND t.role = 'worker' AND t.plan_ref IS NOT NULL
ORDER BY t.plan_ref, t.created_at DESC

-- name: list_project_plan_handoffs --
-- The handoffs of a project's plan tasks, newest first (the caller groups them by plan task).
SELECT t.plan_ref, j.task_id, j.seq, j.created_at, j.payload
FROM journal j JOIN tasks t ON t.id = j.task_id
WHERE j.event_type = 'handoff' AND t.project_id = %(id)s AND t.plan_ref IS NOT NULL
ORDER BY j.seq DESC
LIMIT %(limit)s

-- name: list_project_branches_waiting --
-- Workers' branches with recorded changes that nobody merged or discarded yet.
SELECT t.id AS task_id, t.plan_ref, t.status, t.branch, t.base_branch, t.ended_at,
       (SELECT jsonb_array_length(coalesce(j.payload -> 'files', '[]')) FROM journal j
        WHERE j.task_id = t.id AND j.event_type = 'task.changes' ORDER BY j.seq DESC LIMIT 1) AS files_changed
FROM tasks t
WHERE t.project_id = %(id)s AND t.branch IS NOT NULL AND t.review IS NULL AND t.changes_recorded_at IS NOT NULL
ORDER BY t.ended_at DESC

-- name: list_project_requests --
SELECT id, action, task_id, args - 'plan' AS args, status, error, result, created_at, done_at
FROM project_queue ORDER BY created_at DESC LIMIT %(limit)s

-- name: get_project_request --
SELECT id, action, task_id, args - 'plan' AS args, status, error, result, created_at, done_at
FROM project_queue WHERE id = %(id)s

-- name: get_task_changes --
-- check: the project's check command as run on the worker's tree (its last task.check), if there is one;
-- continues_task_id: the worker a follow-up continues (its diff is since that one's reviewed commit);
-- push_remote: its project's (Push is offered when there is one); push: its last push's outcome, if any
SELECT t.id AS task_id, t.project_id, t.status, t.branch, t.base_branch, t.worktree, t.review,
       t.changes_recorded_at, t.continues_task_id, t.check_round, j.seq, j.payload,
       (SELECT c.payload FROM journal c WHERE c.task_id = t.id AND c.event_type = 'task.check'
        ORDER BY c.seq DESC LIMIT 1) AS "check",
       (SELECT push_remote FROM projects WHERE id = t.project_id) AS push_remote,
       (SELECT jsonb_build_object('pushed', u.event_type = 'task.pushed', 'at', u.created_at) || u.payload
        FROM journal u WHERE u.task_id = t.id AND u.event_type IN ('task.pushed', 'task.push_failed')
        ORDER BY u.seq DESC LIMIT 1) AS push
FROM tasks t
LEFT JOIN LATERAL (SELECT seq, payload FROM journal
                   WHERE task_id = t.id AND event_type = 'task.changes' ORDER BY seq DESC LIMIT 1) j ON true
WHERE t.id = %(id)s

-- name: list_usage --
-- Tokens and cost from each run's result line, summed by task, thread, project or UTC day. A run belongs
-- to a thread through its own session (a turn), its parent (a worker) or its grandparent (an extractor).
-- One thread's usage is list_thread_usage (read from the thread's runs, not placed among every run's).
WITH runs AS (
    SELECT j.task_id, j.created_at, j.payload, t.project_id AS task_project,
           coalesce(CASE WHEN s.role = 'orchestrator' THEN s.id END,
                    CASE WHEN ps.role = 'orchestrator' THEN ps.id END,
                    CASE WHEN pps.role = 'orchestrator' THEN pps.id END) AS thread_id
    FROM journal j
    JOIN tasks t ON t.id = j.task_id
    LEFT JOIN sessions s ON s.id = t.session_id
    LEFT JOIN tasks p ON p.id = t.parent_task_id
    LEFT JOIN sessions ps ON ps.id = p.session_id
    LEFT JOIN tasks pp ON pp.id = p.parent_task_id
    LEFT JOIN sessions pps ON pps.id = pp.session_id
    WHERE j.event_type = 'stream.result'
      -- narrowed to the runs a task or thread filter can match (the WHERE below decides), so a task's or a
      -- thread's usage reads its own result lines through (task_id, event_type, seq), not every run's
      AND (%(task_id)s::uuid IS NULL OR j.task_id = %(task_id)s::uuid)
      AND (%(thread_id)s::uuid IS NULL OR j.task_id IN (
          SELECT id FROM tasks WHERE session_id = %(thread_id)s::uuid
          UNION ALL
          SELECT w.id FROM tasks w JOIN tasks p ON p.id = w.parent_task_id WHERE p.session_id = %(thread_id)s::uuid
          UNION ALL
          SELECT x.id FROM tasks x JOIN tasks w ON w.id = x.parent_task_id JOIN tasks p ON p.id = w.parent_task_id
          WHERE p.session_id = %(thread_id)s::uuid))
), scoped AS (
    SELECT r.*, coalesce(r.task_project, ts.project_id) AS project_id
    FROM runs r LEFT JOIN sessions ts ON ts.id = r.thread_id
)
SELECT CASE %(by)s WHEN 'task' THEN task_id::text WHEN 'thread' THEN thread_id::text
                   WHEN 'project' THEN project_id::text
                   ELSE to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') END AS key,
       count(*) AS runs,
       sum(stream_count(payload -> 'usage' -> 'input_tokens'))::bigint AS input_tokens,
       sum(stream_count(payload -> 'usage' -> 'output_tokens'))::bigint AS output_tokens,
       sum(stream_count(payload -> 'usage' -> 'cache_creation_input_tokens'))::bigint
           AS cache_creation_input_tokens,
       sum(stream_count(payload -> 'usage' -> 'cache_read_input_tokens'))::bigint AS cache_read_input_tokens,
       sum(stream_cost_usd(payload))::float8 AS cost_usd
FROM scoped
WHERE (%(task_id)s::uuid IS NULL OR task_id = %(task_id)s::uuid)
  AND (%(thread_id)s::uuid IS NULL OR thread_id = %(thread_id)s::uuid)
  AND (%(project_id)s::uuid IS NULL OR project_id = %(project_id)s::uuid)
GROUP BY 1
ORDER BY 1

-- name: list_thread_usage --
-- The same sums for one thread's runs, read from those runs alone: their ids first (the thread's turns, their
-- workers and those workers' extractors), each by an index, then each one's result lines by (task_id,
-- event_type, seq). Joined the other way round, the planner hashed every task and session
-- of the store to find a thread's dozen (53 ms on 20,000 tasks, growing with them).
WITH picked AS (
    SELECT id FROM tasks WHERE session_id = %(thread_id)s::uuid
    UNION
    SELECT w.id FROM tasks w JOIN tasks p ON p.id = w.parent_task_id WHERE p.session_id = %(thread_id)s::uuid
    UNION
    SELECT x.id FROM tasks x JOIN tasks w ON w.id = x.parent_task_id JOIN tasks p ON p.id = w.parent_task_id
    WHERE p.session_id = %(thread_id)s::uuid
), runs AS (
    SELECT j.task_id, j.created_at, j.payload, t.project_id AS task_project,
           coalesce(CASE WHEN s.role = 'orchestrator' THEN s.id END,
                    CASE WHEN ps.role = 'orchestrator' THEN ps.id END,
                    CASE WHEN pps.role = 'orchestrator' THEN pps.id END) AS thread_id
    FROM picked k
    JOIN tasks t ON t.id = k.id
    CROSS JOIN LATERAL (SELECT task_id, created_at, payload FROM journal
                        WHERE task_id = t.id AND event_type = 'stream.result') j
    LEFT JOIN sessions s ON s.id = t.session_id
    LEFT JOIN tasks p ON p.id = t.parent_task_id
    LEFT JOIN sessions ps ON ps.id = p.session_id
    LEFT JOIN tasks pp ON pp.id = p.parent_task_id
    LEFT JOIN sessions pps ON pps.id = pp.session_id
), scoped AS (
    SELECT r.*, coalesce(r.task_project, ts.project_id) AS project_id
    FROM runs r LEFT JOIN sessions ts ON ts.id = r.thread_id
)
SELECT CASE %(by)s WHEN 'task' THEN task_id::text WHEN 'thread' THEN thread_id::text
                   WHEN 'project' THEN project_id::text
                   ELSE to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') END AS key,
       count(*) AS runs,
       sum(stream_count(payload -> 'usage' -> 'input_tokens'))::bigint AS input_tokens,
       sum(stream_count(payload -> 'usage' -> 'output_tokens'))::bigint AS output_tokens,
       sum(stream_count(payload -> 'usage' -> 'cache_creation_input_tokens'))::bigint
           AS cache_creation_input_tokens,
       sum(stream_count(payload -> 'usage' -> 'cache_read_input_tokens'))::bigint AS cache_read_input_tokens,
       sum(stream_cost_usd(payload))::float8 AS cost_usd
FROM scoped
WHERE (%(task_id)s::uuid IS NULL OR task_id = %(task_id)s::uuid)
  AND (%(thread_id)s::uuid IS NULL OR thread_id = %(thread_id)s::uuid)
  AND (%(project_id)s::uuid IS NULL OR project_id = %(project_id)s::uuid)
GROUP BY 1
ORDER BY 1
