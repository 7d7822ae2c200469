-- Waiting is not working (executor/run/supervisor.py): a process parked on the user holds no work slot, and a
-- chat turn is claimed ahead of unattended work, with one slot kept for it.
--
-- `chat`: a thread turn started by a user's message (not a routine's run, a retry, a harness report such as a
-- worker's handoff). Set once, when the turn is queued.
ALTER TABLE tasks ADD COLUMN chat boolean NOT NULL DEFAULT false;

-- A pending task's activity `waiting_for_slot` (set by the supervisor while it could be claimed but every slot is
-- busy) is a visible state of its own, like `awaiting_approval`; the claim sets `running`.
COMMENT ON COLUMN tasks.activity IS
    'visible sub-state: running, stalled, awaiting_user (running); awaiting_approval, waiting_for_slot (pending)';
