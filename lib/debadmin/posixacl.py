"""POSIX ACLs as the kernel stores them in the system.posix_acl_access and
system.posix_acl_default extended attributes (linux/posix_acl_xattr.h): a version
(2), then one (tag, perm, id) entry of 8 bytes each, little-endian, sorted by tag
and id.

Read and written without libacl where a tool needs only the bits: journal-acl-setup's
check reads many files' attributes this way, sbuild-fast adds one entry to a
directory's ACL. Entries are a mapping (tag, id) -> rwx bits; the id of an entry
that names no user or group is UNDEFINED. The tags are libacl's values, so that
posix1e.ACL_USER and USER are the same number.

Importing this module costs one struct import: no typing at run time.
"""

from __future__ import annotations  # annotations stay text: typing is never imported

import struct

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Dict, Optional, Tuple

    Entries = Dict[Tuple[int, int], int]  # (tag, id) -> rwx bits

ACCESS_XATTR, DEFAULT_XATTR = "system.posix_acl_access", "system.posix_acl_default"
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
UNDEFINED = 0xFFFFFFFF  # the id of an entry that names no user or group
TAGS = frozenset((USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER))
VERSION = b"\x02\x00\x00\x00"  # POSIX_ACL_XATTR_VERSION
ENTRY = struct.Struct("<HHI")


class FormatError(ValueError):
    """An attribute that is not a POSIX ACL the kernel would have written."""


def parse(data: bytes) -> Optional[Entries]:
    """The entries of an ACL attribute; None for none (b"")."""
    if not data:
        return None
    if len(data) % ENTRY.size != len(VERSION) or data[: len(VERSION)] != VERSION:
        raise FormatError("not a POSIX ACL attribute")
    result: Entries = {}
    for tag, perm, ident in ENTRY.iter_unpack(data[len(VERSION) :]):
        if tag not in TAGS:
            raise FormatError(f"unknown entry tag {tag:#x}")
        result[(tag, ident if tag in (USER, GROUP) else UNDEFINED)] = perm & 7
    return result or None


def pack(entries: Entries) -> bytes:
    """The attribute of entries, in the order the kernel requires."""
    return VERSION + b"".join(
        ENTRY.pack(tag, perm, ident) for (tag, ident), perm in sorted(entries.items())
    )


def from_mode(mode: int) -> Entries:
    """The minimal ACL of a file without an access ACL: its permission bits."""
    return {
        (USER_OBJ, UNDEFINED): (mode >> 6) & 7,
        (GROUP_OBJ, UNDEFINED): (mode >> 3) & 7,
        (OTHER, UNDEFINED): mode & 7,
    }
