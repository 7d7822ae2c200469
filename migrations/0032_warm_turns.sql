-- Warm turns (executor/run/warm.py): a thread's next turn's process started ahead of its message, and its
-- end when no turn took it. Recorded for the operator (what it cost, why it ended); a turn that takes one
-- says so in its task.spawned (`warm`).
INSERT INTO event_types (name, tier, description) VALUES
    ('warm.started', 'raw', 'a thread''s next turn''s CLI was started ahead of its message, waiting on stdin (pid, spawn_id)'),
    ('warm.retired', 'raw', 'a warm turn''s process no turn took was ended (reason: idle, displaced, died, executor_stopping, spawn_differs, conversation_moved_on; its resident memory)')
ON CONFLICT (name) DO NOTHING;
