"""The command-line contract for every tool: --help, --version, man page, version."""

import argparse
import json
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import debadmin

SRC = Path(__file__).resolve().parents[2]
TOOLS = sorted(p.name for p in (SRC / "bin").iterdir())


def module_of(tool):
    return importlib.import_module("debadmin." + tool.replace("-", "_") + ".main")


def run_tool(tool, *args):
    env = dict(os.environ, PYTHONPATH=str(Path(debadmin.__file__).parents[1]))
    return subprocess.run(
        [sys.executable, str(SRC / "bin" / tool), *args], capture_output=True, text=True, env=env
    )


def long_options(parser):
    found = set()
    actions = list(parser._actions)
    while actions:
        action = actions.pop()
        found.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                actions.extend(subparser._actions)
    return found


def test_tools_exist():
    assert "journal-acl-setup" in TOOLS


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_and_version(tool, option):
    result = run_tool(tool, option)
    assert result.returncode == 0
    assert result.stderr == ""
    if option == "--version":
        assert result.stdout == f"{tool} {debadmin.__version__}\n"
    else:
        assert result.stdout.startswith("usage: " + tool)


@pytest.mark.parametrize("tool", TOOLS)
def test_entry_point_is_thin(tool):
    text = (SRC / "bin" / tool).read_text()
    assert text.startswith("#!/usr/bin/python3\n")
    assert f"from debadmin.{tool.replace('-', '_')}.main import main" in text
    assert "sys.exit(main())" in text


@pytest.mark.parametrize("tool", TOOLS)
def test_man_page_matches_parser(tool):
    page = (SRC / "man" / f"{tool}.8").read_text()
    assert page.startswith(f".TH {tool.upper().replace('-', chr(92) + '-')} 8 ")
    for section in (
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "EXIT STATUS",
        "FILES",
        "EXAMPLES",
        "SEE ALSO",
    ):
        assert f"\n.SH {section}\n" in page, section
    in_parser = long_options(module_of(tool).build_parser())
    in_page = {o.replace("\\-", "-") for o in re.findall(r"\\-\\-[a-z][a-z0-9\\-]*[a-z0-9]", page)}
    missing = in_parser - in_page
    assert not missing, f"options not in the man page: {missing}"
    # Every option documented under OPTIONS (the line after .TP) exists in the parser.
    options = page.split("\n.SH OPTIONS\n")[1].split("\n.SH ")[0]
    tags = re.findall(r"^\.TP\n(.*)$", options, re.M)
    documented = {
        o.replace("\\-", "-")
        for tag in tags
        for o in re.findall(r"\\-\\-[a-z][a-z0-9\\-]*[a-z0-9]", tag)
    }
    assert documented <= in_parser, f"documented but unknown: {documented - in_parser}"


@pytest.mark.skipif(not os.path.exists("/usr/bin/man"), reason="man-db is not installed")
@pytest.mark.parametrize("tool", TOOLS)
def test_man_page_renders_without_warnings(tool):
    result = subprocess.run(
        ["man", "--warnings", "-l", str(SRC / "man" / f"{tool}.8")],
        capture_output=True,
        text=True,
        env=dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="80", MAN_KEEP_FORMATTING="0"),
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("tool", TOOLS)
def test_usage_error_exits_2(tool):
    result = run_tool(tool, "--no-such-option")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_versions_agree():
    changelog = (SRC / "debian/changelog").read_text().splitlines()[0]
    # A per-release build (make sbuild) adds ~debNNuN: the tools print the release's version.
    version = re.match(r"debadmin \(([^)~]+)(~deb\d+u\d+)?\)", changelog).group(1)
    pyproject = re.search(r'^version = "([^"]+)"', (SRC / "pyproject.toml").read_text(), re.M)
    assert version == debadmin.__version__ == pyproject.group(1)


def json_commands(parser, path=()):
    """The command paths (subcommand names) whose parser takes --json."""
    found = []
    if any("--json" in action.option_strings for action in parser._actions):
        found.append(list(path))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                found += json_commands(subparser, (*path, name))
    return found


JSON_COMMANDS = [
    (tool, command) for tool in TOOLS for command in json_commands(module_of(tool).build_parser())
]


def test_every_tool_has_a_json_command():
    assert {tool for tool, _command in JSON_COMMANDS} == set(TOOLS)


def one_json_object(text: str) -> dict:
    document = json.loads(text)  # exactly one document: trailing data is an error
    assert isinstance(document, dict)
    return document


@pytest.mark.parametrize(
    "tool,command", JSON_COMMANDS, ids=[" ".join([t, *c]) for t, c in JSON_COMMANDS]
)
def test_a_usage_error_with_json_prints_one_object(tool, command):
    """A fleet's parser always gets an object: argparse's error too, with its message
    (which stderr still shows, with the usage)."""
    result = run_tool(tool, *command, "--json", "--no-such-option")
    assert result.returncode == 2
    document = one_json_object(result.stdout)
    assert set(document) == {"error", "exit_status"} and document["exit_status"] == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"{tool}: error: {document['error']}"


def test_an_abbreviated_json_is_json_too():
    """argparse takes --jso for --json: its usage error is one object as well."""
    result = run_tool("journal-acl-setup", "check", "--jso", "--no-such-option")
    assert result.returncode == 2
    assert set(one_json_object(result.stdout)) == {"error", "exit_status"}


@pytest.mark.parametrize(
    "argv,message",
    [
        (["journal-acl-setup", "check", "--root", "/nonexistent"], "/nonexistent/etc/group"),
        (["netboot-serialize", "/nonexistent"], "/nonexistent does not exist"),
        (["secureboot-ca-check", "--efivars", "/nonexistent"], "/nonexistent: no such directory"),
    ],
)
def test_an_error_with_json_prints_one_object(argv, message):
    """An Error the command raised: the same message in the object and on stderr."""
    result = run_tool(*argv, "--json")
    assert result.returncode == 2
    document = one_json_object(result.stdout)
    assert set(document) == {"error", "exit_status"} and document["exit_status"] == 2
    assert message in document["error"]
    assert result.stderr == f"{argv[0]}: error: {document['error']}\n"


def test_without_json_errors_print_nothing_on_stdout():
    result = run_tool("secureboot-ca-check", "--efivars", "/nonexistent")
    assert result.returncode == 2 and result.stdout == ""


def test_a_tool_that_printed_its_document_gets_no_second_one(tmp_path, capsys):
    """A run that ends in Error after its own document: still one object."""
    from debadmin import cli, output
    from debadmin.errors import Error

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")

    def command(args):
        output.emit_json({"report": 1})
        raise Error("late")

    assert cli.run("t", parser, ["--json"], command) == 2
    out, err = capsys.readouterr()
    assert one_json_object(out) == {"report": 1} and err == "t: error: late\n"
    # And a run that returns a code without printing one gets an object too.
    assert cli.run("t", parser, ["--json"], lambda args: 2) == 2
    assert one_json_object(capsys.readouterr().out)["exit_status"] == 2
