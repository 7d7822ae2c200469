"""The application: the command line, `up`, configuration and the demo; the only place that reads the environment and wires the services."""

# The release: bumped with a CHANGELOG.md entry of the same number (tests/unit/test_release.py holds the two
# together); the wheel's metadata takes it from here (pyproject.toml [tool.hatch.version]), so a clone, an archive
# and a wheel built offline all carry it, with or without git tags.
__version__ = "0.2.0"
