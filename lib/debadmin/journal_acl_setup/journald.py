"""journal-acl-setup: journald's configuration as the target system's systemd reads it."""

from __future__ import annotations  # annotations stay text: typing is never imported

import os
import re
from pathlib import Path

from debadmin import sysconf
from debadmin.errors import Error, NotApplicable
from debadmin.journal_acl_setup.groups import lookup_group
from debadmin.journal_acl_setup.journaldir import (
    JOURNALD_BINARIES,
    JOURNALD_CONF_DIRS,
    MAIN_CONF_DIRS,
    MAIN_CONF_SINCE,
    SYSTEMD_SHARED_DIRS,
    contained,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import List, Optional, Tuple


def require_journald(root: Path) -> None:
    if not any((root / path).exists() for path in JOURNALD_BINARIES):
        raise NotApplicable(f"systemd-journald is not installed in {root}")


def journal_gid(root: Path) -> int:
    gid = lookup_group("systemd-journal", root)
    if gid is None:
        raise NotApplicable("group systemd-journal does not exist (is systemd installed?)")
    return gid


def systemd_version(root: Path = Path("/")) -> Optional[int]:
    """The major version of the systemd in ROOT, from libsystemd-shared-NNN.so; None: unknown."""
    versions = []
    for directory in SYSTEMD_SHARED_DIRS:
        for path in root.glob(f"{directory}/libsystemd-shared-*.so"):
            match = re.match(r"libsystemd-shared-(\d+)", path.name)
            if match:
                versions.append(int(match.group(1)))
    return max(versions) if versions else None


def journald_main_conf(root: Path = Path("/")) -> Optional[Path]:
    """The main journald.conf that journald reads, or None.

    systemd < 256 (bookworm's 252) reads only /etc/systemd/journald.conf; systemd >= 256
    (trixie's 257) the first of /etc, /run, /usr/local/lib and /usr/lib, where a file that
    is not a regular file (a link to /dev/null) masks the later ones.  An unknown version
    is taken as new: both agree whenever /etc has the file.
    """
    version = systemd_version(root)
    directories = ("etc",) if version is not None and version < MAIN_CONF_SINCE else MAIN_CONF_DIRS
    for directory in directories:
        path = root / directory / "systemd/journald.conf"
        if os.path.lexists(path):
            return path if path.is_file() else None
    return None


def journald_storage(root: Path = Path("/")) -> Tuple[str, Optional[str]]:
    """The effective journald Storage= value and the file that set it (None: the default).

    The main journald.conf, then drop-ins in journald.conf.d/ from /etc, /run,
    /usr/local/lib and /usr/lib, a file name in an earlier directory masking the same name
    in later ones, all drop-ins in file-name order: the last assignment wins, as in systemd.
    """
    files: List[Path] = []
    main_conf = journald_main_conf(root)
    if main_conf is not None:
        files.append(main_conf)
    files.extend(
        sysconf.dropin_files(
            root, (f"{d}/systemd/journald.conf.d" for d in JOURNALD_CONF_DIRS), ".conf"
        )
    )
    storage, source = "auto", None
    for path in files:
        if root != Path("/"):
            contained(root, os.path.relpath(path, root))  # a drop-in linked out of the image
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise Error(f"cannot read {path}: {exc.strerror}") from None
        section = None
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, value = line.partition("=")
            if sep and section == "Journal" and key.strip() == "Storage":
                value = value.strip()
                storage, source = (value or "auto"), str(path)
    return storage, source
