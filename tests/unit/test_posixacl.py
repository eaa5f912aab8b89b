"""debadmin.posixacl against libacl (python3-pylibacl) on real files."""

import os

import posix1e
import pytest

from debadmin import posixacl as A


def libacl_entries(acl):
    """(tag, id) -> rwx bits of a posix1e.ACL, as posixacl keys them."""
    result = {}
    for entry in acl:
        tag = entry.tag_type
        ident = entry.qualifier if tag in (posix1e.ACL_USER, posix1e.ACL_GROUP) else A.UNDEFINED
        perms = entry.permset
        result[(tag, ident)] = (
            (4 if perms.read else 0) | (2 if perms.write else 0) | (1 if perms.execute else 0)
        )
    return result


def test_tags_are_libacls():
    assert (A.USER_OBJ, A.USER, A.GROUP_OBJ, A.GROUP, A.MASK, A.OTHER) == (
        posix1e.ACL_USER_OBJ,
        posix1e.ACL_USER,
        posix1e.ACL_GROUP_OBJ,
        posix1e.ACL_GROUP,
        posix1e.ACL_MASK,
        posix1e.ACL_OTHER,
    )


@pytest.mark.needs_mapped_ids
def test_parse_and_pack_agree_with_libacl(tmp_path):
    path = tmp_path / "d"
    path.mkdir()
    text = "u::rwx,u:1234:rwx,u:99:r,g::r-x,g:4:r-x,g:50:r,m::r-x,o::-"
    try:
        posix1e.ACL(text=text).applyto(str(path))
        posix1e.ACL(text="u::rwx,g::r-x,g:4:r-x,m::r-x,o::-").applyto(
            str(path), posix1e.ACL_TYPE_DEFAULT
        )
    except OSError:
        pytest.skip("no POSIX ACLs here")
    for attribute, kind in ((A.ACCESS_XATTR, "file"), (A.DEFAULT_XATTR, "filedef")):
        data = os.getxattr(path, attribute)
        entries = A.parse(data)
        assert entries == libacl_entries(posix1e.ACL(**{kind: str(path)}))
        assert A.pack(entries) == data  # the kernel's order: by tag, then id
    # written by pack, read back by libacl
    entries = A.from_mode(0o750)
    entries[(A.USER, 100000)] = 1
    entries[(A.MASK, A.UNDEFINED)] = 5
    os.setxattr(path, A.ACCESS_XATTR, A.pack(entries))
    assert libacl_entries(posix1e.ACL(file=str(path))) == entries
    assert posix1e.ACL(file=str(path)).valid()


def test_from_mode_is_the_minimal_acl(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"")
    path.chmod(0o640)
    assert A.from_mode(path.stat().st_mode) == libacl_entries(posix1e.ACL(file=str(path)))


def test_damaged_attributes_are_refused():
    good = A.pack(A.from_mode(0o644))
    assert A.parse(b"") is None
    for damaged in (good[:-1], b"\x01\x00\x00\x00" + good[4:], good[:4] + b"\x40" + good[5:]):
        with pytest.raises(A.FormatError):
            A.parse(damaged)
    assert issubclass(A.FormatError, ValueError)
