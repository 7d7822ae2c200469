-- The CLI's stored conversations the executors published (executor/sessions/), and threads made from them.

-- name: list_claude_sessions --
-- The user's conversations, newest first: not those petal itself started for its workers, extractors and
-- routine runs (their threads and tasks show them; each one's CLI conversation is named by its session's id,
-- or the thread's cli_session_id). `q` matches the title, the directory or the id (as text, no wildcards),
-- `dir` the directory and everything under it. thread_id: the live thread that continues it, if any.
SELECT c.executor, c.session_id, c.cwd, c.title, c.git_branch, c.last_activity, c.message_count, c.size_bytes,
       c.live_pid IS NOT NULL AS live, c.live_pid, c.readable, c.unreadable_reason, c.adoptable, c.config_dir,
       c.indexed_at,
       -- whether the executor holding it runs (an adoption is made there)
       EXISTS (SELECT 1 FROM executors e WHERE e.name = c.executor AND e.lost_at IS NULL AND e.stopped_at IS NULL
               AND e.lease_until > now()) AS executor_live,
       (SELECT s.id FROM sessions s
        WHERE s.role = 'orchestrator' AND s.lifecycle <> 'archived'
          AND (s.cli_session_id = c.session_id OR s.adopted_session_id = c.session_id
               OR s.id = CASE WHEN c.session_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                              THEN c.session_id::uuid END)
        ORDER BY s.created_at DESC LIMIT 1) AS thread_id
FROM claude_sessions c
WHERE (%(q)s::text IS NULL OR strpos(lower(coalesce(c.title, '')), lower(%(q)s)) > 0
       OR strpos(lower(coalesce(c.cwd, '')), lower(%(q)s)) > 0 OR strpos(c.session_id, lower(%(q)s)) > 0)
  AND (%(dir)s::text IS NULL OR c.cwd = %(dir)s OR left(c.cwd, length(%(dir)s) + 1) = rtrim(%(dir)s, '/') || '/')
  AND (%(executor)s::text IS NULL OR c.executor = %(executor)s)
  AND NOT EXISTS (SELECT 1 FROM sessions s
                  WHERE (s.id = CASE WHEN c.session_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                                     THEN c.session_id::uuid END
                         OR s.cli_session_id = c.session_id)
                    AND (s.role <> 'orchestrator' OR EXISTS (SELECT 1 FROM routine_runs r WHERE r.thread_id = s.id)))
ORDER BY c.last_activity DESC NULLS LAST, c.executor, c.session_id
LIMIT %(limit)s OFFSET %(offset)s

-- name: list_live_terminals --
-- The terminal sessions executors hold now (migration 0047), newest first: their thread, conversation, directory,
-- and the terminal showing each (NULL: detached).
SELECT ts.thread_id, ts.task_id, ts.cli_session_id AS session_id, ts.cwd, ts.held_by, ts.input_waiting,
       ts.executor_name AS executor, ts.started_at, s.title
FROM terminal_sessions ts JOIN sessions s ON s.id = ts.thread_id
WHERE ts.ended_at IS NULL
ORDER BY ts.started_at DESC

-- name: list_claude_session_dirs --
-- The directories the user's conversations were held in, busiest first: the picker's directory filter (petal's
-- own conversations left out as in list_claude_sessions).
SELECT cwd, count(*) AS sessions, max(last_activity) AS last_activity
FROM claude_sessions c WHERE cwd IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM sessions s
                  WHERE (s.id = CASE WHEN c.session_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                                     THEN c.session_id::uuid END
                         OR s.cli_session_id = c.session_id)
                    AND (s.role <> 'orchestrator' OR EXISTS (SELECT 1 FROM routine_runs r WHERE r.thread_id = s.id)))
GROUP BY cwd ORDER BY max(last_activity) DESC NULLS LAST LIMIT 100

-- name: list_claude_session_holders --
SELECT c.executor, c.session_id, c.cwd, c.title, c.readable, c.unreadable_reason, c.adoptable, c.live_pid,
       EXISTS (SELECT 1 FROM executors e WHERE e.name = c.executor AND e.lost_at IS NULL AND e.stopped_at IS NULL
               AND e.lease_until > now()) AS executor_live
FROM claude_sessions c WHERE c.session_id = %(session_id)s ORDER BY c.executor

-- name: check_conversation_continued --
-- A thread that is not archived already continues it, or an adoption of it waits in the queue.
SELECT s.id FROM sessions s
WHERE s.role = 'orchestrator' AND s.lifecycle <> 'archived'
  AND (s.cli_session_id = %(session_id)s OR s.id = %(session_id)s::uuid
       OR (s.adopted_session_id = %(session_id)s AND s.cli_fork_from IS NULL))
UNION ALL
SELECT q.thread_id FROM thread_control_queue q
WHERE q.action = 'create' AND q.status IN ('pending', 'claimed') AND q.args -> 'adopt' ->> 'session_id' = %(session_id)s
LIMIT 1
