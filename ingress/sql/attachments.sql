-- name: insert_attachment --
INSERT INTO attachments (sha256, size_bytes, media_type, name, data, sent_by, model_data, model_media_type)
VALUES (%(sha256)s, %(size_bytes)s, %(media_type)s, %(name)s, %(data)s, %(sent_by)s, %(model_data)s,
        %(model_media_type)s)
RETURNING id, sha256, size_bytes, media_type, name, created_at

-- name: get_attachment --
SELECT id, sha256, size_bytes, media_type, name, data, created_at FROM attachments WHERE id = %(id)s

-- name: lock_attachments --
-- The attachments a message is about to carry, locked until the message's transaction ends: two messages
-- sent at once cannot both take the same one.
SELECT id, size_bytes, sent_by, chat_message_id FROM attachments WHERE id = ANY(%(ids)s::uuid[]) FOR UPDATE

-- name: mark_attachments_sent --
UPDATE attachments SET chat_message_id = %(message_id)s
WHERE id = ANY(%(ids)s::uuid[]) AND chat_message_id IS NULL
