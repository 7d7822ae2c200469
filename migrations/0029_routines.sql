-- Routines: work that starts without the user typing — a schedule, a webhook, an API call, or "run now".
-- The ingress writes a routine's definition and queues its triggers (routine_queue); the executor turns
-- due schedule instants and queued triggers into runs (routine_runs) and starts each run as a thread turn.

CREATE TABLE routines (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    project_id       uuid REFERENCES projects (id),
    mode             text NOT NULL DEFAULT 'autonomous' CHECK (mode IN ('interactive', 'autonomous')),
    prompt           text NOT NULL CHECK (length(prompt) BETWEEN 1 AND 100000),
    enabled          boolean NOT NULL DEFAULT true,
    -- schedule: a cron expression read in an IANA time zone (both or neither)
    cron             text CHECK (length(cron) BETWEEN 1 AND 200),
    tz               text CHECK (length(tz) BETWEEN 1 AND 100),
    missed           text NOT NULL DEFAULT 'skip' CHECK (missed IN ('skip', 'run_once')),
    overlap          text NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'queue', 'parallel')),
    -- the schedule's cursor: instants after it are still to be considered; moved forward (never back) by
    -- whoever schedules them, and to now when the schedule is edited or the routine is enabled again
    scheduled_through timestamptz NOT NULL DEFAULT now(),
    -- the next instant after the cursor (NULL: no schedule, or disabled): what the executor waits for
    next_fire_at     timestamptz,
    -- the webhook's HMAC key: verifying X-Hub-Signature-256 needs the key itself (a hash would not do); only
    -- the ingress reads it. The fire token is kept only as its SHA-256.
    webhook_secret   text CHECK (length(webhook_secret) BETWEEN 32 AND 200),
    fire_token_sha256 bytea CHECK (length(fire_token_sha256) = 32),
    -- budgets (NULL: no cap): USD per run (the CLI's --max-budget-usd), seconds per run, USD per day
    usd_per_run      numeric CHECK (usd_per_run > 0),
    runtime_s        integer CHECK (runtime_s > 0),
    usd_per_day      numeric CHECK (usd_per_day > 0),
    -- workers a run may have going at once (its turns' dispatch_worker is refused past it)
    max_workers      integer CHECK (max_workers > 0),
    created_by       text CHECK (length(created_by) BETWEEN 1 AND 200),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    deleted_at       timestamptz,
    CHECK ((cron IS NULL) = (tz IS NULL))
);
-- a new or edited routine wakes the executors' scheduler (its next instant may be sooner than they wait for)
-- (not the executors' own moves of the cursor)
CREATE TRIGGER routines_notify AFTER INSERT OR UPDATE OF cron, tz, enabled, deleted_at, overlap, usd_per_day
    ON routines FOR EACH ROW EXECUTE FUNCTION notify_row_id('routines');
CREATE INDEX routines_next_fire_idx ON routines (next_fire_at) WHERE next_fire_at IS NOT NULL AND deleted_at IS NULL;

-- Triggers the ingress verified: run now (the user), fire (the routine's token), a webhook delivery.
CREATE TABLE routine_queue (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    routine_id   uuid NOT NULL REFERENCES routines (id),
    trigger      text NOT NULL CHECK (trigger IN ('run', 'fire', 'webhook')),
    -- what the template sees as `event` (a webhook's JSON payload, a fire call's body)
    event        jsonb NOT NULL DEFAULT '{}',
    -- a webhook's X-GitHub-Delivery: the same delivery twice is one trigger
    delivery_id  text CHECK (length(delivery_id) BETWEEN 1 AND 200),
    requested_by text CHECK (length(requested_by) BETWEEN 1 AND 200),
    status       text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (routine_id, delivery_id)
);
CREATE INDEX routine_queue_pending_idx ON routine_queue (created_at) WHERE status = 'pending';
CREATE TRIGGER routine_queue_notify AFTER INSERT ON routine_queue
    FOR EACH ROW EXECUTE FUNCTION notify_row_id('routine_queue');

-- One row per run. (routine_id, scheduled_at) is unique: however many executors schedule a routine, an
-- instant is run at most once (a trigger's run has no instant: NULLs never collide).
CREATE TABLE routine_runs (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    routine_id   uuid NOT NULL REFERENCES routines (id),
    trigger      text NOT NULL CHECK (trigger IN ('schedule', 'run', 'fire', 'webhook')),
    scheduled_at timestamptz,
    queue_id     uuid UNIQUE REFERENCES routine_queue (id),
    event        jsonb NOT NULL DEFAULT '{}',
    status       text NOT NULL DEFAULT 'queued'
                 CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'gated', 'skipped')),
    -- why it was skipped or failed ('budget', 'overlap', a template error ...), or what it waits for
    reason       text,
    prompt       text,
    thread_id    uuid REFERENCES sessions (id),
    task_id      uuid,
    cost_usd     float8,
    gate_denials jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    ended_at     timestamptz,
    UNIQUE (routine_id, scheduled_at)
);
CREATE INDEX routine_runs_open_idx ON routine_runs (routine_id, created_at) WHERE status IN ('queued', 'running');
CREATE INDEX routine_runs_routine_idx ON routine_runs (routine_id, created_at DESC);

-- a routine's run caps each of its CLI processes (--max-budget-usd); NULL: no cap
ALTER TABLE tasks ADD COLUMN max_budget_usd numeric CHECK (max_budget_usd > 0);

-- The account's rate-limit windows as the CLI reports them (`rate_limit_event` lines, journaled as
-- stream.rate_limit_event): the latest per window. While one is exhausted, unattended runs wait for its reset.
CREATE TABLE quota_windows (
    kind        text PRIMARY KEY CHECK (length(kind) BETWEEN 1 AND 100),
    status      text NOT NULL CHECK (length(status) BETWEEN 1 AND 100),
    utilization float8,
    resets_at   timestamptz,
    seq         bigint NOT NULL,
    updated_at  timestamptz NOT NULL
);
-- how far the journal's rate_limit_event lines were read
CREATE TABLE quota_cursor (
    id  boolean PRIMARY KEY DEFAULT true CHECK (id),
    seq bigint NOT NULL DEFAULT 0
);
INSERT INTO quota_cursor DEFAULT VALUES;
GRANT SELECT, INSERT, UPDATE ON quota_windows, quota_cursor TO petal_executor;
GRANT SELECT ON quota_windows TO petal_ingress;

-- ingress: writes definitions, queues triggers, reads the history (and the webhook key to verify with)
GRANT SELECT, INSERT, UPDATE ON routines TO petal_ingress;
GRANT SELECT, INSERT ON routine_queue TO petal_ingress;
GRANT SELECT ON routine_runs TO petal_ingress;
-- executor: schedules, claims triggers, runs; never reads the webhook key
GRANT SELECT (id, name, project_id, mode, prompt, enabled, cron, tz, missed, overlap, scheduled_through,
              next_fire_at, usd_per_run, runtime_s, usd_per_day, max_workers, created_by, created_at, updated_at, deleted_at)
    ON routines TO petal_executor;
GRANT UPDATE (scheduled_through, next_fire_at) ON routines TO petal_executor;
GRANT SELECT, UPDATE ON routine_queue TO petal_executor;
GRANT SELECT, INSERT, UPDATE ON routine_runs TO petal_executor;

INSERT INTO event_types (name, tier, description) VALUES
    ('routine.run_started', 'raw', 'a routine''s run started as a thread turn: trigger, instant, rendered prompt'),
    ('routine.run_ended', 'raw', 'a routine''s run ended (succeeded, failed, gated) or was not started (skipped: budget, overlap, a template error); cost, duration, gate denials')
ON CONFLICT (name) DO NOTHING;
