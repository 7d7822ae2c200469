-- Warm turns (executor/run/warm.py): which threads' next turns to start ahead of their messages.

-- name: list_warm_candidates --
-- Threads likely to get the next message: those a page showed lately (client_presence) and those whose turn
-- just ended here (offered), each with its latest turn, which the next one's spawn is made of. Not a thread
-- archived, with a turn pending or running (its conversation is not stored yet), or pinned to another
-- executor (its conversation is there). Driven from the few ids, each looked up by key.
WITH shown AS (
    SELECT thread_id, max(seen_at) AS seen_at FROM client_presence
    WHERE thread_id IS NOT NULL AND seen_at > now() - make_interval(secs => %(presence_s)s)
    GROUP BY thread_id
), wanted AS (
    SELECT id FROM unnest(%(offered)s::uuid[]) AS o(id) UNION SELECT thread_id FROM shown
)
SELECT s.id AS session_id, t.project_id, t.role, t.workdir, t.allowed_tools, shown.seen_at
FROM wanted w
JOIN sessions s ON s.id = w.id
LEFT JOIN shown ON shown.thread_id = s.id
JOIN LATERAL (SELECT project_id, role, workdir, allowed_tools, status, json_schema FROM tasks
              WHERE session_id = s.id ORDER BY created_at DESC LIMIT 1) t ON true
WHERE s.role = 'orchestrator' AND s.lifecycle <> 'archived'
  AND (s.executor_name IS NULL OR s.executor_name = %(name)s)
  AND t.role = 'orchestrator' AND t.json_schema IS NULL AND t.status NOT IN ('pending', 'running')
  AND NOT EXISTS (SELECT 1 FROM tasks o WHERE o.session_id = s.id AND o.status IN ('pending', 'running'))
ORDER BY shown.seen_at DESC NULLS LAST
LIMIT %(n)s
