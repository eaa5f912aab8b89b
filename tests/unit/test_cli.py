"""debadmin.cli.run's handling of a reader that goes away: `TOOL ... | head` ends quietly."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import debadmin
from debadmin import cli

SRC = Path(__file__).resolve().parents[2]
DATA = SRC / "tests" / "data" / "netboot-serialize"
TOOLS = sorted(p.name for p in (SRC / "bin").iterdir())


def netboot_tree(dest: Path) -> Path:
    """The real Debian 12 text tree's configuration files, symlinks as Debian ships them."""
    shutil.copytree(DATA / "text", dest, symlinks=True)
    for line in (DATA / "symlinks").read_text().splitlines():
        path, target = line.split()
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).symlink_to(target)
    return dest


def snapshot(top: Path) -> dict:
    return {
        str(p.relative_to(top)): (os.readlink(p) if p.is_symlink() else p.read_bytes())
        for p in sorted(top.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


def run_into_closed_pipe(unbuffered: bool, *argv: str) -> subprocess.CompletedProcess:
    """Run a tool with stdout a pipe whose reader has already gone (as after `| head`)."""
    env = dict(os.environ, PYTHONPATH=str(Path(debadmin.__file__).parents[1]))
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, *argv], stdout=write_end, stderr=subprocess.PIPE, text=True, env=env
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("tool", TOOLS)
def test_help_into_closed_pipe_is_quiet(tool, unbuffered):
    result = run_into_closed_pipe(unbuffered, str(SRC / "bin" / tool), "--help")
    assert result.stderr == ""
    if unbuffered and sys.version_info >= (3, 13):
        # trixie's argparse ignores an OSError writing its own messages: the write fails
        # inside parse_args, unseen, and --help exits 0 as usual.
        assert result.returncode == 0
    else:
        assert result.returncode == 2  # the output was cut short


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("mode", ["--dry-run", "--check", "--json"])
def test_netboot_report_into_closed_pipe_is_quiet(tmp_path, mode, unbuffered):
    # The report issue 11 saw: `netboot-serialize --dry-run ... | head` ended in
    # "Exception ignored ... BrokenPipeError" (exit 120) when the reader left early.
    tree = netboot_tree(tmp_path / "text")
    before = snapshot(tree)
    argv = ["--check", "--json"] if mode == "--json" else [mode]
    result = run_into_closed_pipe(
        unbuffered, str(SRC / "bin" / "netboot-serialize"), *argv, str(tree)
    )
    assert result.stderr == ""
    assert result.returncode == 2
    assert snapshot(tree) == before


def test_netboot_dry_run_into_open_pipe_still_works(tmp_path):
    # The flush moved into run() must not change a normal run's output or exit code.
    tree = netboot_tree(tmp_path / "text")
    env = dict(os.environ, PYTHONPATH=str(Path(debadmin.__file__).parents[1]))
    result = subprocess.run(
        [sys.executable, str(SRC / "bin" / "netboot-serialize"), "--dry-run", str(tree)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("installer: ")
    assert "console=ttyS0,115200n8" in result.stdout


@pytest.mark.parametrize("columns", ["120", "", "0", "-3", "wide"])
def test_terminal_width_reads_as_shutil_does(monkeypatch, columns):
    """The help formatter's width, read without importing shutil, is the width
    argparse's own formatter would take from shutil.get_terminal_size()."""
    monkeypatch.setenv("COLUMNS", columns)
    assert cli.terminal_width() == shutil.get_terminal_size().columns
