-- name: get_dispatching_call --
-- The orchestrator's journaled tool call that asked for a worker: the `stream.assistant` line of the
-- dispatching task whose tool_use block carries the tool_use_id its dispatch recorded.
SELECT c.event_id
FROM journal r
JOIN journal c ON c.task_id = (r.payload->>'parent_task_id')::uuid AND c.event_type = 'stream.assistant'
WHERE r.task_id = %(id)s AND r.event_type = 'task.dispatch_requested' AND r.payload ? 'tool_use_id'
  AND c.payload->'message'->'content'
      @> jsonb_build_array(jsonb_build_object('type', 'tool_use', 'id', r.payload->>'tool_use_id'))
ORDER BY c.seq DESC
LIMIT 1

-- name: get_dispatch_tool_use --
-- The tool_use_id a task's dispatch recorded (null: not dispatched by a tool call).
SELECT payload->>'tool_use_id' AS tool_use_id
FROM journal
WHERE task_id = %(id)s AND event_type = 'task.dispatch_requested'
ORDER BY seq
LIMIT 1

-- name: get_task_exit_event --
SELECT event_id FROM journal WHERE task_id = %(id)s AND event_type = 'task.exited' ORDER BY seq DESC LIMIT 1
