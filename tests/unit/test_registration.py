"""Every tool in bin/ is registered everywhere HACKING.md's checklist says (issue 17).

A tool left out of the metapackage, debian/tests/control, the README or the Makefile still
builds and passes lintian; these tests are what fails.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from debadmin import errors, findings

SRC = Path(__file__).resolve().parents[2]
TOOLS = sorted(p.name for p in (SRC / "bin").iterdir())
SITE = "usr/lib/python3*/dist-packages/debadmin/"
SAME_VERSION = "(= ${binary:Version})"

# The Debian package of each third-party module a tool imports at top level.
PACKAGE_OF_MODULE = {
    "apt_pkg": "python3-apt",
    "apt": "python3-apt",
    "asn1crypto": "python3-asn1crypto",
    "cryptography": "python3-cryptography",
    "pefile": "python3-pefile",
    "pyudev": "python3-pyudev",
    "posix1e": "python3-pylibacl",
}


def deb822(path: Path):
    """Paragraphs of a deb822 file as dicts (comments dropped, continuations joined)."""
    paragraphs, current, key = [], {}, None
    for line in path.read_text().splitlines() + [""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                paragraphs.append(current)
            current, key = {}, None
        elif line[0] in " \t":
            current[key] += "\n" + line.strip()
        else:
            key, _, value = line.partition(":")
            current[key] = value.strip()
    return paragraphs


def relations(field: str):
    """'a (= v), b | c' -> ['a (= v)', 'b | c'], whitespace normalised."""
    return [re.sub(r"\s+", " ", r).strip() for r in field.split(",") if r.strip()]


CONTROL = deb822(SRC / "debian" / "control")
SOURCE, BINARIES = CONTROL[0], {p["Package"]: p for p in CONTROL[1:]}
TESTS = deb822(SRC / "debian" / "tests" / "control")


def package_of(tool):
    """The tool's package directory, lib/debadmin/MOD (MOD = TOOL with - turned into _)."""
    return SRC / "lib" / "debadmin" / tool.replace("-", "_")


def modules_of(tool):
    """The tool's modules, as paths."""
    return sorted(package_of(tool).glob("*.py"))


TOOL_PACKAGES = sorted(
    p.name for p in (SRC / "lib" / "debadmin").iterdir() if p.is_dir() and p.name != "__pycache__"
)


def lines(path: Path):
    return [line.strip() for line in path.read_text().splitlines()]


@pytest.mark.parametrize("tool", TOOLS)
def test_control_stanza(tool):
    assert tool in BINARIES, f"debian/control has no 'Package: {tool}' stanza"
    stanza = BINARIES[tool]
    assert stanza.get("Architecture") == "all"
    depends = relations(stanza.get("Depends", ""))
    for needed in (f"python3-debadmin {SAME_VERSION}", "${python3:Depends}", "${misc:Depends}"):
        assert needed in depends, f"{tool}: Depends lacks {needed}"
    assert stanza.get("Description", "").strip(), f"{tool}: no Description"


# Tools the metapackage only suggests: a server installing debadmin must not get a build
# toolchain (issue 22). Recommends would not do: apt installs them by default.
SUGGESTED_ONLY = {"sbuild-fast"}


@pytest.mark.parametrize("tool", TOOLS)
def test_metapackage_depends_and_lists_the_tool(tool):
    meta = BINARIES["debadmin"]
    field = "Suggests" if tool in SUGGESTED_ONLY else "Depends"
    assert f"{tool} {SAME_VERSION}" in relations(
        meta.get(field, "")
    ), f"the debadmin metapackage does not have {tool} {SAME_VERSION} in {field}"
    for other in ("Depends", "Recommends", "Suggests"):
        if other != field:
            assert tool not in {r.split()[0] for r in relations(meta.get(other, ""))}
    listed = f"\n* {tool} (suggested): " if tool in SUGGESTED_ONLY else f"\n* {tool}: "
    assert listed in meta["Description"], f"debadmin's description does not list {tool}"


def test_metapackage_brings_no_build_toolchain():
    # What the four tools and their library depend on: none of it is a compiler or sbuild.
    depends = set()
    for package in [r.split()[0] for r in relations(BINARIES["debadmin"]["Depends"])]:
        if package in BINARIES:
            depends |= {r.split()[0] for r in relations(BINARIES[package]["Depends"])}
    assert not depends & {"sbuild", "mmdebstrap", "build-essential", "dpkg-dev", "schroot"}


