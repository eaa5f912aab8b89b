"""journal-acl-setup: the tool's name in messages, its logger, and warnings -q does not hide."""

from __future__ import annotations  # annotations stay text: typing is never imported

from debadmin import cli

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any


PROG = "journal-acl-setup"


class _Log:
    """The "debadmin" logger, imported when a message is to be shown: check and a no-op
    apply log nothing (or below the level), and skip logging's start-up cost."""

    LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

    def __getattr__(self, name: str) -> Any:
        level = self.LEVELS.get(name)
        if level is not None and not cli.enabled(level):
            return lambda *args, **kwargs: None
        return getattr(cli.logger(), name)


log = _Log()


def warn(message: str) -> None:
    """A warning -q does not hide (a group that is not there)."""
    import sys

    sys.stderr.write(f"{PROG}: warning: {message}\n")
    sys.stderr.flush()
