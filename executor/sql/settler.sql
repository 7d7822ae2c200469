-- name: claim_unsettled_task --
-- One ended task whose end is not yet acted on, locked until the settling transaction ends. FOR UPDATE
-- (not NO KEY UPDATE) SKIP LOCKED: another settler passes over it, and so does a row held FOR KEY SHARE.
-- What settlement needs is read from the store (never from the executor's memory), so a restarted
-- executor settles an end the same way: the task row, its thread, its `task.exited` record (absent
-- when the task was reconciled or cancelled before it started), and whether a project worker's changes
-- are still to be recorded.
SELECT t.id, t.role, t.status, t.status_reason, t.parent_task_id,
       t.json_schema, (t.branch IS NOT NULL AND t.changes_recorded_at IS NULL) AS changes_due,
       coalesce(p.extract_on_exit, false) AS extract_on_exit,
       EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.session_id AND s.role = 'orchestrator') AS thread_turn,
       (SELECT s.id FROM tasks pt JOIN sessions s ON s.id = pt.session_id AND s.role = 'orchestrator'
        WHERE pt.id = t.parent_task_id) AS thread_id,
       (SELECT j.payload FROM journal j WHERE j.task_id = t.id AND j.event_type = 'task.exited'
        ORDER BY j.seq DESC LIMIT 1) AS exited
FROM tasks t LEFT JOIN role_profiles p ON p.role = t.role
WHERE t.settled_at IS NULL AND t.status NOT IN ('pending', 'running') AND t.id <> ALL(%(skip)s::uuid[])
ORDER BY t.ended_at NULLS FIRST, t.id
FOR UPDATE OF t SKIP LOCKED
LIMIT 1

-- name: mark_task_settled --
UPDATE tasks SET settled_at = now() WHERE id = %(id)s AND settled_at IS NULL

-- name: get_task_result --
-- A run's last `result` line as journaled (an extractor's structured output is in it).
SELECT payload FROM journal WHERE task_id = %(id)s AND event_type = 'stream.result' ORDER BY seq DESC LIMIT 1


-- name: claim_unrecorded_changes --
-- A settled end whose worker's changes were never recorded (the settler records them before it settles an
-- end, so only an end settled some other way, or before it did, is left): one, locked like a settlement.
SELECT t.id FROM tasks t
WHERE t.branch IS NOT NULL AND t.changes_recorded_at IS NULL AND t.settled_at IS NOT NULL
  AND t.status NOT IN ('pending', 'running')
ORDER BY t.ended_at NULLS FIRST, t.id
FOR UPDATE OF t SKIP LOCKED
LIMIT 1
