-- Standing gate rules and what the permission path reads.

-- name: get_gate_workdir --
-- The directory a task's process was started in, as the supervisor journaled it (and the task row's own
-- directory, set when it was dispatched with one): what the permission tool measures paths against.
SELECT (SELECT s.payload ->> 'workdir' FROM journal s
        WHERE s.task_id = t.id AND s.event_type = 'task.spawned' ORDER BY s.seq DESC LIMIT 1) AS spawned_in,
       t.workdir
FROM tasks t WHERE t.id = %(task_id)s

-- name: get_gate_thread_mode --
SELECT mode FROM sessions WHERE id = %(thread_id)s AND role = 'orchestrator'

-- name: list_live_gate_rules --
-- The standing rules that may cover a call of this task: its own, its thread's, its project's; newest first.
SELECT id, scope, tool_name, pattern, decision, category
FROM gate_rules
WHERE revoked_at IS NULL AND tool_name = %(tool_name)s
  AND ((scope = 'task' AND task_id = %(task_id)s)
       OR (scope = 'thread' AND session_id = %(thread_id)s)
       OR (scope = 'project' AND project_id = %(project_id)s))
ORDER BY created_at DESC

-- name: insert_gate_rule --
INSERT INTO gate_rules (scope, session_id, project_id, task_id, tool_name, pattern, decision, category, created_by)
VALUES (%(scope)s, %(session_id)s, %(project_id)s, %(task_id)s, %(tool_name)s, %(pattern)s, %(decision)s,
        %(category)s, %(created_by)s)
RETURNING id

-- name: claim_gate_rule_requests --
-- A request for a thread still being created (its id is issued by the ingress, the row made by the threads loop)
-- waits for it: taken now it would fail as "no thread"; the poll takes it once the thread exists.
UPDATE gate_rule_queue q SET status = 'claimed'
FROM (SELECT r.id FROM gate_rule_queue r WHERE r.status = 'pending'
        AND NOT EXISTS (SELECT 1 FROM thread_control_queue c WHERE c.thread_id = r.thread_id AND c.action = 'create'
                        AND c.status IN ('pending', 'claimed'))
      ORDER BY r.created_at FOR UPDATE OF r SKIP LOCKED LIMIT 50) picked
WHERE q.id = picked.id
RETURNING q.id, q.scope, q.thread_id, q.project_id, q.tool_name, q.pattern, q.requested_by

-- name: get_gate_rule_scope --
SELECT CASE WHEN %(scope)s = 'thread'
            THEN EXISTS (SELECT 1 FROM sessions WHERE id = %(thread_id)s AND role = 'orchestrator')
            ELSE EXISTS (SELECT 1 FROM projects WHERE id = %(project_id)s) END AS found

-- name: finish_gate_rule_request --
UPDATE gate_rule_queue SET status = %(status)s, error = %(error)s, rule_id = %(rule_id)s, finished_at = now()
WHERE id = %(id)s

-- name: requeue_gate_rule_requests --
-- After a restart: requests a dead executor claimed are taken again.
UPDATE gate_rule_queue SET status = 'pending' WHERE status = 'claimed'

-- name: list_orphaned_gate_cards --
-- Approval cards whose executor died while they waited: the restart crashed the task and closed the card,
-- but no gate.decided says the call was refused (the dying harness could not write it).
SELECT q.id, q.tool_use_id, q.task_id, t.session_id, t.project_id, q.questions
FROM questions q JOIN tasks t ON t.id = q.task_id
WHERE q.tool_use_id LIKE %(card_prefix)s AND q.status = 'cancelled'
  AND t.status = 'crashed' AND t.status_reason = 'executor_restart'
  AND NOT EXISTS (SELECT 1 FROM journal j WHERE j.task_id = q.task_id AND j.event_type = 'gate.decided'
                  AND j.payload ->> 'question_id' = q.id::text)
