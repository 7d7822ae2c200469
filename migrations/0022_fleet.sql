-- Executor fleet: several executors (hosts) share one database. Each holds a lease row renewed every few
-- seconds; a claim records the claimer's name and lease epoch, so a lost executor's late writes are refused
-- (fencing) once a survivor has taken its tasks over. Placement: a task may name an executor or required
-- labels, a project may name the executor that holds its workdir, a session runs where its first turn ran.

CREATE TABLE executors (
    name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    labels      text[] NOT NULL DEFAULT '{}',
    capacity    integer NOT NULL CHECK (capacity >= 1),
    -- bumped on every (re)join: writes carrying an older epoch are from a fenced run
    epoch       bigint NOT NULL DEFAULT 1,
    lease_s     double precision NOT NULL,
    lease_until timestamptz NOT NULL,
    version     text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now(),
    -- set by the survivor that took this executor's tasks over (its lease had expired)
    lost_at     timestamptz,
    -- a clean stop: not an alert, nothing to take over
    stopped_at  timestamptz
);

ALTER TABLE tasks
    ADD COLUMN executor_name   text,
    ADD COLUMN executor_epoch  bigint,
    -- placement asked for by the dispatcher
    ADD COLUMN placement_executor text,
    ADD COLUMN required_labels text[] NOT NULL DEFAULT '{}';
CREATE INDEX tasks_executor_running_idx ON tasks (executor_name) WHERE status = 'running';

-- the executor whose machine holds the project's workdir (set by whoever records projects)
ALTER TABLE projects ADD COLUMN executor_name text;
-- where the session's first turn ran: `--resume` needs that machine's CLI config directory
ALTER TABLE sessions ADD COLUMN executor_name text;

-- Values shared by the whole fleet, written once by whoever gets there first (the VAPID key).
CREATE TABLE fleet_secrets (
    name       text PRIMARY KEY,
    value      text NOT NULL,
    created_by text,
    created_at timestamptz NOT NULL DEFAULT now()
);

GRANT SELECT, INSERT, UPDATE ON executors TO petal_executor;
GRANT SELECT ON executors TO petal_ingress;
GRANT SELECT, INSERT ON fleet_secrets TO petal_executor;

INSERT INTO event_types (name, tier, description) VALUES
    ('executor.lost', 'raw', 'an executor''s lease expired: a survivor crashed its running tasks (executor_lost) and cancelled their questions'),
    ('executor.fenced', 'raw', 'an executor found it had been taken over: it killed its processes and joined again with a new epoch')
ON CONFLICT (name) DO NOTHING;
