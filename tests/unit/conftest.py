"""Pure tests: no database, no CLI. Nothing here may use the PostgreSQL fixtures."""
