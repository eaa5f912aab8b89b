"""Unit tests for sbuild-fast's session backend: the virt server protocol, the per-command
argv, the id ranges, the tmpfs decision and the sbuild block that selects it."""

import io
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from debadmin.errors import Error
from debadmin.sbuild_fast import sbuild as sbs
from debadmin.sbuild_fast import session as sfs


def sbuild_decode(answer: str):
    """What sbuild's ChrootAutopkgtest.pm does with print-execute-command's answer."""
    assert answer.startswith("ok ")
    return [
        re.sub("%([0-9A-Fa-f]{2})", lambda m: chr(int(m[1], 16)), a) for a in answer[3:].split(",")
    ]


def test_encode_argv_survives_sbuild_decoding():
    argv = ["/bin/sh", "-c", 'a=1, b="%x"; exec "$@"', "x y", "100%", "é"]
    decoded = sbuild_decode("ok " + sfs.encode_argv(argv))
    # sbuild decodes byte by byte (chr of each %XX): ASCII comes back as it went
    assert decoded[:5] == argv[:5]
    assert "\n" not in sfs.encode_argv(["a\nb"])


def fake_nsenter(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nsenter"
    tool.write_text('#!/bin/sh\nfor a; do printf "%s\\n" "$a"; done\n')
    tool.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    "command, offline",
    [
        # sbuild's build: env, runuser, cd, then dpkg-buildpackage (unshare mode: no network)
        (
            [
                "env",
                "A=1",
                "/sbin/runuser",
                "-u",
                "u",
                "--",
                "sh",
                "-c",
                "cd x",
                "exec",
                "dpkg-buildpackage",
                "-us",
            ],
            True,
        ),
        (["env", "/usr/bin/dpkg-buildpackage"], True),
        # apt as root, apt-get source as the user, lintian, copies: network as in unshare mode
        (["env", "A=1", "apt-get", "install", "-y", "dpkg-buildpackage-x"], False),
        (["env", "/sbin/runuser", "-u", "u", "--", "apt-get", "source", "hello"], False),
        (["env", "sh", "-c", "echo dpkg-buildpackage"], False),
        # any other command run as a user other than root: no network (lintian, du...)
        (["env", "/sbin/runuser", "-u", "u", "--", "lintian", "x.changes"], True),
        (["env", "/sbin/runuser", "-u", "root", "--", "lintian", "x.changes"], False),
        (["env", "A=runuser", "-u", "lintian"], False),
    ],
)
def test_exec_argv_cuts_only_the_build_off_the_network(tmp_path, command, offline):
    bin_dir = fake_nsenter(tmp_path)
    session = sfs.Session(Path("/nonexistent"), "u", [], tmp_path)
    session.init_pid = 4242
    session.offline_pid = 4343
    names = [*sfs.NAMESPACES, "root", "offline-mnt", "offline-root"]
    session.held = {name: 10 + i for i, name in enumerate(names)}
    argv = session.exec_argv()
    out = subprocess.run(
        [*argv, *command],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
    ).stdout.splitlines()
    sep = out.index("--")
    options, rest = out[:sep], out[sep + 1 :]
    # the held descriptors by path, never a pid (one another process may have taken)
    fd = f"/proc/{os.getpid()}/fd/"
    mnt, root = (17, 18) if offline else (11, 16)
    assert options == [
        f"--user={fd}10",
        f"--mount={fd}{mnt}",
        f"--uts={fd}12",
        f"--ipc={fd}13",
        f"--pid={fd}14",
        *([f"--net={fd}15"] if offline else []),
        f"--wd={fd}{root}",
    ]
    assert not any("4242" in o or "4343" in o for o in options)
    # each command in a pid, mount, ipc and uts namespace of its own, with a fresh /proc
    # and /dev/shm: what it leaves behind dies with it
    assert rest == [
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc=proc",
        "--ipc",
        "--uts",
        "--",
        *sfs.command_argv(os.uname().machine),
        *command,
    ]


