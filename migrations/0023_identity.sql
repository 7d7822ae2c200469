-- Who answered (issue 29, defense in depth): every answer records who gave it, and only the ingress's
-- answers count as the user's.
--
-- questions.answered_by: the identity of the authenticated ingress request that answered or cancelled the
-- question (the proxy's user name, 'token' or 'open'); for a reply typed in the chat, the identity that sent
-- that message (chat_queue.sent_by). The executor acts on an answer as the user's only when it carries this
-- mark: a row answered any other way (a direct SQL write) is not taken as the user's approval.
ALTER TABLE questions ADD COLUMN answered_by text CHECK (length(answered_by) BETWEEN 1 AND 200);
GRANT UPDATE (answered_by) ON questions TO petal_ingress;

-- chat_queue.sent_by: who sent a message through the ingress (a harness message has none).
ALTER TABLE chat_queue ADD COLUMN sent_by text CHECK (length(sent_by) BETWEEN 1 AND 200);
GRANT INSERT (sent_by) ON chat_queue TO petal_ingress;
