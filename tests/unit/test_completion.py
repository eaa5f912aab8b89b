"""Bash completion generated from build_parser(): run in bash, compared with the parser."""

import argparse
import importlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2]
TOOLS = sorted(p.name for p in (SRC / "bin").iterdir())


def load_generator():
    loader = importlib.machinery.SourceFileLoader(
        "gen_bash_completion", str(SRC / "build-aux" / "gen-bash-completion")
    )
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


GEN = load_generator()


def parser_of(tool):
    return importlib.import_module("debadmin." + tool.replace("-", "_") + ".main").build_parser()


@pytest.fixture(scope="module")
def completions(tmp_path_factory):
    """The files as debian/rules makes them: gen-bash-completion OUTDIR bin/*."""
    outdir = tmp_path_factory.mktemp("completions")
    assert GEN.main([str(outdir)] + [str(SRC / "bin" / tool) for tool in TOOLS]) == 0
    assert sorted(p.name for p in outdir.iterdir()) == TOOLS
    return outdir


def complete(completions, *words, cwd=None):
    """Source TOOL's completion in bash, set COMP_WORDS/COMP_CWORD, run its function.

    The cursor is at the end of the last word; the reply is returned as a set.
    """
    tool = words[0]
    script = r"""
        source "$1"
        shift
        spec=$(complete -p "$1")
        func=${spec#*-F }
        func=${func%% *}
        COMP_WORDS=("$@")
        COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
        COMPREPLY=(unset)
        "$func"
        printf '%s\n' "${COMPREPLY[@]}"
    """
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script, "bash", str(completions / tool), *words],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(os.environ, LC_ALL="C.UTF-8"),
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return set(result.stdout.split("\n")) - {""}


def levels(parser):
    """(subcommand or None, parser) for the top level and every subcommand."""
    yield None, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield name, subparser


def option_strings(parser):
    return {o for action in parser._actions for o in action.option_strings}


def subcommands(parser):
    return {name for name, _ in levels(parser) if name}


@pytest.mark.parametrize("tool", TOOLS)
def test_offers_every_subcommand_and_option_of_the_parser(completions, tool):
    parser = parser_of(tool)
    for name, level in levels(parser):
        words = [tool] + ([name] if name else [])
        options = option_strings(level)
        assert {o for o in options if o.startswith("--")}, (tool, name)
        assert complete(completions, *words, "-") == options, (tool, name)
        assert complete(completions, *words, "--") == {o for o in options if o[:2] == "--"}
    if subcommands(parser):
        assert complete(completions, tool, "") == subcommands(parser)


@pytest.mark.parametrize("tool", TOOLS)
def test_every_subcommand_is_completed_by_its_prefix(completions, tool):
    for name in subcommands(parser_of(tool)):
        assert name in complete(completions, tool, name[:2])


def test_subcommand_option_after_a_global_option(completions):
    assert complete(completions, "journal-acl-setup", "-v", "apply", "--dr") == {"--dry-run"}
    assert complete(completions, "ipv6-ra-forward", "watch", "--u") == {"--uplink"}


def test_choices_as_separate_word_and_after_equals(completions):
    # `sbuild-fast create --mode <TAB>`, `--mode=<TAB>` and `--mode=sch<TAB>`: bash splits
    # at '=' (COMP_WORDBREAKS), so '=' arrives as a word of its own.
    both = {"unshare", "schroot"}
    assert complete(completions, "sbuild-fast", "create", "--mode", "") == both
    assert complete(completions, "sbuild-fast", "remove", "--mode", "=") == both
    assert complete(completions, "sbuild-fast", "update", "--mode", "=", "sch") == {"schroot"}


def test_option_value_is_not_taken_for_an_option(completions):
    # After an option that takes a value nobody can guess, offer nothing, not the options.
    assert complete(completions, "sbuild-fast", "create", "--mirror", "") == set()
    assert complete(completions, "netboot-serialize", "--extra-args", "-") == set()