def test_command_mounts_dev_shm_and_chroots_without_mount8():
    # the tree is the session's root: trixie's buildd chroot has no mount(8); perl-base
    # is essential
    argv = sfs.command_argv("x86_64")
    assert argv[0] == "/usr/bin/perl" and argv[-1] == "--"
    assert "syscall(165, " in argv[2] and '"/usr/sbin/chroot", "."' in argv[2]
    assert "syscall(40, " in sfs.command_argv("aarch64")[2]
    assert sfs.command_argv("unknown")[:3] == ["/bin/sh", "-c", sfs.COMMAND_SCRIPT]
    assert "'" not in argv[2]  # it goes between single quotes in the shell script


def test_subid_range_takes_the_first_line_by_name(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/subuid").write_text("1000:1:2\nbob:300000:65536\nu:100000:65536\nu:5:5\n")
    assert sfs.subid_range("subuid", "u", root=tmp_path) == (100000, 65536)
    with pytest.raises(Error, match="no subordinate ids for eve in /etc/subuid"):
        sfs.subid_range("subuid", "eve", root=tmp_path)
    with pytest.raises(Error, match="cannot read /etc/subgid"):
        sfs.subid_range("subgid", "u", root=tmp_path)


def test_use_tmpfs_needs_room_for_the_build_beside_the_tree():
    tree = 500 << 20
    assert sfs.use_tmpfs(tree, 8 << 30)
    assert not sfs.use_tmpfs(tree, 3 << 30)
    assert not sfs.use_tmpfs(tree, 0)  # unknown memory: on disk


def test_mem_available(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 100 kB\nMemAvailable:   2048 kB\n")
    assert sfs.mem_available(tmp_path) == 2 << 20
    assert sfs.mem_available(tmp_path / "none") == 0


class FakeSession:
    """A session without namespaces: what serve() asks of one."""

    def __init__(self, fail=False):
        self.fail = fail
        self.calls = []

    def open(self):
        self.calls.append("open")
        if self.fail:
            raise Error("the session for x did not start: tar failed")
        return "/tmp/sbuild-fast.x"

    def exec_argv(self):
        return ["/bin/sh", "-c", "p=$1, shift", "sbuild-fast-session", "7"]

    def close(self):
        self.calls.append("close")


def test_serve_speaks_what_sbuild_asks():
    session = FakeSession()
    out = io.StringIO()
    stdin = io.StringIO("open\ncapabilities\nprint-execute-command\nclose\nquit\n")
    assert sfs.serve(session, stdin, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["ok", "ok /tmp/sbuild-fast.x"]
    assert "root-on-testbed" in lines[2].split()  # sbuild refuses a server without it
    assert sbuild_decode(lines[3]) == session.exec_argv()
    assert lines[4:] == ["ok"]  # close; quit says nothing
    assert session.calls[:2] == ["open", "close"]


def test_serve_reports_a_failed_open_and_refuses_exec():
    session = FakeSession(fail=True)
    out = io.StringIO()
    sfs.serve(session, io.StringIO("open\nprint-execute-command\nbogus\n"), out)
    lines = out.getvalue().splitlines()
    assert lines[1] == "error the session for x did not start: tar failed"
    assert lines[2].startswith("error ") and lines[3].startswith("error ")
    assert session.calls[-1] == "close"  # end of input: nothing left running


def test_config_block_selects_the_session_backend():
    block = sbs.config_block(
        "unshare", "0.89.3", "/dev/shm/tmp.sbuild.XXXXXXXXXX", "/c/debs", "/usr/bin/sbuild-fast"
    )
    assert "$chroot_mode = 'autopkgtest';\n" in block
    assert "$autopkgtest_virt_server = '/usr/bin/sbuild-fast';\n" in block
    assert "['session', '--dist', '%r', '--arch', '%a'];" in block
    # sbuild's own unshare mode keeps its settings, for --chroot-mode=unshare
    assert "$unshare_mmdebstrap_auto_create = 0;" in block and "/c/debs" in block
    assert "defaults to schroot mode" in block
    assert f"$purge_build_deps = 'never' unless {sbs.PERSISTENT_CHROOT_TEST};" in block
    plain = sbs.config_block("unshare", "0.89.3", None, None)
    assert "$chroot_mode = 'unshare';" in plain and "autopkgtest" not in plain
    # schroot chroots never go through the session backend
    assert "autopkgtest" not in sbs.config_block("schroot", "0.85", None, None, "/x")


def test_doctor_knows_the_session_backend():
    from debadmin.sbuild_fast import doctor as sfd

    config = {"chroot_mode": "autopkgtest", "autopkgtest_virt_server": "/usr/bin/sbuild-fast"}
    assert sbs.uses_session_backend(config)
    assert not sbs.uses_session_backend(dict(config, autopkgtest_virt_server="/usr/bin/x"))
    assert not sbs.uses_session_backend({"chroot_mode": "unshare"})
    chroots = [{"mode": "unshare", "name": "bookworm-amd64"}]
    facts = {"chroot_mode": "autopkgtest", "session_backend": True, "chroots": chroots}
    (found,) = sfd.rule_chroot_mode(facts)
    assert found["code"] == "session-backend" and found["severity"] == "info"
    # another autopkgtest server leaves the sbuild-fast tarballs unused: action
    (found,) = sfd.rule_chroot_mode(dict(facts, session_backend=False))
    assert found["code"] == "chroot-mode" and found["severity"] == "action"
    (found,) = sfd.rule_command_cost({"command_cost": {"session": 0.004}})
    assert "4 ms with the session backend" in found["message"] and found["subject"] == "session"


def test_doctor_does_not_offer_schroot_to_session_backend_users():
    from debadmin.sbuild_fast import doctor as sfd

    facts = {
        "chroots": [{"mode": "unshare"}],
        "schroot_installed": True,
        "tmpfs_overlay": {"fits": True, "reason": ""},
    }
    assert [f["code"] for f in sfd.rule_schroot_mode(facts)] == ["schroot-faster"]
    assert sfd.rule_schroot_mode(dict(facts, session_backend=True)) == []


def test_tmpdir_under_a_private_parent_is_not_used(tmp_path, monkeypatch):
    # pam_tmpdir and $XDG_RUNTIME_DIR: a 0700 parent the session's root cannot search
    tmp_path.chmod(0o755)
    private = tmp_path / "private"
    tmpdir = private / "tmp"
    tmpdir.mkdir(parents=True)
    tmpdir.chmod(0o1777)
    private.chmod(0o700)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    assert not sfs.reachable_by_others(tmpdir)
    assert sfs.mountpoint_parent() == Path("/tmp")
    assert sfs.disk_parent() == Path("/var/tmp")


def test_tmpdir_others_reach_is_used(monkeypatch):
    # pytest's tmp_path lies under a 0700 directory: this one under /var/tmp
    with tempfile.TemporaryDirectory(dir="/var/tmp") as top:
        shared = Path(top) / "shared"
        shared.mkdir()
        Path(top).chmod(0o755)
        shared.chmod(0o1777)
        monkeypatch.setenv("TMPDIR", str(shared))
        if not sfs.reachable_by_others(shared):
            pytest.skip("/var/tmp is not searchable by others here")
        assert sfs.mountpoint_parent() == shared
        assert sfs.disk_parent() == shared
        # the user's own 0755 directory: a mount point may go there, the tree may not
        shared.chmod(0o755)
        assert sfs.mountpoint_parent() == shared
        assert sfs.disk_parent() == Path("/var/tmp")


def test_tmpfs_size_is_bounded_and_configurable(monkeypatch):
    total = 16 << 30
    monkeypatch.delenv(sfs.TMPFS_SIZE_VAR, raising=False)
    assert sfs.tmpfs_size(total) == 4 << 30  # a quarter of RAM by default
    assert sfs.tmpfs_size(total, "50%") == 8 << 30
    assert sfs.tmpfs_size(total, "6G") == 6 << 30
    assert sfs.tmpfs_size(total, "512M") == 512 << 20
    assert sfs.tmpfs_size(total, "0") == 0
    monkeypatch.setenv(sfs.TMPFS_SIZE_VAR, "2g")
    assert sfs.tmpfs_size(total) == 2 << 30
    for bad in ("lots", "-1G", "150%"):
        with pytest.raises(Error, match=sfs.TMPFS_SIZE_VAR):
            sfs.tmpfs_size(total, bad)
    # the tree goes on disk where the bound leaves no room for the build beside it
    tree = 500 << 20
    assert sfs.use_tmpfs(tree, 8 << 30, 2 << 30)
    assert not sfs.use_tmpfs(tree, 8 << 30, 1 << 30)
    assert not sfs.use_tmpfs(tree, 8 << 30, 0)


def test_handshake_has_a_deadline():
    # an init that never answers (a session that cannot start): one error, no hang
    proc = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE)
    try:
        start = time.monotonic()
        with pytest.raises(Error, match=r"did not start within 0.3 s"):
            sfs.read_handshake(proc.stdout.fileno(), 0.3, lambda path: None)
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_handshake_reads_disk_then_ready():
    disks = []
    out = subprocess.Popen(["printf", "disk /var/tmp/x\\nready\\n"], stdout=subprocess.PIPE)
    assert sfs.read_handshake(out.stdout.fileno(), 5, disks.append)
    assert disks == ["/var/tmp/x"]
    out.wait()
    out.stdout.close()
    # init's end of file (it failed) or another line: not ready
    for text in ("", "oops\\n"):
        out = subprocess.Popen(["printf", text], stdout=subprocess.PIPE)
        assert not sfs.read_handshake(out.stdout.fileno(), 5, disks.append)
        out.wait()
        out.stdout.close()


# The virt server in blocks that sbuild's Sbuild::Conf reads: it only checks that the
# file is executable (sbuild-fast need not be installed where the unit tests run).
SERVER = "/usr/bin/true"


def sbuild_conf(home: Path, script: str, args: list) -> str:
    """What perl SCRIPT prints with sbuild's own Sbuild::Conf, reading HOME's ~/.sbuildrc,
    with ARGS as sbuild's command line (after '--' or a first word that is no option)."""
    env = {"HOME": str(home), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
    result = subprocess.run(
        ["perl", "-MSbuild::Conf", "-e", script, *args], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(
    subprocess.run(["perl", "-MSbuild::Conf", "-e", "1"], capture_output=True).returncode != 0,
    reason="sbuild's Sbuild::Conf is not installed",
)
@pytest.mark.parametrize(
    "argv, purge",
    [
        ([], "never"),
        (["-d", "bookworm", "x.dsc"], "never"),
        (["--chroot-mode=unshare", "x.dsc"], "always"),
        (["--chroot-mode", "schroot"], "always"),
        (["--chroot=bookworm-amd64-sbuild"], "always"),
        (["--purge-deps=always"], "never"),  # sbuild's own option is parsed later and wins
        # sbuild's other --chroot-* options name no chroot: the session is thrown away
        (["--chroot-setup-commands=true", "x.dsc"], "never"),
        (["--chroot-setup-commands", "true", "--chroot-cleanup-commands=true"], "never"),
        (["--chroot-update-failed-commands=true"], "never"),
        # the short option with its value attached, an abbreviation of --chroot-mode
        (["-cbookworm-amd64-sbuild", "x.dsc"], "always"),
        (["--chroot-m=unshare"], "always"),
        (["--chroot-mod", "unshare"], "always"),
        # after '--', only file names
        (["--", "-cx.dsc"], "never"),
    ],
)
def test_session_block_skips_the_purge_only_for_plain_builds(tmp_path, argv, purge):
    """sbuild itself reads the block: a thrown-away session skips the purge of the build
    dependencies, a chroot or chroot mode named on the command line keeps sbuild's
    default ('always')."""
    block = sbs.config_block("unshare", "0.85.0", "/dev/shm/tmp.sbuild.XXXXXXXXXX", None, SERVER)
    (tmp_path / ".sbuildrc").write_text(block)
    script = (
        "my @a = splice(@ARGV, 1); my $k = $ARGV[0]; @ARGV = @a; "
        "my $c = Sbuild::Conf::new(); print $c->get($k)"
    )
    out = sbuild_conf(tmp_path, script, ["PURGE_BUILD_DEPS", *argv])
    # the last line: sbuild 0.87.1 and later print "I: consider moving your ~/.sbuildrc"
    assert out.splitlines()[-1] == purge


def test_block_backend_reads_the_earlier_choice():
    session = sbs.config_block("unshare", "0.85.0", None, None, "/usr/bin/sbuild-fast")
    unshare = sbs.config_block("unshare", "0.85.0", None, None)
    schroot = sbs.config_block("schroot", "0.85.0", None, None)
    mine = "$build_arch_all = 1;\n$chroot_mode = 'autopkgtest';\n"  # the user's own, outside
    assert sbs.block_backend(mine + session) == "session"
    assert sbs.block_backend(mine + unshare) == "unshare"
    assert sbs.block_backend(schroot) is None
    assert sbs.block_backend(mine) is None
    assert sbs.block_backend("") is None


@pytest.mark.parametrize(
    "option, existing, expected",
    [
        ("unshare", "session", "unshare"),
        ("session", "unshare", "session"),
        (None, "unshare", "unshare"),  # a rerun keeps the admin's choice
        (None, "session", "session"),
        (None, None, "session"),  # the default where nothing was chosen
    ],
)
def test_create_keeps_the_backend_chosen_before(
    tmp_path, monkeypatch, capsys, option, existing, expected
):
    from debadmin.sbuild_fast import configure as sfm

    rc = tmp_path / ".sbuildrc"
    if existing:
        server = "/usr/bin/sbuild-fast" if existing == "session" else None
        rc.write_text(sbs.config_block("unshare", "0.85.0", None, None, server))
    monkeypatch.setattr(sbs, "sbuild_version", lambda: "0.85.0")
    monkeypatch.setattr(sbs, "sbuildrc_path", lambda **_kw: rc)
    assert sfm.chosen_backend(option) == expected
    said = capsys.readouterr().out
    assert ("keeping the" in said) == (option is None and existing is not None)


def started_session(tmp_path, monkeypatch):
    """A real session (namespaces, init, the held descriptors) on a tiny tree whose /usr
    is the host's, bound in: for a normal user with subordinate ids (sbuild's case)."""
    import pwd
    import tarfile

    # Under faketime (release/test-builds builds the package with faketime +398d) the
    # session's processes, subordinate ids, cannot open libfaketime's semaphore of the
    # building user and die: the session runs at the real time (nothing here reads it).
    if "faketime" in os.environ.get("LD_PRELOAD", ""):
        monkeypatch.delenv("LD_PRELOAD")

    user = pwd.getpwuid(os.getuid()).pw_name
    if os.getuid() == 0:
        pytest.skip("a session is a normal user's (root's subordinate ids differ here)")
    if not Path("/bin").is_symlink():
        pytest.skip("the host's /usr is not merged: the tiny tree cannot borrow it")
    try:
        sfs.subid_range("subuid", user)
        sfs.subid_range("subgid", user)
    except Error as exc:
        pytest.skip(str(exc))
    if subprocess.run(["unshare", "--user", "--map-root-user", "true"]).returncode != 0:
        pytest.skip("unprivileged user namespaces are not available here")
    missing = [c for c in ("newuidmap", "newgidmap") if not shutil.which(c)]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} not installed (package uidmap): a session maps "
            "the user's subordinate ids with them"
        )
    tree = tmp_path / "tree"
    for d in ("etc", "dev", "mnt", "proc", "sys", "tmp", "usr"):
        (tree / d).mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        if Path("/" + link).is_symlink():
            (tree / link).symlink_to(os.readlink("/" + link))
    tarball = tmp_path / "tiny.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(tree, arcname=".")
    session = sfs.Session(tarball, user, [(Path("/usr"), "/usr")], sfs.mountpoint_parent())
    session.announce = False
    session.open()
    return session


def test_each_command_gets_its_own_shm_ipc_and_hostname(tmp_path, monkeypatch):
    session = started_session(tmp_path, monkeypatch)
    try:
        argv = session.exec_argv()

        def run(script):
            out = subprocess.run([*argv, "sh", "-c", script], capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            return out.stdout.split("\n")

        # a file in /dev/shm, a SysV shared memory segment, a hostname: left by one command
        first = run(
            "cat /proc/sys/kernel/hostname; echo x > /dev/shm/left; ipcmk -M 4096 >/dev/null;"
            " ipcs -m | grep -c '^0x'; hostname other; cat /proc/sys/kernel/hostname"
        )
        assert first[:3] == ["sbuild", "1", "other"]
        # ... and gone for the next one, as in sbuild's unshare mode
        second = run(
            "cat /proc/sys/kernel/hostname; ls -A /dev/shm | wc -l; ipcs -m | grep -c '^0x'"
            " || true"
        )
        assert second[:3] == ["sbuild", "0", "0"]
    finally:
        session.close()


def test_a_dead_init_makes_the_next_command_fail_and_run_nothing(tmp_path, monkeypatch):
    import signal

    session = started_session(tmp_path, monkeypatch)
    try:
        argv = session.exec_argv()
        alive = subprocess.run([*argv, "echo", "ran"], capture_output=True, text=True)
        assert alive.stdout == "ran\n"  # the control
        os.kill(session.init_pid, signal.SIGKILL)
        session.proc.wait(timeout=30)
        for offline in ([], ["dpkg-buildpackage"]):
            dead = subprocess.run(
                [*argv, "sh", "-c", "echo ran", *offline], capture_output=True, text=True
            )
            assert dead.returncode != 0 and dead.stdout == ""
    finally:
        session.close()
    # closed: the descriptors are released, nothing of the session is held any more
    assert session.held == {}


def choose(arch, states, tarballs, build_arch="amd64"):
    return sfs.choose_source(
        "bookworm", arch, build_arch, states.get, tarballs.get, Path("/home/u/.cache/sbuild")
    )


def test_the_session_serves_the_sbuild_fast_chroot_of_the_host_arch():
    states = {
        "bookworm-amd64": {"mode": "unshare", "path": "/c/bookworm-amd64.tar"},
        "bookworm-arm64": {"mode": "unshare", "path": "/c/bookworm-arm64.tar"},
    }
    source = choose("amd64", states, {})
    assert (source.name, source.tarball) == ("bookworm-amd64", Path("/c/bookworm-amd64.tar"))
    assert source.state is states["bookworm-amd64"]
    # an sbuild-fast chroot of the host architecture %a wins (sbuild --arch sets both)
    assert choose("arm64", states, {}).name == "bookworm-arm64"


def test_a_cross_build_uses_the_build_arch_chroot_as_unshare_mode():
    states = {"bookworm-amd64": {"mode": "unshare", "path": "/c/bookworm-amd64.tar"}}
    tarballs = {"bookworm-arm64": Path("/c/bookworm-arm64.tar.zst")}
    # sbuild --host=arm64 on amd64: %a is arm64, unshare mode builds in bookworm-amd64
    source = choose("arm64", states, tarballs)
    assert source.name == "bookworm-amd64" and source.state is not None
    # a schroot chroot of sbuild-fast is no session's
    states["bookworm-arm64"] = {"mode": "schroot", "path": "/srv/x"}
    assert choose("arm64", states, {}).name == "bookworm-amd64"


def test_without_sbuild_fast_chroots_the_session_takes_unshare_modes_tarball():
    tarballs = {
        "bookworm-amd64": Path("/c/bookworm-amd64.tar.zst"),
        "bookworm-arm64": Path("/c/bookworm-arm64.tar"),
    }
    source = choose("amd64", {}, tarballs)
    assert (source.name, source.state) == ("bookworm-amd64", None)
    # cross: the build architecture's, as unshare mode finds it; else the host arch's
    assert choose("arm64", {}, tarballs).tarball == Path("/c/bookworm-amd64.tar.zst")
    del tarballs["bookworm-amd64"]
    assert choose("arm64", {}, tarballs).tarball == Path("/c/bookworm-arm64.tar")


def test_no_chroot_at_all_is_one_line_naming_what_was_looked_for():
    with pytest.raises(Error) as found:
        choose("arm64", {}, {})
    message = str(found.value)
    assert "\n" not in message
    assert message == (
        "no sbuild-fast chroot bookworm-arm64 or bookworm-amd64 and no bookworm-amd64.t* "
        "or bookworm-arm64.t* in /home/u/.cache/sbuild: run 'sbuild-fast create --dist bookworm'"
    )
    with pytest.raises(Error, match=r"^no sbuild-fast chroot bookworm-amd64 and no "):
        choose("amd64", {}, {})


def test_find_unshare_tarball_matches_as_chrootunshare(tmp_path):
    for name in ("bookworm-amd64.tar.zst", "bookworm-amd64-old.tar", "bookworm-amd64.t"):
        (tmp_path / name).write_text("")
    (tmp_path / "bookworm-arm64.tar").mkdir()  # a directory: not a tarball
    assert sbs.find_unshare_tarball(tmp_path, "bookworm-amd64") == (
        tmp_path / "bookworm-amd64.tar.zst"
    )
    assert sbs.find_unshare_tarball(tmp_path, "bookworm-arm64") is None
    assert sbs.find_unshare_tarball(tmp_path / "none", "bookworm-amd64") is None


def test_sbuild_unshare_view_reads_build_arch_and_bind_mounts(tmp_path, monkeypatch):
    if subprocess.run(["perl", "-MSbuild::Conf", "-e", "1"], capture_output=True).returncode:
        pytest.skip("sbuild is not installed")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    # sbuild checks that the directories exist
    (tmp_path / "a b").mkdir()
    (tmp_path / "c").mkdir()
    # sbuild 0.87.1 and later print "I: consider moving your ~/.sbuildrc" on standard
    # output while reading it; a line printed by the file itself stands in for it on 0.85
    (tmp_path / ".sbuildrc").write_text(
        'print "I: consider moving your ~/.sbuildrc\\n";\n'
        "$build_arch = 'i386';\n"
        f"$unshare_bind_mounts = [{{ directory => '{tmp_path}/a b', mountpoint => '/a' }},\n"
        f"                        {{ directory => '{tmp_path}/c', mountpoint => '/c' }}];\n1;\n"
    )
    assert sbs.sbuild_unshare_view() == (
        "i386",
        [(tmp_path / "a b", "/a"), (tmp_path / "c", "/c")],
    )


@pytest.mark.skipif(
    subprocess.run(["perl", "-MSbuild::Conf", "-e", "1"], capture_output=True).returncode != 0,
    reason="sbuild's Sbuild::Conf is not installed",
)
@pytest.mark.parametrize("backend", ["session", "unshare"])
@pytest.mark.parametrize(
    "argv, named",
    [
        ([], False),
        (["-d", "bookworm", "x.dsc"], False),
        (["--chroot-mode=unshare", "x.dsc"], False),
        (["-c", "/srv/stock.tar.zst", "x.dsc"], True),
        (["--chroot", "stock"], True),
        (["--chroot=/srv/stock.tar.zst", "--chroot-mode=unshare"], True),
        (["-c/srv/stock.tar.zst", "x.dsc"], True),
        (["--chroot-setup-commands=true", "x.dsc"], False),
    ],
)
def test_block_leaves_a_named_chroot_alone(tmp_path, backend, argv, named):
    """sbuild itself reads the block: a chroot named on the command line is built in as
    sbuild's unshare mode builds it, without the package cache (its apt does not take
    turns: two builds at once failed on apt's lock of the shared cache), and the user's
    own bind mounts stay; sbuild-fast's chroots get the session and the cache."""
    server = SERVER if backend == "session" else None
    for d in ("cache", "mine", "debs"):  # sbuild checks that bind-mounted directories exist
        (tmp_path / d).mkdir()
    block = sbs.config_block(
        "unshare", "0.85.0", "/dev/shm/tmp.sbuild.XXXXXXXXXX", f"{tmp_path}/cache", server
    )
    mine = (
        f"$unshare_bind_mounts = [{{ directory => '{tmp_path}/mine', mountpoint => '/mine' }},"
        f" {{ directory => '{tmp_path}/debs', mountpoint => '/var/cache/apt/archives' }}];\n"
    )
    (tmp_path / ".sbuildrc").write_text(mine + block)
    script = (
        'my $c = Sbuild::Conf::new(); print "\\0view\\0", $c->get(\'CHROOT_MODE\'), "\\0";'
        " print join(',', map { \"$_->{directory}:$_->{mountpoint}\" }"
        " @{$c->get('UNSHARE_BIND_MOUNTS')})"
    )
    mode, mounts = sbuild_conf(tmp_path, script, ["--", *argv]).split("\0view\0")[-1].split("\0")
    if named:
        assert mode == "unshare"
        assert mounts == f"{tmp_path}/mine:/mine,{tmp_path}/debs:/var/cache/apt/archives"
    else:
        assert mode == ("autopkgtest" if backend == "session" else "unshare")
        assert mounts == f"{tmp_path}/mine:/mine,{tmp_path}/cache:/var/cache/apt/archives"


def test_foreign_binds_leave_out_only_sbuild_fasts_cache(tmp_path):
    """A tarball of sbuild's own gets the user's bind mounts but not sbuild-fast's package
    cache; a cache of the user's own on the same mount point stays."""
    cache = tmp_path / "debs"
    binds = [
        (tmp_path / "mine", "/mine"),
        (cache, "/var/cache/apt/archives"),
        (tmp_path / "theirs", "/var/cache/apt/archives"),
        (cache, "/elsewhere"),
    ]
    assert sfs.foreign_binds(binds, cache) == [
        (tmp_path / "mine", "/mine"),
        (tmp_path / "theirs", "/var/cache/apt/archives"),
        (cache, "/elsewhere"),
    ]


def tree_paths():
    """init's own path helpers (the code the session runs), on trees of the test's."""
    env: dict = {}
    exec(sfs.TREE_PATHS, env)  # noqa: S102 - the module's own code, as init runs it
    return env


def test_init_writes_through_descriptors_never_through_a_tree_link(tmp_path):
    t = tree_paths()
    tree, host = tmp_path / "tree", tmp_path / "host"
    (tree / "etc").mkdir(parents=True)
    host.mkdir()
    (host / "hosts").write_text("the host's\n")
    (host / "null").write_text("the host's\n")
    os.chmod(host / "null", 0o644)
    # a damaged tarball: etc/hosts and dev/null are links to host paths
    (tree / "etc" / "hosts").symlink_to(host / "hosts")
    (tree / "etc" / "resolv.conf").symlink_to("../../host/hosts")
    (tree / "dev").mkdir()
    (tree / "dev" / "null").symlink_to(host / "null")
    t["tree_write"](str(tree), "etc/hosts", "127.0.0.1 localhost\n")
    t["tree_write"](str(tree), "etc/resolv.conf", "")
    os.close(t["tree_file"](str(tree), "dev/null", 0))
    t["tree_symlink"](str(tree), "dev/fd", "/proc/self/fd")
    # the host's files are as they were; the tree holds files of its own
    assert (host / "hosts").read_text() == "the host's\n"
    assert (host / "null").stat().st_mode & 0o777 == 0o644
    assert not (tree / "etc" / "hosts").is_symlink()
    assert (tree / "etc" / "hosts").read_text() == "127.0.0.1 localhost\n"
    assert (tree / "etc" / "resolv.conf").read_text() == ""
    assert (tree / "dev" / "null").lstat().st_mode & 0o7777 == 0
    assert os.readlink(tree / "dev" / "fd") == "/proc/self/fd"
    assert sorted(p.name for p in host.iterdir()) == ["hosts", "null"]


def test_init_resolves_tree_links_inside_the_tree(tmp_path):
    t = tree_paths()
    tree, host = tmp_path / "tree", tmp_path / "host"
    (tree / "usr" / "lib").mkdir(parents=True)
    (tree / "run").mkdir()
    host.mkdir()
    (tree / "lib").symlink_to("usr/lib")  # merged /usr
    (tree / "var").mkdir()
    (tree / "var" / "run").symlink_to("/run")  # absolute: the tree's /run
    (tree / "etc").symlink_to(host)  # absolute host path: the tree's own, made
    (tree / "escape").symlink_to("../../../../../../..")
    for rel, where in (
        ("lib/x", tree / "usr" / "lib" / "x"),
        ("var/run/lock", tree / "run" / "lock"),
        ("escape/mnt", tree / "mnt"),
    ):
        fd = t["tree_dir"](str(tree), rel)
        assert os.fstat(fd).st_ino == where.stat().st_ino
        os.close(fd)
    # a link to a host directory is the tree's path of that name, never the host's
    t["tree_write"](str(tree), "etc/hosts", "x\n")
    assert list(host.iterdir()) == []
    assert (tree / host.relative_to("/") / "hosts").read_text() == "x\n"
    # a file where a directory belongs refuses
    (tree / "dev").write_text("")
    with pytest.raises(OSError, match="damaged tree"):
        t["tree_dir"](str(tree), "dev/pts")
    loop = tree / "loop"
    loop.symlink_to("loop")
    with pytest.raises(OSError, match="too many links"):
        t["tree_dir"](str(tree), "loop/x")
