-- Attachments from the phone: screenshots, photos, logs and files sent with a chat message.
-- The bytes live in PostgreSQL (durable like the message itself); the type is the one the ingress detected
-- from the bytes, never the file's name or the client's header.
CREATE TABLE attachments (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    sha256          bytea NOT NULL CHECK (length(sha256) = 32),
    size_bytes      integer NOT NULL CHECK (size_bytes BETWEEN 0 AND 10485760),
    media_type      text NOT NULL CHECK (media_type IN ('image/png', 'image/jpeg', 'image/webp', 'image/gif',
                                                        'application/pdf', 'text/plain')),
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    data            bytea NOT NULL CHECK (length(data) = size_bytes),
    sent_by         text CHECK (length(sent_by) BETWEEN 1 AND 200),
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- the chat message it was sent with: set in the transaction that queues the message, so a message and
    -- its attachments are one unit (an attachment never sent keeps NULL)
    chat_message_id uuid REFERENCES chat_queue (id)
);
CREATE INDEX attachments_chat_message_idx ON attachments (chat_message_id) WHERE chat_message_id IS NOT NULL;

-- the attachments a queued message carries, in the user's order; the executor copies them onto the turn
ALTER TABLE chat_queue ADD COLUMN attachment_ids uuid[] NOT NULL DEFAULT '{}';
-- the attachments a task's run feeds the CLI with its brief (a turn that delivers a message carrying them)
ALTER TABLE tasks ADD COLUMN attachment_ids uuid[] NOT NULL DEFAULT '{}';

-- ingress: stores uploads and serves them back; ties an attachment to the message it is sent with
GRANT SELECT, INSERT (sha256, size_bytes, media_type, name, data, sent_by) ON attachments TO petal_ingress;
GRANT UPDATE (chat_message_id) ON attachments TO petal_ingress;
GRANT INSERT (attachment_ids) ON chat_queue TO petal_ingress;
-- executor: reads them to feed a turn
GRANT SELECT ON attachments TO petal_executor;

-- retention: `petal-dispatch attachments purge` deletes the bytes of archived threads' attachments (and of
-- uploads never sent); the journal keeps each file's name and hash (task.user_message, attachments.purged)
GRANT DELETE ON attachments TO petal_executor;
INSERT INTO event_types (name, tier, description) VALUES
    ('attachments.purged', 'raw', 'attachments of archived threads (or never sent) were deleted; their names and hashes')
ON CONFLICT (name) DO NOTHING;
