-- The ingress's only way to act: rows in these tables. The executor claims them.

CREATE FUNCTION notify_row_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- NOTIFY carries an id, never a body: payloads are capped at 8000 bytes.
    PERFORM pg_notify(TG_ARGV[0], NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TABLE chat_queue (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    thread_id     uuid NOT NULL,
    text          text NOT NULL CHECK (length(text) > 0),
    client_msg_id text UNIQUE,
    status        text NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'claimed', 'delivered', 'failed')),
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    claimed_at    timestamptz,
    done_at       timestamptz
);
CREATE INDEX chat_queue_pending_idx ON chat_queue (created_at) WHERE status IN ('pending', 'claimed');
CREATE TRIGGER chat_queue_notify AFTER INSERT ON chat_queue
    FOR EACH ROW EXECUTE FUNCTION notify_row_id('chat_queue');

CREATE TABLE stop_queue (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    task_id    uuid NOT NULL,
    reason     text,
    status     text NOT NULL DEFAULT 'pending'
               CHECK (status IN ('pending', 'claimed', 'done', 'failed')),
    error      text,
    created_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz,
    done_at    timestamptz
);
CREATE INDEX stop_queue_pending_idx ON stop_queue (created_at) WHERE status IN ('pending', 'claimed');
CREATE TRIGGER stop_queue_notify AFTER INSERT ON stop_queue
    FOR EACH ROW EXECUTE FUNCTION notify_row_id('stop_queue');

CREATE TABLE thread_control_queue (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    thread_id  uuid NOT NULL,
    action     text NOT NULL CHECK (action IN ('create', 'rename', 'set_mode', 'archive')),
    args       jsonb NOT NULL DEFAULT '{}'::jsonb,
    status     text NOT NULL DEFAULT 'pending'
               CHECK (status IN ('pending', 'claimed', 'done', 'failed')),
    error      text,
    created_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz,
    done_at    timestamptz
);
CREATE INDEX thread_control_queue_pending_idx ON thread_control_queue (created_at)
    WHERE status IN ('pending', 'claimed');
CREATE TRIGGER thread_control_queue_notify AFTER INSERT ON thread_control_queue
    FOR EACH ROW EXECUTE FUNCTION notify_row_id('thread_control_queue');

-- ask_user_question: the executor inserts, the ingress answers or cancels.
CREATE TABLE questions (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tool_use_id         text UNIQUE,
    source_session_uuid uuid,
    task_id             uuid REFERENCES tasks (id),
    questions           jsonb NOT NULL,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'answered', 'cancelled')),
    answers             jsonb,
    response            text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    answered_at         timestamptz
);
CREATE INDEX questions_pending_idx ON questions (created_at) WHERE status = 'pending';

CREATE FUNCTION questions_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A closed question stays closed: nobody answers it twice, whatever the caller checked.
    IF OLD.status <> 'pending' THEN
        RAISE EXCEPTION 'question % is already %', OLD.id, OLD.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF NEW.status <> 'pending' AND NEW.answered_at IS NULL THEN
        NEW.answered_at := now();
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER questions_guard BEFORE UPDATE ON questions
    FOR EACH ROW EXECUTE FUNCTION questions_guard();

CREATE FUNCTION questions_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM pg_notify('question_asked', NEW.id::text);
    ELSIF NEW.status <> OLD.status THEN
        PERFORM pg_notify('question_answered', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER questions_notify AFTER INSERT OR UPDATE ON questions
    FOR EACH ROW EXECUTE FUNCTION questions_notify();
