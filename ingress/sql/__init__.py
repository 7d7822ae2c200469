"""The ingress's named queries. It only reads, enqueues, and answers questions."""

from collections.abc import Mapping
from typing import LiteralString

from shared.sql import load

queries: Mapping[str, LiteralString] = load(__name__)