@pytest.mark.parametrize("tool", TOOLS)
def test_install_file(tool):
    path = SRC / "debian" / f"{tool}.install"
    assert path.is_file(), f"no debian/{tool}.install"
    installed = lines(path)
    assert f"bin/{tool} usr/bin/" in installed
    package = package_of(tool)
    assert (package / "__init__.py").is_file() and (package / "main.py").is_file()
    assert f"{SITE}{package.name}/" in installed, f"debian/{tool}.install does not ship {package}"
    assert (
        f"usr/share/bash-completion/completions/{tool}" in installed
    ), f"debian/{tool}.install does not ship the bash completion"


def test_every_package_directory_is_a_tool_shipped_by_exactly_one_package():
    # lib/debadmin holds the shared library (*.py, python3-debadmin) and one directory per
    # tool: a directory that is not a tool in bin/ is a layout nobody can find their way in.
    assert TOOL_PACKAGES == sorted(t.replace("-", "_") for t in TOOLS)
    shipped = {}
    for path in (SRC / "debian").glob("*.install"):
        for line in lines(path):
            if line.startswith(SITE):
                shipped.setdefault(line[len(SITE) :], []).append(path.stem)
    assert shipped.pop("*.py") == ["python3-debadmin"]
    for name in TOOL_PACKAGES:
        assert shipped.pop(f"{name}/", None) == [name.replace("_", "-")], f"{name}/ shipped by?"
    assert not shipped, f"unexpected install lines {shipped}"
    packages = (SRC / "setup.cfg").read_text().split("packages =")[1].split()
    assert packages == ["debadmin"] + [f"debadmin.{name}" for name in TOOL_PACKAGES]


