-- The CLI's control channel on stdout (--input-format stream-json, --permission-prompt-tool stdio): its
-- lines are journaled as their own types, never folded into stream.other.
INSERT INTO event_types (name, tier, description) VALUES
    ('stream.control_request',        'raw', 'stream-json: a control request from the CLI (e.g. can_use_tool)'),
    ('stream.control_response',       'raw', 'stream-json: the CLI''s answer to a control request (e.g. interrupt)'),
    ('stream.control_cancel_request', 'raw', 'stream-json: the CLI withdrew a control request')
ON CONFLICT (name) DO NOTHING;
