"""journal-acl-setup: the groups: names checked, looked up in the target system, and JOURNAL_ACL_GROUPS."""

from __future__ import annotations  # annotations stay text: typing is never imported

import argparse
import grp
import re
from pathlib import Path

from debadmin import fsutil, sysconf
from debadmin.errors import Error
from debadmin.findings import finding
from debadmin.journal_acl_setup.journaldir import DEFAULTS_FILE, write_file

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple

    Finding = Dict[str, Any]


STOCK_GROUP = "adm"  # systemd's own tmpfiles.d/systemd.conf grants adm already


# fullmatch only: re's "$" also matches before a final newline.
GROUP_NAME = re.compile(r"[a-z_][a-z0-9_-]*[$]?")


DEFAULTS_HEADER = (
    "# Groups that journal-acl-setup grants read access to the systemd journal, at\n"
    "# package configuration and at boot. Separate names with spaces.\n"
)


def read_groups(root: Path = Path("/")) -> Dict[str, int]:
    """Group name -> gid from ROOT/etc/group (the target system's, not the caller's NSS)."""
    path = root / "etc/group"
    groups: Dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise Error(f"cannot read {path}: {exc.strerror}") from None
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit():
            groups.setdefault(fields[0], int(fields[2]))
    return groups


def validate_group_name(name: str) -> str:
    """Return name if it is a valid group name, else raise."""
    if len(name) > 32 or not GROUP_NAME.fullmatch(name):
        raise Error(f"invalid group name: {name!r}")
    return name


def lookup_group(name: str, root: Path = Path("/")) -> Optional[int]:
    """The gid of a group, or None.

    On the running system through NSS (so LDAP and sssd groups count), in an image from
    ROOT/etc/group, never from the caller's databases.
    """
    if root == Path("/"):
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            return None
    return read_groups(root).get(name)


def resolve_groups(names: Iterable[str], root: Path = Path("/")) -> Dict[str, int]:
    """Validate and look up every group; raise before anything is touched."""
    resolved: Dict[str, int] = {}
    for name in names:
        validate_group_name(name)
        gid = lookup_group(name, root)
        if gid is None:
            raise Error(f"unknown group: {name}")
        resolved[name] = gid
    return resolved


def resolve_known(
    names: Iterable[str], root: Path = Path("/")
) -> Tuple[Dict[str, int], List[Finding]]:
    """Validate every name (a malformed one is an error before anything is touched) and
    look each up; a group that does not exist (deleted since it was configured) is a
    warning finding and the others are still granted.  None left is an error."""
    resolved: Dict[str, int] = {}
    unknown: List[Finding] = []
    for name in names:
        validate_group_name(name)
        gid = lookup_group(name, root)
        if gid is None:
            unknown.append(
                finding(
                    "unknown-group",
                    "warning",
                    f"group {name} does not exist: not granted (the others are)",
                    None,
                    group=name,
                )
            )
        else:
            resolved[name] = gid
    if not resolved:
        raise Error(f"unknown group: {', '.join(f['group'] for f in unknown)}")
    return resolved, unknown


def configured_groups(root: Path = Path("/")) -> List[str]:
    """JOURNAL_ACL_GROUPS from /etc/default/journal-acl-setup, else adm."""
    values = sysconf.read_default(root / DEFAULTS_FILE, ["JOURNAL_ACL_GROUPS"]) or {}
    _, value = values.get("JOURNAL_ACL_GROUPS", (0, ""))
    names = [n for n in re.split(r"[\s,]+", value) if n]
    for name in names:  # apply -g writes them back, in double quotes
        if len(name) > 32 or not GROUP_NAME.fullmatch(name):
            raise Error(
                f"{root / DEFAULTS_FILE}: invalid group name in JOURNAL_ACL_GROUPS: {name!r}"
            )
    return names or [STOCK_GROUP]


def wanted_groups(args: argparse.Namespace, root: Path) -> List[str]:
    names = args.group or configured_groups(root)
    unique: List[str] = []
    for name in names:
        if name not in unique:
            unique.append(name)
    return unique


def write_configured_groups(root: Path, names: List[str]) -> None:
    """Set JOURNAL_ACL_GROUPS in /etc/default/journal-acl-setup to names.

    apply -g and revert -g change the configuration, so that what is granted is what
    it says: the boot-time apply re-grants the configured groups and nothing else.  The
    last assignment is replaced in place (the other lines and comments stay); a file
    without one gets it appended.
    """
    path = root / DEFAULTS_FILE
    for name in names:  # also those read from the file: it is written in double quotes
        validate_group_name(name)
    line = f'JOURNAL_ACL_GROUPS="{" ".join(names)}"\n'
    text = fsutil.read_text(path)
    if text is None:
        write_file(path, DEFAULTS_HEADER + line)
        return
    values = sysconf.read_default(path, ["JOURNAL_ACL_GROUPS"]) or {}
    lines = text.splitlines(keepends=True)
    if "JOURNAL_ACL_GROUPS" in values:
        lines[values["JOURNAL_ACL_GROUPS"][0] - 1] = line
    else:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.append(line)
    # An admin's link (to a file kept under configuration management) stays a link: its
    # target is rewritten (check_paths has made sure it stays inside an image).
    fsutil.atomic_write(path, "".join(lines), follow_symlinks=True)
