"""The executor: supervises claude processes, writes the journal, hosts the harness MCP."""
