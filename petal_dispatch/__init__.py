"""The application: the command line, `up`, configuration and the demo; the only place that reads the environment and wires the services."""
