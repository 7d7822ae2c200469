-- name: grant_harness_credential --
-- One credential per spawn; a task spawned again (never today) gets the new one.
INSERT INTO harness_credentials (token_sha256, task_id, session_id)
VALUES (%(token_sha256)s, %(task_id)s, %(session_id)s)
ON CONFLICT (task_id) DO UPDATE SET token_sha256 = EXCLUDED.token_sha256, session_id = EXCLUDED.session_id,
                                    created_at = now(), revoked_at = NULL

-- name: revoke_harness_credential --
UPDATE harness_credentials SET revoked_at = now() WHERE task_id = %(task_id)s AND revoked_at IS NULL

-- name: get_harness_caller --
-- Who holds a credential: its task, the spawn's session, and the thread (an orchestrator turn's own
-- session, or the session of the orchestrator turn that dispatched the task).
SELECT c.task_id, c.session_id, c.revoked_at, t.status, t.role,
       coalesce(t.project_id, s.project_id, ps.project_id) AS project_id,
       CASE WHEN s.role = 'orchestrator' THEN s.id ELSE ps.id END AS thread_id
FROM harness_credentials c
JOIN tasks t ON t.id = c.task_id
LEFT JOIN sessions s ON s.id = c.session_id
LEFT JOIN tasks p ON p.id = t.parent_task_id
LEFT JOIN sessions ps ON ps.id = p.session_id AND ps.role = 'orchestrator'
WHERE c.token_sha256 = %(token_sha256)s
