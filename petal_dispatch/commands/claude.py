"""`petal-dispatch install-claude`: the pinned Claude Code CLI, installed into a local cache."""

from __future__ import annotations

import argparse
import os

from petal_dispatch import cli_install
from petal_dispatch.config import Settings


def install(args: argparse.Namespace, settings: Settings) -> int:
    # PETAL_CLAUDE_VERSION (an exact version or a tag such as "latest") runs the suite against another CLI
    version = cli_install.resolve(args.version or os.environ.get("PETAL_CLAUDE_VERSION")
                                  or cli_install.CLAUDE_CODE_VERSION)
    print(cli_install.install(version=version))
    return 0
