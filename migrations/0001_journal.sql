-- The journal: one append-only table, two tiers, seq as the ordering authority.

-- Open set of event types: extending it is an INSERT, never a migration or a code change.
CREATE TABLE event_types (
    name        text PRIMARY KEY,
    tier        text NOT NULL CHECK (tier IN ('raw', 'derived')),
    description text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, tier)
);

INSERT INTO event_types (name, tier, description) VALUES
    ('task.spawned',            'raw', 'a claude process was started for a task'),
    ('task.exited',             'raw', 'a task''s process ended: exit code, signal, duration, derived status'),
    ('task.stop_requested',     'raw', 'a stop request was taken from stop_queue'),
    ('task.signal_sent',        'raw', 'the supervisor signalled a task''s process group'),
    ('task.stalled',            'raw', 'a running task printed nothing for longer than the stall threshold'),
    ('task.resumed',            'raw', 'a stalled task printed again'),
    ('task.crashed',            'raw', 'a task was found dead (e.g. executor restart) and marked crashed'),
    ('task.user_message',       'raw', 'a user message, the echo every client renders'),
    ('task.dispatch_requested', 'raw', 'an orchestrator asked for a worker'),
    ('task.dispatch_refused',   'raw', 'a dispatch was refused (e.g. matches a prior rule-out)'),
    ('task.stderr',             'raw', 'a line the process wrote to stderr'),
    ('stream.system.init',      'raw', 'stream-json: system/init'),
    ('stream.system.api_retry', 'raw', 'stream-json: system/api_retry'),
    ('stream.system.status',    'raw', 'stream-json: system/status'),
    ('stream.system.permission_denied', 'raw', 'stream-json: system/permission_denied'),
    ('stream.system',           'raw', 'stream-json: a system line of another subtype'),
    ('stream.assistant',        'raw', 'stream-json: assistant message line'),
    ('stream.user',             'raw', 'stream-json: user line (tool results)'),
    ('stream.result',           'raw', 'stream-json: the turn''s result line'),
    ('stream.stream_event',     'raw', 'stream-json: a partial-message stream event'),
    ('stream.rate_limit_event', 'raw', 'stream-json: rate_limit_event'),
    ('stream.tool_progress',    'raw', 'stream-json: tool_progress heartbeat'),
    ('stream.other',            'raw', 'stream-json: a line of a type not registered yet'),
    ('stream.unparsed',         'raw', 'a stdout line that is not JSON, kept verbatim'),
    ('question.asked',          'raw', 'ask_user_question stored a question'),
    ('question.answered',       'raw', 'a question was answered'),
    ('question.cancelled',      'raw', 'a question was cancelled or timed out'),
    ('thread.created',          'raw', 'an orchestrator thread was created'),
    ('thread.renamed',          'raw', 'a thread was renamed'),
    ('thread.mode_changed',     'raw', 'a thread''s mode changed'),
    ('thread.archived',         'raw', 'a thread was archived'),
    ('executor.started',        'raw', 'an executor process started and reconciled'),
    ('handoff',                 'derived', 'a validated handoff distilled from a task''s raw events'),
    ('extraction.failed',       'derived', 'the extractor''s output failed the validation gate');

CREATE TABLE projects (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name       text NOT NULL UNIQUE,
    workdir    text,
    plan       text,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- A session is a Claude process or conversation. role and lifecycle are data, not categories.
CREATE TABLE sessions (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id           uuid REFERENCES projects (id),
    role                 text NOT NULL,
    lifecycle            text NOT NULL,
    title                text,
    mode                 text,
    substrate_session_id text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

-- Final and non-final task statuses; a reference table so the set is data.
CREATE TABLE task_statuses (
    name        text PRIMARY KEY,
    final       boolean NOT NULL,
    description text NOT NULL DEFAULT ''
);

INSERT INTO task_statuses (name, final, description) VALUES
    ('pending',           false, 'requested, not started'),
    ('running',           false, 'its process is alive'),
    ('success',           true,  'clean exit and the validation gate passed'),
    ('failed',            true,  'clean non-zero exit: the worker ran and returned an error'),
    ('crashed',           true,  'abnormal end: SIGKILL or another signal, or its executor died'),
    ('cancelled',         true,  'stopped on purpose (SIGTERM/SIGINT or a stop request)'),
    ('rate_limited',      true,  'the substrate''s quota or auth aborted the run'),
    ('partial',           true,  'clean exit with incomplete work'),
    ('skipped',           true,  'did not run: a gate or precondition declined it'),
    ('gated',             true,  'an autonomous-mode hard gate fired'),
    ('extraction_failed', true,  'clean exit, but the derived handoff failed the validation gate');

-- One unit of supervised work. A projection for convenience: the journal stays the record.
CREATE TABLE tasks (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    project_id     uuid REFERENCES projects (id),
    session_id     uuid REFERENCES sessions (id),
    parent_task_id uuid REFERENCES tasks (id),
    role           text NOT NULL,
    brief          text NOT NULL DEFAULT '',
    plan_ref       text,
    status         text NOT NULL DEFAULT 'pending' REFERENCES task_statuses (name),
    -- visible sub-state of a running task: running, stalled, awaiting_user
    activity       text,
    status_reason  text,
    exit_code      integer,
    exit_signal    integer,
    pid            integer,
    attempt        integer NOT NULL DEFAULT 1,
    last_output_at timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    ended_at       timestamptz
);
CREATE INDEX tasks_status_idx ON tasks (status);
CREATE INDEX tasks_session_idx ON tasks (session_id);

CREATE TABLE journal (
    event_id   uuid PRIMARY KEY,
    seq        bigint NOT NULL UNIQUE,
    project_id uuid REFERENCES projects (id),
    session_id uuid REFERENCES sessions (id),
    task_id    uuid REFERENCES tasks (id),
    parent_id  uuid REFERENCES journal (event_id),
    message_id uuid,
    event_type text NOT NULL,
    tier       text NOT NULL CHECK (tier IN ('raw', 'derived')),
    created_at timestamptz NOT NULL DEFAULT now(),
    payload    jsonb NOT NULL DEFAULT '{}'::jsonb,
    CONSTRAINT journal_event_type_fkey FOREIGN KEY (event_type, tier)
        REFERENCES event_types (name, tier)
);
CREATE INDEX journal_task_seq_idx ON journal (task_id, seq);
CREATE INDEX journal_session_seq_idx ON journal (session_id, seq);
CREATE INDEX journal_type_seq_idx ON journal (event_type, seq);

-- The seq counter. Appenders take this row's lock for the rest of their transaction, so commit order
-- equals seq order: a reader that has seen seq N never later finds a committed seq < N, and because
-- the counter rolls back with its transaction the committed seqs have no holes either.
CREATE TABLE journal_head (
    id       boolean PRIMARY KEY DEFAULT true CHECK (id),
    last_seq bigint NOT NULL
);
INSERT INTO journal_head (last_seq) VALUES (0);

CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'write a new row instead of changing or removing one';
END;
$$;

CREATE TRIGGER journal_append_only
    BEFORE UPDATE OR DELETE ON journal
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER journal_no_truncate
    BEFORE TRUNCATE ON journal
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
