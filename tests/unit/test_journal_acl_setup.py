"""Unit tests for journal-acl-setup: parsers, the ACL rule, config, and apply on a tree."""

import json
import os
import shutil
import subprocess

import pytest

from debadmin.errors import Error, NotApplicable
from debadmin.tools import journal_acl_setup as jas

GETFACL = """\
# file: /r/var/log/journal
# owner: 0
# group: 101
# flags: -s-
user::rwx
group::r-x
group:4:r-x
mask::r-x
other::r-x
default:user::rwx
default:group::r-x
default:group:4:r-x
default:mask::r-x
default:other::r-x

# file: /r/var/log/journal/m/odd\\040name\\012x.journal
# owner: 0
# group: 101
user::rw-
group::r--
group:4:r--\t#effective:---
mask::---
other::---

"""


def test_parse_getfacl():
    top, odd = jas.parse_getfacl(GETFACL)
    assert (top.path, top.uid, top.gid, top.flags) == ("/r/var/log/journal", 0, 101, "-s-")
    assert top.entries["group:4"] == "r-x" and top.defaults["group:4"] == "r-x"
    assert odd.path == "/r/var/log/journal/m/odd name\nx.journal"
    assert odd.entries["mask:"] == "---"


def test_parse_getfacl_garbage():
    with pytest.raises(Error):
        jas.parse_getfacl("user::rwx\n")


@pytest.mark.parametrize(
    "entries,gid,expected",
    [
        ({"user:": "rw-", "group:": "r--", "other:": "---"}, 101, True),  # owning group
        ({"user:": "rw-", "group:": "r--", "other:": "---"}, 4, False),
        (
            {"user:": "rw-", "group:": "---", "group:4": "r--", "mask:": "r--", "other:": "---"},
            4,
            True,
        ),
        (
            {"user:": "rw-", "group:": "r--", "group:4": "r--", "mask:": "---", "other:": "---"},
            4,
            False,
        ),  # masked out
        ({"user:": "rw-", "group:": "---", "other:": "r--"}, 4, True),  # falls to other
        ({"user:": "rw-", "group:": "---", "other:": "r--"}, 101, False),  # matched, never other
    ],
)
def test_group_can(entries, gid, expected):
    acl = jas.Acl(path="/x", uid=0, gid=101, entries=entries)
    assert jas.group_can(acl, gid, "r") is expected


def test_group_can_defaults():
    acl = jas.Acl(path="/x", uid=0, gid=101, entries={"other:": "r-x"})
    assert not jas.group_can(acl, 4, "rx", defaults=True)
    acl.defaults = {
        "user:": "rwx",
        "group:": "r-x",
        "group:4": "r-x",
        "mask:": "r-x",
        "other:": "---",
    }
    assert jas.group_can(acl, 4, "rx", defaults=True)


def make_root(tmp_path):
    root = tmp_path / "root"
    (root / "etc/systemd").mkdir(parents=True)
    (root / "lib/systemd").mkdir(parents=True)
    (root / "lib/systemd/systemd-journald").write_text("")
    (root / "var/log").mkdir(parents=True)
    gid = os.getgid()
    (root / "etc/group").write_text(
        f"root:x:0:\nadm:x:4:\nsystemd-journal:x:{gid}:\nstaff:x:50:\n"
    )
    return root


def test_journald_storage_order(tmp_path):
    root = make_root(tmp_path)
    assert jas.journald_storage(root) == ("auto", None)
    (root / "etc/systemd/journald.conf").write_text("[Journal]\n#Storage=none\nStorage=volatile\n")
    assert jas.journald_storage(root)[0] == "volatile"
    usr = root / "usr/lib/systemd/journald.conf.d"
    usr.mkdir(parents=True)
    (usr / "10-a.conf").write_text("[Journal]\nStorage=persistent\n")
    (usr / "20-b.conf").write_text("[Journal]\nStorage=none\n")
    assert jas.journald_storage(root) == ("none", str(usr / "20-b.conf"))
    etc = root / "etc/systemd/journald.conf.d"
    etc.mkdir()
    (etc / "20-b.conf").write_text("[Journal]\nStorage=auto\n")  # masks the /usr one
    assert jas.journald_storage(root) == ("auto", str(etc / "20-b.conf"))
    (etc / "20-b.conf").write_text("# nothing\n")
    assert jas.journald_storage(root) == ("persistent", str(usr / "10-a.conf"))
    (etc / "30-c.conf").write_text("[Other]\nStorage=none\n")  # wrong section
    assert jas.journald_storage(root)[0] == "persistent"


