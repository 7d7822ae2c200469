-- Review from the phone: line comments on a project worker's diff, batched into one review and sent back. The
-- review is a thread control (the ingress queues it; the settler requests the follow-up through the one door):
-- a worker that continues the reviewed one, on a worktree started at the reviewed commit, its brief carrying
-- the comments. Its diff is taken against that commit: it shows what changed since the review.
ALTER TABLE tasks ADD COLUMN continues_task_id uuid REFERENCES tasks (id);
CREATE INDEX tasks_continues_idx ON tasks (continues_task_id) WHERE continues_task_id IS NOT NULL;

ALTER TABLE thread_control_queue DROP CONSTRAINT thread_control_queue_action_check;
ALTER TABLE thread_control_queue ADD CONSTRAINT thread_control_queue_action_check
    CHECK (action IN ('create', 'rename', 'set_mode', 'archive', 'retry', 'review'));

INSERT INTO event_types (name, tier, description) VALUES
    ('task.review', 'raw', 'the user''s review of a worker''s diff (line comments), sent back to a follow-up worker '
                           'on the reviewed commit')
ON CONFLICT (name) DO NOTHING;
