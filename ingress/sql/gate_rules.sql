-- name: list_gate_rules --
-- Standing gate rules, live first: all of them, or those that apply within one thread (its own, its
-- workers' task rules, and its project's).
SELECT r.id, r.scope, r.session_id AS thread_id, r.project_id, r.task_id, r.tool_name, r.pattern, r.decision,
       r.category, r.created_by, r.created_at, r.revoked_at, r.revoked_by,
       (SELECT count(*) FROM journal j WHERE j.event_type = 'gate.decided'
          AND j.payload ->> 'decided_by' = 'rule' AND j.payload ->> 'rule_id' = r.id::text) AS uses
FROM gate_rules r
WHERE (%(thread_id)s::uuid IS NULL
       OR r.session_id = %(thread_id)s
       OR r.task_id IN (SELECT w.id FROM tasks w JOIN tasks p ON p.id = w.parent_task_id
                        WHERE p.session_id = %(thread_id)s)
       OR r.project_id IN (SELECT project_id FROM sessions WHERE id = %(thread_id)s))
  AND (%(revoked)s OR r.revoked_at IS NULL)
ORDER BY r.revoked_at IS NOT NULL, r.created_at DESC
LIMIT %(limit)s

-- name: list_pending_gate_rule_requests --
SELECT id, scope, thread_id, project_id, tool_name, pattern, requested_by, status, error, rule_id, created_at
FROM gate_rule_queue
WHERE (%(thread_id)s::uuid IS NULL OR thread_id = %(thread_id)s) AND status IN ('pending', 'claimed', 'failed')
ORDER BY created_at DESC LIMIT 50

-- name: enqueue_gate_rule --
INSERT INTO gate_rule_queue (scope, thread_id, project_id, tool_name, pattern, requested_by)
VALUES (%(scope)s, %(thread_id)s, %(project_id)s, %(tool_name)s, %(pattern)s, %(requested_by)s)
RETURNING id, scope, thread_id, project_id, tool_name, pattern, requested_by, status, created_at

-- name: revoke_gate_rule --
UPDATE gate_rules SET revoked_at = now(), revoked_by = %(revoked_by)s
WHERE id = %(id)s AND revoked_at IS NULL
RETURNING id, scope, tool_name, pattern, revoked_at, revoked_by

-- name: check_gate_rule_exists --
SELECT revoked_at FROM gate_rules WHERE id = %(id)s
