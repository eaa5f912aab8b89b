"""Unit tests for the shared library: atomic writes, locks, subprocess, versions, CLI."""

import os
import stat

import pytest

from debadmin import cli, debver, fsutil, proc
from debadmin.errors import Error, NotApplicable


def test_atomic_write_replaces_and_sets_mode(tmp_path):
    target = tmp_path / "f.conf"
    target.write_text("old")
    fsutil.atomic_write(target, "new\n", mode=0o600)
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["f.conf"]


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "f.conf"
    target.write_text("old")

    def boom(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        fsutil.atomic_write(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.conf"]


def test_atomic_write_missing_directory_is_an_error(tmp_path):
    with pytest.raises(Error, match="cannot write"):
        fsutil.atomic_write(tmp_path / "no/such/dir/f", "x")


def test_atomic_write_keeps_mode_and_replaces_symlink(tmp_path):
    target = tmp_path / "f.conf"
    target.write_text("old")
    target.chmod(0o600)
    fsutil.atomic_write(target, "new")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    fsutil.atomic_write(tmp_path / "fresh", "x")
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o644
    # A link is replaced by a file by default (paths in a --root image must not be
    # followed out of it); with follow_symlinks, the file it points to is written.
    real = tmp_path / "dotfiles" / "rc"
    real.parent.mkdir()
    real.write_text("mine")
    real.chmod(0o600)
    link = tmp_path / "rc"
    link.symlink_to(real)
    fsutil.atomic_write(link, "new", follow_symlinks=True)
    assert link.is_symlink() and real.read_text() == "new"
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert sorted(os.listdir(real.parent)) == ["rc"]
    fsutil.atomic_write(link, "plain")
    assert not link.is_symlink() and link.read_text() == "plain" and real.read_text() == "new"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files of another user")
def test_atomic_write_keeps_owner_as_root(tmp_path):
    target = tmp_path / "f"
    target.write_text("old")
    os.chown(target, 65534, 65534)
    fsutil.atomic_write(target, "new")
    assert (target.stat().st_uid, target.stat().st_gid) == (65534, 65534)


def test_lock_refuses_symlink_and_foreign_files(tmp_path):
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Error, match="cannot open lock"):
        with fsutil.locked(tmp_path / "lock"):
            pass
    if os.geteuid() == 0:  # a lock file another user made could be held by them for ever
        foreign = tmp_path / "foreign"
        foreign.write_text("")
        os.chown(foreign, 65534, 65534)
        with pytest.raises(Error, match="refusing lock"):
            with fsutil.locked(foreign):
                pass


def test_remove_file(tmp_path):
    (tmp_path / "x").write_text("x")
    assert fsutil.remove_file(tmp_path / "x") is True
    assert fsutil.remove_file(tmp_path / "x") is False


def test_lock_is_exclusive(tmp_path):
    lock = tmp_path / "lock"
    with fsutil.locked(lock):
        pid = os.fork()
        if pid == 0:  # a second process must not get the lock
            code = 2
            try:
                with fsutil.locked(lock, wait=False):
                    code = 1
            except Error:
                code = 0
            finally:  # never back into pytest in the child, whatever happened
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_proc_run():
    assert proc.run(["sh", "-c", "echo $LC_ALL"]).stdout == "C.UTF-8\n"
    with pytest.raises(Error, match="^false failed: exit status 1$"):
        proc.run(["false"])
    with pytest.raises(Error, match="last line"):
        proc.run(["sh", "-c", "echo first >&2; echo last line >&2; exit 3"])
    assert proc.run(["false"], check=False).returncode == 1
    with pytest.raises(Error, match="command not found"):
        proc.run(["/nonexistent/command"])


def test_debver():
    assert debver.compare("2.0.20-1~deb12u2", "2.0.20") > 0
    assert debver.compare("1.0~rc1", "1.0") < 0
    assert debver.at_least("0.85.0", "0.85.0")
    assert not debver.at_least("0.85.0", "0.88.4")


def test_run_maps_exceptions(capsys):
    parser = cli.new_parser("t", "test")

    def raises(exc):
        def func(args):
            raise exc

        return func

    assert cli.run("t", parser, [], raises(Error("bad input"))) == 2
    assert capsys.readouterr().err == "t: error: bad input\n"
    assert cli.run("t", parser, [], raises(NotApplicable("no UEFI"))) == 3
    assert capsys.readouterr().err == "t: no UEFI\n"  # a verdict, not an error
    assert cli.run("t", parser, ["--bogus"], lambda a: 0) == 2
    assert cli.run("t", parser, ["-q"], lambda a: 0) == 0


def test_read_default(tmp_path):
    from debadmin import sysconf

    path = tmp_path / "default"
    assert sysconf.read_default(path, ["A"]) is None
    path.write_text("# c\nA=\"x y\"  # note\nB=1\nA='z'\n")
    assert sysconf.read_default(path, ["A"]) == {"A": (4, "z")}
    with pytest.raises(Error, match=r":3: expected A=\.\.\.$"):
        sysconf.read_default(path, ["A"], strict=True)
    path.write_text('A="unterminated\n')
    with pytest.raises(Error, match=":1: cannot parse A"):
        sysconf.read_default(path, ["A"])


def test_dropin_files_masking_and_order(tmp_path):
    from debadmin import sysconf

    for directory, name in (
        ("etc", "20-b.conf"),
        ("usr", "20-b.conf"),
        ("usr", "10-a.conf"),
        ("usr", "30-c.txt"),
        ("run", "15-x.conf"),
    ):
        (tmp_path / directory).mkdir(exist_ok=True)
        (tmp_path / directory / name).write_text("")
    found = sysconf.dropin_files(tmp_path, ["etc", "run", "usr", "missing"], ".conf")
    assert found == [
        tmp_path / "usr/10-a.conf",
        tmp_path / "run/15-x.conf",
        tmp_path / "etc/20-b.conf",
    ]


def test_read_text(tmp_path):
    assert fsutil.read_text(tmp_path / "missing") is None
    (tmp_path / "f").write_text("x\n")
    assert fsutil.read_text(tmp_path / "f") == "x\n"
    (tmp_path / "bad").write_bytes(b"\xff\xfe")
    with pytest.raises(Error, match="^cannot read .*bad: "):
        fsutil.read_text(tmp_path / "bad")
    with pytest.raises(Error, match="^cannot read "):
        fsutil.read_text(tmp_path)  # a directory


def test_findings_shape():
    from debadmin.findings import finding, needs_action, text_lines

    found = [
        finding("storage-volatile", "action", "journal is volatile", "/var/log/journal"),
        finding("old", "warning", "tarball is old", group="adm"),
    ]
    assert list(found[0]) == ["code", "severity", "subject", "message"]
    assert found[1]["subject"] is None and found[1]["group"] == "adm"
    assert needs_action(found) and not needs_action(found[1:])
    assert text_lines(found, "  ") == [
        "  action: journal is volatile",
        "  warning: tarball is old",
    ]
    with pytest.raises(ValueError):
        finding("x", "fatal", "no such severity")