def imports_of(path: Path):
    """debadmin modules a module imports anywhere (also inside functions), as dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("debadmin.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "debadmin" or node.module.startswith("debadmin."):
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def module_graph():
    lib = SRC / "lib"
    graph = {}
    for path in sorted((lib / "debadmin").rglob("*.py")):
        name = ".".join(path.relative_to(lib).with_suffix("").parts)
        graph[name.removesuffix(".__init__")] = imports_of(path)
    # 'from debadmin.x import f' names a function: the edge is to the module debadmin.x.
    return {
        name: {i if i in graph else i.rsplit(".", 1)[0] for i in imported} & set(graph)
        for name, imported in graph.items()
    }


def test_no_import_circle():
    graph = module_graph()
    state = {}

    def visit(name, trail):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", "import circle: " + " -> ".join(trail + [name])
        state[name] = "open"
        for other in sorted(graph[name]):
            visit(other, trail + [name])
        state[name] = "done"

    for name in graph:
        visit(name, [])


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_imports_only_its_own_package_and_the_library(tool):
    own = "debadmin." + package_of(tool).name
    shared = {f"debadmin.{p.stem}" for p in (SRC / "lib" / "debadmin").glob("*.py")}
    shared = {"debadmin" if s == "debadmin.__init__" else s for s in shared}
    for path in modules_of(tool):
        for imported in imports_of(path):
            assert (
                imported.startswith(own + ".")
                or imported.rsplit(".", 1)[0] in shared
                or imported in shared
            ), f"{path.relative_to(SRC)} imports {imported}"


# Binary packages that are no tool: the library, the metapackage, and the Ansible
# collection that drives the tools from a controller (issue 36).
NOT_TOOLS = {"python3-debadmin", "debadmin", "ansible-collection-debadmin"}


def test_no_binary_package_without_a_tool():
    # Every binary package is one of NOT_TOOLS or a tool in bin/.
    assert set(BINARIES) == {*NOT_TOOLS, *TOOLS}


def test_collection_package_is_no_tool_and_not_in_the_metapackage():
    collection = BINARIES["ansible-collection-debadmin"]
    assert collection["Architecture"] == "all"
    assert "ansible-core" in collection["Depends"]
    assert "ansible-collection-debadmin" not in BINARIES["debadmin"]["Depends"]
    assert "ansible-collection-debadmin" not in BINARIES["debadmin"].get("Suggests", "")
    install = lines(SRC / "debian" / "ansible-collection-debadmin.install")
    assert install == [
        "ansible/* usr/share/ansible/collections/ansible_collections/debadmin/tools/"
    ]
    assert any(
        stanza.get("Depends", "").startswith("ansible-collection-debadmin") for stanza in TESTS
    ), "no autopkgtest for the collection"


@pytest.mark.parametrize("tool", TOOLS)
def test_man_page_shipped(tool):
    assert (SRC / "man" / f"{tool}.8").is_file()
    path = SRC / "debian" / f"{tool}.manpages"
    assert path.is_file() and f"man/{tool}.8" in lines(path)


@pytest.mark.parametrize("tool", TOOLS)
def test_autopkgtest_stanza(tool):
    stanzas = [s for s in TESTS if tool in s.get("Tests", "").replace(",", " ").split()]
    assert stanzas, f"debian/tests/control has no stanza running the test {tool}"
    for stanza in stanzas:
        names = {
            r.split()[0] for rel in relations(stanza.get("Depends", "")) for r in rel.split("|")
        }
        assert tool in names, f"the {tool} autopkgtest does not depend on the {tool} package"
    script = SRC / "debian" / "tests" / tool
    assert script.is_file() and script.stat().st_mode & 0o111, f"debian/tests/{tool}"


def test_help_autopkgtest_covers_every_tool():
    help_stanza = [s for s in TESTS if s.get("Tests") == "help"]
    assert help_stanza
    depends = relations(help_stanza[0]["Depends"])
    assert "debadmin" in depends and set(SUGGESTED_ONLY) <= set(depends)
    # It runs every tool the metapackage depends on or suggests
    # (test_metapackage_depends_... above), and the suggested ones are installed for it.
    script = (SRC / "debian" / "tests" / "help").read_text()
    assert "dpkg-query -W -f '${Depends},${Suggests}' debadmin" in script


@pytest.mark.parametrize("tool", TOOLS)
def test_tests_exist(tool):
    assert (SRC / "tests" / "unit" / f"test_{tool.replace('-', '_')}.py").is_file()
    assert list(
        (SRC / "tests" / "integration" / tool).glob("test-*")
    ), f"no tests/integration/{tool}/test-*"


@pytest.mark.parametrize("tool", TOOLS)
def test_readme_section(tool):
    readme = (SRC / "README.md").read_text()
    assert f"\n## {tool}\n" in readme, f"README.md has no '## {tool}' section"
    assert f"| `{tool}` |" in readme, f"README.md's table of tools lacks {tool}"


@pytest.mark.parametrize("tool", TOOLS)
def test_makefile_test_depends(tool):
    makefile = (SRC / "Makefile").read_text()
    assert re.search(
        rf"^TEST_DEPENDS_{re.escape(tool)} :=", makefile, re.M
    ), f"the Makefile has no TEST_DEPENDS_{tool} line (empty if none are needed)"


@pytest.mark.parametrize("tool", TOOLS)
def test_hacking_lists_the_tool(tool):
    hacking = (SRC / "HACKING.md").read_text()
    tools_section = hacking.split("\n## The tools\n")[1].split("\n## ")[0]
    assert f"| `{tool}` |" in tools_section, f"HACKING.md's list of tools lacks {tool}"


@pytest.mark.parametrize("tool", TOOLS)
def test_overview_page_names_the_tool(tool):
    page = (SRC / "man" / "debadmin.7").read_text()
    ref = f".BR {tool.replace('-', chr(92) + '-')} (8)"
    tools_section = page.split("\n.SH TOOLS\n")[1].split("\n.SH ")[0]
    see_also = page.split("\n.SH SEE ALSO\n")[1]
    assert ref in tools_section and ref in see_also, f"debadmin(7) does not name {tool}"


@pytest.mark.parametrize("tool", TOOLS)
def test_imports_are_unconditional_build_dependencies(tool):
    # The build imports every tool module (build-aux/gen-bash-completion), also with the
    # nocheck profile: what a module imports at top level must be built without <!nocheck>.
    build_depends = {
        r.split()[0]: r for r in relations(SOURCE["Build-Depends"]) if not r.startswith("$")
    }
    depends = {r.split()[0] for r in relations(BINARIES[tool]["Depends"])}
    depends |= {r.split()[0] for r in relations(BINARIES["python3-debadmin"]["Depends"])}
    for module in modules_of(tool):
        tree = ast.parse(module.read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in (n.split(".")[0] for n in names):
                if name in sys.stdlib_module_names or name == "debadmin":
                    continue
                package = PACKAGE_OF_MODULE.get(name)
                assert package, f"{module} imports {name}: add its package to PACKAGE_OF_MODULE"
                assert (
                    package in depends
                ), f"{tool} imports {name} but does not depend on {package}"
                assert package in build_depends, f"{package} is not a build dependency"
                assert (
                    "<!nocheck>" not in build_depends[package]
                ), f"{module} imports {name} at build time: {package} must not be <!nocheck>"


def test_overview_page_shipped_and_matches_the_library():
    assert "man/debadmin.7" in lines(SRC / "debian" / "python3-debadmin.manpages")
    page = (SRC / "man" / "debadmin.7").read_text()
    exit_status = page.split("\n.SH EXIT STATUS\n")[1].split("\n.SH ")[0]
    codes = [int(c) for c in re.findall(r"^\.B (\d+)$", exit_status, re.M)]
    assert codes == [
        errors.EXIT_OK,
        errors.EXIT_ACTION,
        errors.EXIT_ERROR,
        errors.EXIT_NOT_APPLICABLE,
    ]
    contract = page.split("\n.SH JSON FINDINGS\n")[1].split("\n.SH ")[0]
    keys = re.findall(r"^\.TP\n\.B (\w+)$", contract, re.M)
    assert keys == list(findings.finding("c", "info", "m"))
    for severity in findings.SEVERITIES:
        assert f".B {severity}" in contract or f".BR {severity} " in contract


@pytest.mark.skipif(not Path("/usr/bin/man").exists(), reason="man-db is not installed")
def test_overview_page_renders_without_warnings():
    result = subprocess.run(
        [
            "man",
            "--warnings",
            "-E",
            "UTF-8",
            "-l",
            "-Tutf8",
            "-Z",
            str(SRC / "man" / "debadmin.7"),
        ],
        capture_output=True,
        env=dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="80"),
        check=False,
    )
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    lexgrog = subprocess.run(
        ["lexgrog", str(SRC / "man" / "debadmin.7")], capture_output=True, text=True, check=False
    )
    assert "debadmin - Debian admin helper tools" in lexgrog.stdout


def test_readme_quick_start_commands():
    # CI runs the first indented command of the Quick start verbatim in fresh roots.
    section = (SRC / "README.md").read_text().split("\n## Quick start\n")[1].split("\n## ")[0]
    commands = [line[4:] for line in section.splitlines() if line.startswith("    ")]
    assert commands[:2] == [
        "apt-get update && apt-get install -y make && make install",
        "make check",
    ]


def third_party_imports(path: Path):
    """Top-level imports of a module that are neither stdlib nor debadmin."""
    names, local = set(), set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == "debadmin":
                local |= {alias.name for alias in node.names}
            elif node.module.startswith("debadmin."):
                local.add(node.module.split(".")[1])
            found = [node.module]
        else:
            continue
        for name in (n.split(".")[0] for n in found):
            if name not in sys.stdlib_module_names and name != "debadmin":
                names.add(name)
    return names, local


LIB = SRC / "lib" / "debadmin"


@pytest.mark.parametrize("tool", TOOLS)
def test_library_modules_a_tool_uses_have_their_packages(tool):
    # python3-debadmin depends on nothing a single tool needs (issue 22: python3-apt only
    # where apt_pkg is imported): a tool using debadmin.debver depends on python3-apt itself.
    depends = {r.split()[0] for r in relations(BINARIES[tool]["Depends"])}
    depends |= {r.split()[0] for r in relations(BINARIES["python3-debadmin"]["Depends"])}
    used = set()
    for module in modules_of(tool):
        used |= third_party_imports(module)[1]
    for name in sorted(used & {p.stem for p in LIB.glob("*.py")}):
        for imported in third_party_imports(LIB / f"{name}.py")[0]:
            package = PACKAGE_OF_MODULE.get(imported)
            assert package, f"debadmin/{name}.py imports {imported}: add it to PACKAGE_OF_MODULE"
            assert package in depends, f"{tool} uses debadmin.{name} ({imported}): no {package}"


def test_library_package_depends_on_nothing_a_tool_alone_needs():
    own = {r.split()[0] for r in relations(BINARIES["python3-debadmin"]["Depends"])}
    assert own == {"${misc:Depends}", "${python3:Depends}"}


def test_library_imports_without_python3_apt():
    # Only debver needs apt_pkg; the rest of the library loads where python3-apt is absent.
    modules = sorted(p.stem for p in LIB.glob("*.py") if p.stem not in {"__init__", "debver"})
    code = "import sys; sys.modules['apt_pkg'] = sys.modules['apt'] = None\n" + "".join(
        f"import debadmin.{m}\n" for m in modules
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(SRC / "lib")),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
