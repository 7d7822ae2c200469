-- name: enqueue_project_request --
INSERT INTO project_queue (action, task_id, args) VALUES (%(action)s, %(task_id)s, %(args)s)
RETURNING id, action, task_id, status, created_at

-- name: check_slug_taken --
SELECT true AS holds FROM projects WHERE name = %(slug)s

-- name: get_task_review_state --
-- thread_id: the thread of the turn that dispatched the worker (where a review sent back is kept and its
-- follow-up's handoff comes back)
-- review_pending: a merge or discard of it is queued; push_pending: a push; push_remote: its project's
SELECT t.id, t.status, t.branch, t.review, t.changes_recorded_at, p.session_id AS thread_id, pr.push_remote,
       EXISTS (SELECT 1 FROM project_queue q WHERE q.task_id = t.id AND q.status IN ('pending', 'claimed')
                   AND q.action IN ('merge', 'discard')) AS review_pending,
       EXISTS (SELECT 1 FROM project_queue q WHERE q.task_id = t.id AND q.status IN ('pending', 'claimed')
                   AND q.action = 'push') AS push_pending
FROM tasks t LEFT JOIN tasks p ON p.id = t.parent_task_id AND p.role = 'orchestrator'
LEFT JOIN projects pr ON pr.id = t.project_id
WHERE t.id = %(id)s