def test_configured_groups(tmp_path):
    root = make_root(tmp_path)
    assert jas.configured_groups(root) == ["adm"]
    (root / "etc/default").mkdir()
    (root / "etc/default/journal-acl-setup").write_text(
        '# comment\nJOURNAL_ACL_GROUPS="adm staff"  # trailing\n'
    )
    assert jas.configured_groups(root) == ["adm", "staff"]
    (root / "etc/default/journal-acl-setup").write_text('JOURNAL_ACL_GROUPS="adm\n')
    with pytest.raises(Error, match="cannot parse"):
        jas.configured_groups(root)


@pytest.mark.parametrize("name", ["", "a;b", "$(id)", "-rf", "x" * 33, "Adm", "a b"])
def test_bad_group_names(tmp_path, name):
    with pytest.raises(Error):
        jas.resolve_groups([name], make_root(tmp_path))


def test_unknown_group(tmp_path):
    with pytest.raises(Error, match="unknown group: nosuch"):
        jas.resolve_groups(["nosuch"], make_root(tmp_path))


def test_not_applicable_without_journald(tmp_path):
    root = make_root(tmp_path)
    (root / "lib/systemd/systemd-journald").unlink()
    with pytest.raises(NotApplicable):
        jas.inspect(root, {"adm": 4})


def test_render_tmpfiles():
    text = jas.render_tmpfiles(["adm", "staff"])
    assert "group:adm" not in text
    assert "a+ /var/log/journal - - - - d:group:staff:r-x,group:staff:r-x\n" in text
    assert "a+ /var/log/journal/%m/system.journal - - - - group:staff:r--\n" in text


needs_acl_tools = pytest.mark.skipif(
    not (shutil.which("getfacl") and shutil.which("setfacl")), reason="acl not installed"
)


@needs_acl_tools
def test_check_lists_shortfalls_and_ignores_symlinks(tmp_path, capsys):
    root = make_root(tmp_path)
    journal = root / "var/log/journal"
    (journal / "m").mkdir(parents=True)
    (journal / "m/system@1.journal").write_text("x")
    os.chmod(journal / "m/system@1.journal", 0o600)
    secret = tmp_path / "secret"
    secret.write_text("s")
    os.chmod(secret, 0o600)
    (journal / "m/link.journal").symlink_to(secret)
    rc = jas.main(["check", "--root", str(root), "--json", "-g", "adm", "-g", "staff"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and not report["ok"]
    assert report["ignored_symlinks"] == [str(journal / "m/link.journal")]
    kinds = {(s["kind"], s["group"], s["path"]) for s in report["shortfalls"]}
    assert ("unreadable", "staff", str(journal / "m/system@1.journal")) in kinds
    assert ("no-default-acl", "adm", str(journal / "m")) in kinds
    assert ("tmpfiles", None, str(root / jas.TMPFILES_DROPIN)) in kinds
    assert not any(s["path"] == str(journal / "m/link.journal") for s in report["shortfalls"])


@needs_acl_tools
def test_apply_dry_run_changes_nothing(tmp_path, capsys):
    root = make_root(tmp_path)
    rc = jas.main(["apply", "--root", str(root), "--dry-run", "-g", "staff"])
    out = capsys.readouterr().out
    assert rc == 0 and "would create" in out
    assert not (root / "var/log/journal").exists()
    assert not (root / jas.TMPFILES_DROPIN).exists()


@needs_acl_tools
def test_apply_setfacl_does_not_follow_symlinks(tmp_path):
    """What apply runs: the symlink's target keeps its ACL; real files gain one."""
    journal = tmp_path / "journal"
    (journal / "m").mkdir(parents=True)
    (journal / "m/a.journal").write_text("x")
    secret = tmp_path / "secret"
    secret.write_text("s")
    (journal / "m/trap").symlink_to(secret)
    (journal / "dirtrap").symlink_to(tmp_path)
    gid = os.getgid()
    subprocess.run(
        [
            "setfacl",
            "--recursive",
            "--physical",
            "--modify",
            f"group:{gid}:rX,default:group:{gid}:rX",
            "--",
            str(journal),
        ],
        check=True,
    )
    acls = {a.path: a for a in jas.read_acls(journal)}
    assert f"group:{gid}" in acls[str(journal / "m/a.journal")].entries
    assert str(journal / "m/trap") not in acls
    secret_acl = jas.parse_getfacl(
        subprocess.run(
            ["getfacl", "--absolute-names", "--numeric", str(secret)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )[0]
    assert f"group:{gid}" not in secret_acl.entries
    assert jas.find_symlinks(journal) == [str(journal / "dirtrap"), str(journal / "m/trap")]
