"""The documents stay true to the tree: every debadmin version and count README.md states,
the man pages rendered without warnings or leftover font escapes, the fleet block's
deb-src entry."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2]
README = (SRC / "README.md").read_text(encoding="utf-8")
CONTROL = (SRC / "debian/control").read_text(encoding="utf-8")
CHANGELOG = (SRC / "debian/changelog").read_text(encoding="utf-8")
MAN_PAGES = sorted(p.name for p in (SRC / "man").iterdir() if re.search(r"\.[1-8]$", p.name))
NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve".split()

# Every debadmin release the changelog records; the first is the tree's.
# A per-release build (make sbuild) adds an entry VERSION~debNNuN: the release is VERSION.
RELEASES = [
    re.sub(r"~deb\d+u\d+$", "", v) for v in re.findall(r"^debadmin \(([^)]+)\)", CHANGELOG, re.M)
]
VERSION = RELEASES[0]
# Programs whose versions README names beside debadmin's own.
OTHER_PROGRAMS = {"sbuild", "fwupd", "util-linux", "Python", "python3", "lintian", "mmdebstrap"}


def paragraphs(text):
    """README's paragraphs (blank-line separated); a table belongs to the paragraph before
    it, which says what it measured."""
    result = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith("|") and result:
            result[-1] += "\n" + block
        else:
            result.append(block)
    return result


def stanza(package):
    return re.search(rf"^Package: {re.escape(package)}\n(.*?)(?:\n\n|\Z)", CONTROL, re.M | re.S)[1]


def tool_packages():
    """The packages of the tools in bin/, each named after its tool (not the library, the
    metapackage or the Ansible collection)."""
    names = re.findall(r"^Package: (\S+)", CONTROL, re.M)
    return [n for n in names if (SRC / "bin" / n).is_file()]


def test_changelog_is_read():
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION) and len(RELEASES) >= 2


def test_every_version_readme_states_is_a_release():
    """A debadmin version in README is one the changelog records, said as 'debadmin X.Y.Z'
    (what a measurement was made with) or VERSION; another program's version names it."""
    for match in re.finditer(r"(\S+) (?:>= )?(\d+\.\d+\.\d+)(~deb\d+u\d+)?", README):
        word, version, suffix = match.groups()
        word = word.strip("`(")
        if word in OTHER_PROGRAMS:
            continue
        assert word == "debadmin", f"README: version {version} of no program: {match[0]!r}"
        assert version in RELEASES, f"README: debadmin {version} is not in debian/changelog"
        assert not suffix or version == VERSION, f"README: {match[0]!r} is not this release"
    # A release's own version written out would go stale: VERSION~debNNuN says it.
    for match in re.finditer(r"(\d+\.\d+\.\d+)~deb\d+u\d+", README):
        assert match[1] == VERSION, f"README: {match[0]} is not this release's version"


def test_every_measured_count_names_the_version_it_was_measured_with():
    """'N packages' figures change with the archive: each sits in a paragraph that names
    the debadmin release it was measured with."""
    counted = 0
    for para in paragraphs(README):
        if not re.search(r"\b\d+ packages\b", para):
            continue
        counted += 1
        measured = re.findall(r"debadmin (\d+\.\d+\.\d+)", para)
        assert measured, f"README: package counts with no 'debadmin X.Y.Z': {para[:200]!r}"
        assert set(measured) <= set(RELEASES), f"README: {measured} not in debian/changelog"
    assert counted >= 2


def test_tool_counts_match_debian_control():
    """'four admin tools' is what the metapackage depends on, 'five tool packages' what
    debian/control builds, in README, debadmin(7) and the metapackage's description."""
    depends = stanza("debadmin").split("\nSuggests:")[0]
    admin = [t for t in tool_packages() if re.search(rf"\b{re.escape(t)} \(", depends)]
    suggested = re.findall(r"^Suggests: (\S+)", stanza("debadmin"), re.M)
    assert suggested == ["sbuild-fast"] and "sbuild-fast" not in admin
    man7 = re.sub(r"\n\.[A-Z]+ ?", " ", (SRC / "man/debadmin.7").read_text()).replace("\\-", "-")
    found = 0
    for name, text in (("README.md", README), ("debadmin.7", man7), ("control", CONTROL)):
        for word, what in re.findall(r"\b(\w+) (admin tools|tool packages)\b", text):
            if word.lower() in NUMBERS:
                expected = len(admin) if what == "admin tools" else len(tool_packages())
                assert NUMBERS.index(word.lower()) == expected, f"{name}: '{word} {what}'"
                found += 1
    assert found >= 3
    assert re.search(
        r"installs\s+the\s+four\s+admin\s+tools\s+and\s+only\s+suggests\s+sbuild-fast", man7
    )


def test_fleet_block_publishes_sources():
    block = README.split("<!-- tests/integration/release/test-upgrade runs this block")[1]
    block = block.split("\n\n", 2)[1]
    assert "    Types: deb deb-src\n" in block
    assert "\n    apt-get source debadmin\n" in README


def man(*args, **kw):
    env = dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="80")
    env.pop("MAN_KEEP_FORMATTING", None)  # any value keeps the overstrikes: plain text here
    return subprocess.run(["man", *args], capture_output=True, env=env, check=False, **kw)


@pytest.mark.parametrize("page", MAN_PAGES)
def test_man_source_has_no_control_characters(page):
    """A '\\f' written through a language that turned it into a form feed leaves the font
    letter in the text: '(Bvirsh destroyR)'."""
    text = (SRC / "man" / page).read_text(encoding="utf-8")
    bad = [
        (n, line)
        for n, line in enumerate(text.split("\n"), 1)
        if re.search(r"[\x00-\x1f\x7f]", line)
    ]
    assert not bad, f"{page}: control characters on lines {bad[:3]}"


@pytest.mark.skipif(not shutil.which("man"), reason="man-db is not installed")
@pytest.mark.parametrize("page", MAN_PAGES)
def test_man_page_renders_clean(page):
    path = str(SRC / "man" / page)
    result = man("--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", path)
    assert result.returncode == 0 and result.stderr == b"", result.stderr.decode()
    result = man("-E", "UTF-8", "-l", path)
    assert result.returncode == 0 and result.stderr == b"", result.stderr.decode()
    text = result.stdout.decode("utf-8")
    assert len(text) > 500
    for pattern, what in (
        (r"[\x00-\x08\x0b-\x1f\x7f]", "a control character"),
        (r"\\f|\\\(|\\\*", "a leftover troff escape"),
        (r"\((?:B|I)[a-z][^()]{0,80}?[a-z](?:R|P)\)", "font letters of a broken \\fB...\\fR"),
    ):
        found = re.search(pattern, re.sub(r"[ \n]+", " ", text))
        assert (
            not found
        ), f"{page}: {what}: {found.string[max(0, found.start() - 40):found.end() + 20]!r}"
