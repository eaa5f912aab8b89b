"""Debian version comparison through python3-apt."""

import functools

import apt_pkg


@functools.lru_cache(maxsize=None)
def _init() -> None:
    # version_compare raises "ValueError: _system not initialized" without this.
    apt_pkg.init_config()
    apt_pkg.init_system()


def compare(a: str, b: str) -> int:
    """<0, 0 or >0 as Debian version a sorts before, equal to or after b."""
    _init()
    return apt_pkg.version_compare(a, b)


def at_least(version: str, minimum: str) -> bool:
    return compare(version, minimum) >= 0
