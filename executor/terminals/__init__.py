"""Terminal sessions: the user's interactive Claude Code held by the executor in a pseudo-terminal
(`petal-dispatch claude`), one conversation on two screens — followed, steered and answered from the page,
detached and attached again in any terminal (executor/terminals/server.py)."""
