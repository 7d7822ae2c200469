-- name: get_task_status --
SELECT status FROM tasks WHERE id = %(id)s
