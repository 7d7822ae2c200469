-- name: insert_attachment --
INSERT INTO attachments (sha256, size_bytes, media_type, name, data, sent_by)
VALUES (%(sha256)s, %(size_bytes)s, %(media_type)s, %(name)s, %(data)s, %(sent_by)s)
RETURNING id, sha256, size_bytes, media_type, name, created_at

-- name: get_attachment --
SELECT id, sha256, size_bytes, media_type, name, data, created_at FROM attachments WHERE id = %(id)s
