"""What the ingress and the executor both use: the database owner, models, queries, the journal, logging."""
