-- name: get_caller_lineage --
-- Where a caller's task sits among the dispatches (executor/harness/scope.py): `depth` is how many dispatches
-- lie above it (0: a turn, or a task requested from outside the harness), `thread_id` the thread its lineage's
-- root turn speaks in (none for a root outside any thread), `dispatched` how many workers it asked for itself
-- (those awaiting approval included; the policy's repeats of them are not its asks).
WITH RECURSIVE up AS (
    SELECT id, parent_task_id, session_id, 0 AS depth FROM tasks WHERE id = %(task_id)s
    UNION ALL
    SELECT t.id, t.parent_task_id, t.session_id, up.depth + 1
    FROM up JOIN tasks t ON t.id = up.parent_task_id
    WHERE up.depth < 1000  -- a guard only: a parent is always inserted before its child
)
SELECT up.depth,
       (SELECT s.id FROM sessions s WHERE s.id = up.session_id AND s.role = 'orchestrator') AS thread_id,
       (SELECT count(*) FROM tasks c
        WHERE c.parent_task_id = %(task_id)s AND c.role = 'worker' AND c.retry_of IS NULL) AS dispatched
FROM up
ORDER BY up.depth DESC
LIMIT 1

-- name: check_caller_may_read --
-- A row only when `scope` names a task or a conversation the caller may read: one of its project's (`project`,
-- none for a caller without one), or one of its tree's — every turn of the thread its lineage's root speaks in
-- (or, for a root outside any thread, that root) and every task they dispatched, transitively. A child is
-- always inserted after its parent, so the walk down ends.
WITH RECURSIVE up AS (
    SELECT id, parent_task_id, session_id, 0 AS depth FROM tasks WHERE id = %(task_id)s
    UNION ALL
    SELECT t.id, t.parent_task_id, t.session_id, up.depth + 1
    FROM up JOIN tasks t ON t.id = up.parent_task_id
    WHERE up.depth < 1000
),
root AS (SELECT id, session_id FROM up ORDER BY depth DESC LIMIT 1),
thread AS (SELECT s.id FROM root JOIN sessions s ON s.id = root.session_id AND s.role = 'orchestrator'),
tree AS (
    SELECT t.id, t.session_id FROM tasks t WHERE t.id = (SELECT id FROM root)
    UNION
    SELECT t.id, t.session_id FROM tasks t WHERE t.session_id = (SELECT id FROM thread)
    UNION
    SELECT c.id, c.session_id FROM tree JOIN tasks c ON c.parent_task_id = tree.id
)
SELECT true AS readable
WHERE EXISTS (SELECT FROM tasks t WHERE t.project_id = %(project)s::uuid
                AND (t.id = %(scope)s::uuid OR t.session_id = %(scope)s::uuid))
   OR EXISTS (SELECT FROM tree WHERE tree.id = %(scope)s::uuid OR tree.session_id = %(scope)s::uuid)

-- name: lock_routine_run_of_thread --
-- A routine's run dispatches its workers one at a time (held to the dispatching transaction's commit).
SELECT 1 FROM routine_runs WHERE thread_id = %(thread_id)s FOR UPDATE

-- name: check_routine_workers_full --
-- A routine's run whose thread already has its routine's max_workers workers going (a row only then): every worker
-- of the run counts, its workers' own workers too (a worker may dispatch, and its own would otherwise be free).
WITH RECURSIVE run_tasks AS (
    SELECT t.id FROM tasks t WHERE t.session_id = %(thread_id)s
    UNION
    SELECT c.id FROM run_tasks x JOIN tasks c ON c.parent_task_id = x.id
)
SELECT rt.max_workers, rt.name FROM routine_runs r JOIN routines rt ON rt.id = r.routine_id
WHERE r.thread_id = %(thread_id)s AND rt.max_workers IS NOT NULL
  AND (SELECT count(*) FROM tasks w WHERE w.id IN (SELECT id FROM run_tasks) AND w.role = 'worker'
       AND w.status IN ('pending', 'running')) >= rt.max_workers