def test_directories_files_groups_and_interfaces(completions, tmp_path):
    (tmp_path / "journal-tree").mkdir()
    (tmp_path / "journal-file").write_text("")
    (tmp_path / "netboot.tar.gz").write_text("")
    dirs = complete(completions, "journal-acl-setup", "check", "--root", "jou", cwd=tmp_path)
    assert dirs == {"journal-tree"}
    files = complete(completions, "netboot-serialize", "--dry-run", "", cwd=tmp_path)
    assert files == {"journal-tree", "journal-file", "netboot.tar.gz"}
    assert "root" in complete(completions, "journal-acl-setup", "apply", "--group", "ro")
    # The host's interfaces; none where /sys is not mounted (a build chroot), and then
    # no stray glob either.
    nets = set(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else set()
    assert complete(completions, "ipv6-ra-forward", "status", "") == nets
    lo = {n for n in nets if n.startswith("l")}
    assert complete(completions, "ipv6-ra-forward", "enable", "--dry-run", "l") == lo


def test_value_kinds_by_metavar():
    # Every option value is completed by what its metavar says, or deliberately not at all.
    for tool in TOOLS:
        for _, level in levels(parser_of(tool)):
            for action in level._actions:
                if action.nargs == 0 or isinstance(action, argparse._SubParsersAction):
                    continue
                kind, choices = GEN.value_kind(action)
                if action.choices or (action.metavar or "").startswith("{"):
                    assert kind == "words" and choices, action
                elif action.metavar in GEN.KIND_BY_METAVAR:
                    assert kind == GEN.KIND_BY_METAVAR[action.metavar]


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is not installed")
def test_generated_files_are_shellcheck_clean(completions):
    result = subprocess.run(
        ["shellcheck", "-s", "bash", *sorted(str(p) for p in completions.iterdir())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout


def test_generator_usage_error(capsys):
    assert GEN.main([]) == 2
    assert "usage:" in capsys.readouterr().err


def test_sbuild_fast_offers_its_chroots(completions, tmp_path, monkeypatch):
    # sbuild-fast's records (DIST-ARCH.json) name the chroots 'update' and 'remove' take.
    records = tmp_path / "cache/sbuild/.sbuild-fast"
    records.mkdir(parents=True)
    for name in ("bookworm-amd64", "trixie-arm64", "bookworm-i386"):
        (records / f"{name}.json").write_text("{}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    system = {p.name.rsplit("-", 1)[0] for p in Path("/var/lib/sbuild-fast").glob("*.json")}
    got = complete(completions, "sbuild-fast", "remove", "")
    assert got - system == {"bookworm", "trixie"}
    assert complete(completions, "sbuild-fast", "update", "--dry-run", "tri") - system == {
        "trixie"
    }
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "none"))
    assert complete(completions, "sbuild-fast", "remove", "") == system


def test_fixed_values_the_tool_documents(completions):
    """Values a tool checks itself, offered from its own tables: netboot-serialize's
    --default entries and its --console DEVICE,BAUD (each offer the tool accepts)."""
    from debadmin.netboot_serialize import settings

    entries = set(settings.ENTRIES)
    assert complete(completions, "netboot-serialize", "--default", "") == entries
    assert complete(completions, "netboot-serialize", "--default", "=", "ex") == {"expert"}
    devices = complete(completions, "netboot-serialize", "--console", "")
    assert {"ttyS0,", "ttyS31,", "ttyAMA0,", "hvc7,", "ttyUSB9,"} <= devices
    assert "ttyS32," not in devices and len(devices) == 58
    assert complete(completions, "netboot-serialize", "-c", "ttyAMA") == {
        f"ttyAMA{n}," for n in range(4)
    }
    speeds = complete(completions, "netboot-serialize", "--console", "=", "ttyS1,1")
    assert {"ttyS1,115200n8", "ttyS1,115200", "ttyS1,19200n8", "ttyS1,1200"} <= speeds
    assert all(s.startswith("ttyS1,1") for s in speeds)
    for spec in {d + "115200n8" for d in devices} | complete(
        completions, "netboot-serialize", "-c", "hvc0,"
    ):
        settings.parse_console(spec)  # raises on a value the tool refuses
