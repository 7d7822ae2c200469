"""Thread identity shared by both services."""

import uuid

# A chat message without a thread goes to this one; the executor creates it on first use.
DEFAULT_THREAD_ID = uuid.uuid5(uuid.NAMESPACE_URL, "petal-dispatch:default-thread")
