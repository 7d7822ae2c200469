-- Durable settlement: a task's end is acted on (extraction requested or gated, the policy applied, the
-- thread told) by a loop over the store that claims unsettled ended tasks, not by in-process callbacks.
-- `settled_at` is set in the same transaction as the records settlement writes, so an executor that dies
-- between a task's end and its settlement settles it after the restart, exactly once.
ALTER TABLE tasks ADD COLUMN settled_at timestamptz;

-- Ends from before this migration were acted on by the old exit hooks (or never will be): not again.
UPDATE tasks SET settled_at = coalesce(ended_at, now()) WHERE status NOT IN ('pending', 'running');

-- What the settler claims: ended and not yet settled (small, so the claim stays cheap).
CREATE INDEX tasks_unsettled_idx ON tasks (ended_at)
    WHERE settled_at IS NULL AND status NOT IN ('pending', 'running');

-- The settler wakes on `task_changed` (tasks_notify_changed, 0005), which fires when the status changes:
-- every end is a status change from pending or running, so no new channel is needed. A task inserted
-- already ended (an imported transcript) is inserted settled.
