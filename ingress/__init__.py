"""The ingress: REST actions that only write queue tables, and SSE reads of the store."""
