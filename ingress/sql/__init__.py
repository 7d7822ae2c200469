"""The ingress's named queries. It only reads, enqueues, and answers questions."""

from shared.sql import load

queries: dict[str, str] = load(__name__)
