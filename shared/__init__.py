"""What the ingress and the executor both use: settings, the database owner, models, queries, logging."""
