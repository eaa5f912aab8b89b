"""sbuild-fast: sbuild chroots with debhelper and eatmydata preinstalled, kept fresh."""

import argparse
import contextlib
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from debadmin import __version__, cli, debver, fsutil, proc
from debadmin.errors import EXIT_ACTION, EXIT_OK, Error
from debadmin.output import emit_json

PROG = "sbuild-fast"
log = logging.getLogger("debadmin")

STATE_SUBDIR = ".sbuild-fast"  # under the sbuild cache dir: matches no sbuild chroot name
SCHROOT_BASE = Path("/srv/sbuild-fast")
SCHROOT_CONF_DIR = "etc/schroot/chroot.d"
SCHROOT_STATE_DIR = "var/lib/sbuild-fast"
EATMYDATA_DIR = "/usr/local/libexec/sbuild-fast"
EATMYDATA_APT_CONF = "/etc/apt/apt.conf.d/90sbuild-fast-eatmydata"
MARKER = "/etc/sbuild-fast"
BASE_INCLUDE = ("fakeroot", "debhelper")
CONFIG_BEGIN = "# BEGIN sbuild-fast"
CONFIG_END = "# END sbuild-fast"
MODES = ("unshare", "schroot")
MAX_AGE_DAYS = 7  # the weekly refresh keeps chroots younger than this
# Warn this long before sbuild >= 0.87 would re-create a tarball: the weekly timer's
# random delay (and a user session that is not running) can stretch the gap past a week.
AGE_MARGIN = 86400
ZSTD_STALL_LEVEL = 10
DIST_RE = re.compile(r"^[a-z0-9][a-z0-9.+]{0,39}$")
ARCH_RE = re.compile(r"^[a-z0-9]{1,20}$")
PKG_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}$")
URL_RE = re.compile(r"^(https?|file)://[A-Za-z0-9._~:/?#@!$&()*+,;=%\[\]-]+$")
SBUILD_NAME_RE = re.compile(r"^[^-]+-[^-]+(-[^-]+)?(-sbuild)?\.t.+$")

# Excluded from every dpkg unpack in the chroot (also for build-deps installed later);
# copyright files stay, as Debian policy wants them.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)

# Before debhelper pulls man-db in: otherwise man-db's postinst caches auto-update=true in
# /var/lib/man-db/auto-update and every build rebuilds the man database.
MANDB_HOOK = (
    'echo "man-db man-db/auto-update boolean false" ' '| chroot "$1" debconf-set-selections'
)
# apt runs dpkg through a symlink called dpkg that points to eatmydata (mk-sbuild's way),
# and apt-get/apt-cache themselves run under eatmydata through wrappers in /usr/local/bin,
# which comes first in sbuild's PATH: apt's own writes (lists, caches) skip fsync too.
APT_WRAPPERS = ("apt-get", "apt-cache")
APT_WRAPPER_DIR = "/usr/local/bin"
APT_WRAPPER_TAG = "# sbuild-fast: apt without fsync"
EATMYDATA_HOOK = (
    f'mkdir -p "$1{EATMYDATA_DIR}" && ln -sf /usr/bin/eatmydata "$1{EATMYDATA_DIR}/dpkg" && '
    f'printf \'Dir::Bin::dpkg "{EATMYDATA_DIR}/dpkg";\\n\' > "$1{EATMYDATA_APT_CONF}" && '
    f'mkdir -p "$1{APT_WRAPPER_DIR}" && for t in {" ".join(APT_WRAPPERS)}; do '
    f"printf '#!/bin/sh\\n{APT_WRAPPER_TAG}\\nexec /usr/bin/eatmydata /usr/bin/%s \"$@\"\\n' "
    f'"$t" > "$1{APT_WRAPPER_DIR}/$t" && chmod 755 "$1{APT_WRAPPER_DIR}/$t" || exit 1; done'
)
# Package lists and apt's binary caches stay (apt update then fetches only what changed
# and apt does not parse the lists again when sbuild adds its local archive); .debs go.
CLEANUP_HOOK = (
    'rm -f "$1/var/lib/man-db/auto-update" && '
    'find "$1/var/cache/apt/archives" -maxdepth 1 -name "*.deb" -delete && '
    f'echo "sbuild-fast {__version__}" > "$1{MARKER}"'
)


# --- names and inputs ------------------------------------------------------------------


def validate_dist(dist: str) -> str:
    if not DIST_RE.match(dist):
        raise Error(f"invalid distribution name: {dist!r}")
    return dist


def validate_arch(arch: str) -> str:
    if not ARCH_RE.match(arch):
        raise Error(f"invalid architecture: {arch!r}")
    return arch


def validate_mirror(url: str) -> str:
    if not URL_RE.match(url):
        raise Error(f"invalid mirror URL: {url!r}")
    return url.rstrip("/")


def parse_include(values: Optional[Sequence[str]]) -> List[str]:
    packages: List[str] = []
    for value in values or ():
        for name in value.split(","):
            name = name.strip()
            if not name:
                continue
            if not PKG_RE.match(name):
                raise Error(f"invalid package name: {name!r}")
            if name not in packages:
                packages.append(name)
    return packages


def host_codename(root: Path = Path("/")) -> str:
    for rel in ("etc/os-release", "usr/lib/os-release"):
        try:
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key == "VERSION_CODENAME" and value.strip("\"'"):
                return value.strip("\"'")
    raise Error("cannot tell the host's release from /etc/os-release: pass --dist")


def host_arch() -> str:
    return proc.run(["dpkg", "--print-architecture"]).stdout.strip()


DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Keyrings of the Debian archive (bookworm ships .gpg, trixie .pgp files).
DEBIAN_KEYRING_RE = re.compile(
    r"^/(usr/share/keyrings|etc/apt/trusted\.gpg\.d)/debian-archive-[A-Za-z0-9._-]+$"
)


def release_names(path: Path) -> set:
    """Suite and Codename of an apt lists Release or InRelease file (they come first)."""
    names = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            in_header = False
            for number, line in enumerate(handle):
                if number > 100 or len(names) == 2:
                    break
                if line.startswith("-----BEGIN PGP SIGNED MESSAGE"):
                    in_header = True  # Hash: lines up to the first blank line
                elif in_header:
                    in_header = bool(line.strip())
                else:
                    key, _, value = line.partition(":")
                    if key in ("Suite", "Codename") and value.strip():
                        names.add(value.strip())
    except OSError:
        pass
    return names


def suite_aliases(dist: str, root: Path = Path("/")) -> set:
    """dist and the other name of the same suite (codename or suite name, as in
    'bookworm' and 'stable'), from the Release files apt downloaded."""
    names = {dist}
    with contextlib.suppress(OSError):
        for path in sorted((root / "var/lib/apt/lists").glob("*Release")):
            pair = release_names(path)
            if dist in pair:
                names |= pair
    return names


def _debian_source(
    uri: str, suites: Sequence[str], components: Sequence[str], signed_by: str, names: set
) -> bool:
    """Whether a deb source is the Debian archive for one of names (or its -updates): not
    security, backports or a third-party repository that serves the same suite name."""
    if not URL_RE.match(uri) or "main" not in components:
        return False
    if signed_by and not all(
        DEBIAN_KEYRING_RE.match(k) for k in signed_by.replace(",", " ").split()
    ):
        return False
    return any(s.rstrip("/") in names or s in {f"{n}-updates" for n in names} for s in suites)


def _deb822_sources(text: str) -> Iterator[Tuple[str, List[str], List[str], str]]:
    for stanza in re.split(r"\n\s*\n", text):
        fields: Dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace():
                if key:  # a continuation line (an inline Signed-By key block)
                    fields[key] += "\n" + line.strip()
                continue
            if ":" not in line:
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield (
                uri,
                fields.get("suites", "").split(),
                fields.get("components", "").split(),
                fields.get("signed-by", ""),
            )


def _one_line_sources(text: str) -> Iterator[Tuple[str, List[str], List[str], str]]:
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        options = " ".join(re.findall(r"\[([^]]*)\]", line))
        words = re.sub(r"\[[^]]*\]", " ", line).split()
        if len(words) < 3 or words[0] != "deb":
            continue
        signed_by = ""
        for option in options.split():
            key, _, value = option.partition("=")
            if key == "signed-by":
                signed_by = value
        yield words[1], [words[2]], words[3:], signed_by


def host_mirror(dist: Optional[str] = None, root: Path = Path("/")) -> str:
    """The Debian archive the host's apt uses for dist (default: the host's release):
    the first deb source, in apt's order, whose suite is dist or dist-updates (or the
    same suite under its other name), with component main and no keyring but Debian's;
    else deb.debian.org."""
    if dist is None:
        try:
            dist = host_codename(root)
        except Error:
            return DEFAULT_MIRROR
    names = suite_aliases(dist, root)
    sources_dir = root / "etc/apt/sources.list.d"
    paths = [root / "etc/apt/sources.list"]
    with contextlib.suppress(OSError):
        paths += sorted(p for p in sources_dir.iterdir() if p.name.endswith((".list", ".sources")))
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        parse = _deb822_sources if path.name.endswith(".sources") else _one_line_sources
        for uri, suites, components, signed_by in parse(text):
            if _debian_source(uri, suites, components, signed_by, names):
                return uri.rstrip("/")
    return DEFAULT_MIRROR


def chroot_name(dist: str, arch: str) -> str:
    return f"{dist}-{arch}"


# --- where things live ------------------------------------------------------------------


def user_cache_dir(env: Optional[Dict[str, str]] = None) -> Path:
    """Where sbuild looks for unshare tarballs: $XDG_CACHE_HOME/sbuild, else ~/.cache/sbuild."""
    env = dict(os.environ) if env is None else env
    if env.get("XDG_CACHE_HOME"):
        # Absolute, as sbuild (run from the same directory) would see it: mmdebstrap runs in /.
        return Path(env["XDG_CACHE_HOME"]).absolute() / "sbuild"
    home = env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    return Path(home).absolute() / ".cache/sbuild"


def sbuildrc_path(env: Optional[Dict[str, str]] = None, sbuild_ver: Optional[str] = None) -> Path:
    """The user's sbuild configuration file that sbuild really reads: from sbuild 0.87.1
    on, $XDG_CONFIG_HOME/sbuild/config.pl when it exists, and ~/.sbuildrc is then ignored;
    otherwise ~/.sbuildrc."""
    env = dict(os.environ) if env is None else env
    home = env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    if sbuild_ver and debver.at_least(sbuild_ver, "0.87.1"):
        config_home = Path(env.get("XDG_CONFIG_HOME") or Path(home) / ".config")
        config_pl = config_home / "sbuild/config.pl"
        if os.access(config_pl, os.R_OK):
            return config_pl
    return Path(home) / ".sbuildrc"


def matching_files(cache_dir: Path, name: str) -> List[str]:
    """Entries of cache_dir that sbuild would take for the chroot called name."""
    pattern = re.compile("^" + re.escape(name) + r"\.t.+$")
    try:
        entries = sorted(os.listdir(cache_dir))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise Error(f"cannot read {cache_dir}: {exc.strerror}") from None
    return [e for e in entries if pattern.match(e)]


def shadowing_names(dist: str, arch: str) -> List[str]:
    """Chroot names sbuild tries before DIST-ARCH for 'sbuild -d DIST' (native builds)."""
    return [f"{dist}-{arch}-sbuild", f"{dist}-sbuild"]


# --- mmdebstrap --------------------------------------------------------------------------


def _common_options(recipe: Dict) -> List[str]:
    options = [
        '--aptopt=APT::Install-Recommends "false"',
        '--aptopt=Acquire::Languages "none"',
    ]
    if not recipe["keep_docs"]:
        options += [f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES]
    return options


def _packages(recipe: Dict) -> List[str]:
    include = list(BASE_INCLUDE)
    if recipe["eatmydata"]:
        include.append("eatmydata")
    return include + [p for p in recipe["include"] if p not in include]


def _tail(recipe: Dict, output: str) -> List[str]:
    argv = [f"--customize-hook={EATMYDATA_HOOK}"] if recipe["eatmydata"] else []
    argv.append(f"--customize-hook={CLEANUP_HOOK}")
    argv += ["--skip=cleanup/apt/lists", "--skip=cleanup/apt/cache"]
    if log.getEffectiveLevel() > logging.DEBUG and not _stderr_is_tty():
        argv.append("--quiet")
    return argv + [recipe["dist"], output, recipe["mirror"]]


def mmdebstrap_argv(recipe: Dict, output: str, mode: str) -> List[str]:
    """The mmdebstrap command for a recipe (dist, arch, mirror, include, keep_docs, eatmydata)."""
    argv = [
        "mmdebstrap",
        f"--mode={mode}",
        "--variant=buildd",
        f"--arch={recipe['arch']}",
        f"--include={','.join(_packages(recipe))}",
        *_common_options(recipe),
        f"--essential-hook={MANDB_HOOK}",
    ]
    return argv + _tail(recipe, output)


# What a refresh must not take from the old chroot: device nodes (mmdebstrap makes its
# own, and an unprivileged user cannot) and sources.list (mmdebstrap writes it for the
# mirror of this run, so 'update --mirror' takes effect).
REFRESH_EXCLUDES = ("--exclude=./dev/*", "--exclude=./etc/apt/sources.list")
APT_NONINTERACTIVE = (
    'chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get -y -q '
    "-o Dpkg::Options::=--force-confold"
)


def mmdebstrap_refresh_argv(recipe: Dict, source: str, output: str, mode: str) -> List[str]:
    """mmdebstrap starting from the chroot at source (a tarball in unshare mode, a
    directory in schroot mode): apt update, dist-upgrade, the recipe's packages installed
    again (idempotent), autoremove, the eatmydata and man-db wiring re-applied."""
    quoted = shlex.quote(source)
    excludes = " ".join(REFRESH_EXCLUDES)
    if mode == "unshare":
        copy = f'tar -C "$1" {excludes} -xf {quoted}'
    else:
        copy = f'tar -C {quoted} {excludes} -cf - . | tar -C "$1" -xf -'
    argv = [
        "mmdebstrap",
        f"--mode={mode}",
        "--variant=custom",
        f"--arch={recipe['arch']}",
        *_common_options(recipe),
        "--skip=update,download",
        f"--setup-hook={copy}",
        '--customize-hook=chroot "$1" apt-get -q update',
        f"--customize-hook={APT_NONINTERACTIVE} dist-upgrade",
        f"--customize-hook={APT_NONINTERACTIVE} install {' '.join(_packages(recipe))}",
        f"--customize-hook={APT_NONINTERACTIVE} --purge autoremove",
    ]
    return argv + _tail(recipe, output)


def _stderr_is_tty() -> bool:
    try:
        return os.isatty(2)
    except OSError:
        return False


_TERMINATING = False


def _on_sigterm(signum, frame):  # noqa: ARG001 - signal handler signature
    global _TERMINATING
    if not _TERMINATING:
        _TERMINATING = True
        raise KeyboardInterrupt


def run_mmdebstrap(argv: List[str]) -> None:
    """Run mmdebstrap in /; an interrupt (SIGINT/SIGTERM) stops it and waits for its cleanup.

    Not in the caller's directory: mmdebstrap's hooks run as the namespace's root, who
    cannot enter a home directory of mode 0700 (trixie's useradd default), and find(1)
    fails when it cannot return to its starting directory."""
    log.info("running: %s", " ".join(argv))
    env = dict(os.environ, LC_ALL="C.UTF-8")
    try:
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, cwd="/")
    except FileNotFoundError:
        raise Error("mmdebstrap: command not found") from None
    try:
        rc = child.wait()
    except KeyboardInterrupt:
        # mmdebstrap removes its own temporary tree when terminated.
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise
    if rc != 0:
        raise Error(f"mmdebstrap failed with exit status {rc}")


@contextlib.contextmanager
def scratch_dir(parent: Path) -> Iterator[Path]:
    """A temporary directory under parent, removed on the way out whatever happens."""
    path = Path(tempfile.mkdtemp(prefix="tmp.", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_scratch(parent: Path) -> None:
    """Scratch dirs left by a killed run (the caller holds the lock, so nobody uses them)."""
    try:
        entries = list(parent.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith("tmp.") and entry.is_dir() and not entry.is_symlink():
            log.info("removing %s, left by an interrupted run", entry)
            shutil.rmtree(entry, ignore_errors=True)


# --- state (what sbuild-fast made) -------------------------------------------------------


# The fields of a record and their types: a record is input like any other, and one
# that does not fit is skipped with a warning rather than trusted.
STATE_FIELDS = {
    "name": str,
    "dist": str,
    "arch": str,
    "mode": str,
    "path": str,
    "created": int,
    "mirror": str,
    "include": list,
    "keep_docs": bool,
    "eatmydata": bool,
    "version": str,
}
STATE_REQUIRED = ("name", "dist", "arch", "mode", "path")


def state_problem(state: object) -> Optional[str]:
    """Why a parsed record cannot be used, or None."""
    if not isinstance(state, dict):
        return "not a JSON object"
    for key in STATE_REQUIRED:
        if key not in state:
            return f"no {key!r}"
    for key, kind in STATE_FIELDS.items():
        value = state.get(key)
        if key in STATE_REQUIRED or value is not None:
            # bool is an int in Python: "created": true is as wrong as "yesterday"
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                return f"{key!r} is not {'a' if kind is not int else 'an'} {kind.__name__}"
    if not DIST_RE.match(state["dist"]) or not ARCH_RE.match(state["arch"]):
        return "invalid dist or arch"
    if state["mode"] not in MODES:
        return f"unknown mode {state['mode']!r}"
    if state["name"] != chroot_name(state["dist"], state["arch"]):
        return f"name {state['name']!r} does not match dist and arch"
    if not all(isinstance(p, str) for p in state.get("include") or []):
        return "'include' is not a list of package names"
    return None


def load_state(path: Path) -> Optional[Dict]:
    """The record in path, or None (with a one-line warning) when it is unreadable or
    malformed."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("ignoring unreadable state file %s", path)
        return None
    problem = state_problem(state)
    if not problem and path.name != f"{state['name']}.json":
        problem = f"its name is {state['name']!r}"  # remove and update look for NAME.json
    if problem:
        log.warning("ignoring malformed state file %s: %s", path, problem)
        return None
    return state


def read_states(state_dir: Path) -> List[Dict]:
    try:
        paths = sorted(state_dir.glob("*.json"))
    except OSError:
        return []
    return [state for state in map(load_state, paths) if state is not None]


def write_state(state_dir: Path, state: Dict) -> None:
    data = json.dumps(state, indent=2, sort_keys=True) + "\n"
    fsutil.atomic_write(state_dir / f"{state['name']}.json", data)


def recipe_from(args: argparse.Namespace, root: Path = Path("/")) -> Dict:
    dist = validate_dist(args.dist or host_codename(root))
    arch = validate_arch(args.arch or host_arch())
    mirror = validate_mirror(args.mirror or host_mirror(dist, root))
    return {
        "name": chroot_name(dist, arch),
        "dist": dist,
        "arch": arch,
        "mirror": mirror,
        "include": parse_include(args.include),
        "keep_docs": bool(args.keep_docs),
        "eatmydata": not args.no_eatmydata,
        "mode": args.mode,
    }


# --- sbuild configuration ---------------------------------------------------------------


def sbuild_version() -> Optional[str]:
    result = proc.run(["dpkg-query", "-W", "-f", "${Version}", "sbuild"], check=False)
    return result.stdout.strip() or None


def tmpfs_unpack_template(root: Path = Path("/")) -> Optional[str]:
    """A tmpfs directory for sbuild's per-build unpack, when the host has one."""
    for candidate in ("dev/shm", "tmp"):
        fstype, _ = fs_of(root / candidate)
        if fstype == "tmpfs":
            return f"/{candidate}/tmp.sbuild.XXXXXXXXXX"
    return None


def config_block(mode: str, sbuild_ver: Optional[str], tmp_template: Optional[str]) -> str:
    """The sbuild settings the speed needs, as a marked block for ~/.sbuildrc."""
    lines = [
        f"{CONFIG_BEGIN} (written by 'sbuild-fast create --configure'; edits inside are lost)",
        f"$chroot_mode = '{mode}';",
    ]
    if mode == "unshare":
        if tmp_template:
            lines += [
                "# Unpack each build's chroot on tmpfs: under a second instead of seconds.",
                f"$unshare_tmpdir_template = '{tmp_template}';",
            ]
        if sbuild_ver and debver.at_least(sbuild_ver, "0.87"):
            lines += [
                "# Never silently replace the sbuild-fast tarball with a plain one;",
                "# sbuild-fast-update.timer keeps it fresh instead.",
                "$unshare_mmdebstrap_auto_create = 0;",
            ]
    lines += [
        "# The chroot is thrown away after each build: purging build-deps is wasted time.",
        "$purge_build_deps = 'never';",
        "# Package lists ship in the chroot, so apt update only fetches what changed; the",
        "# weekly refresh (sbuild-fast-update.timer) keeps packages current: no upgrade",
        "# at every build.",
        "$apt_update = 1;",
        "$apt_distupgrade = 0;",
        "$apt_upgrade = 0;",
        "1;",
        CONFIG_END,
    ]
    return "\n".join(lines) + "\n"


def merge_config(text: str, block: str) -> str:
    """text with its sbuild-fast block replaced by block (appended when there is none)."""
    pattern = re.compile(
        "^" + re.escape(CONFIG_BEGIN) + r".*?^" + re.escape(CONFIG_END) + r"[^\n]*\n?", re.M | re.S
    )
    if pattern.search(text):
        return pattern.sub(lambda _m: block, text, count=1)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + block


SBUILD_CONFIG_KEYS = (
    "CHROOT_MODE",
    "UNSHARE_TMPDIR_TEMPLATE",
    "APT_UPDATE",
    "APT_DISTUPGRADE",
    "APT_UPGRADE",
    "PURGE_BUILD_DEPS",
    "RUN_LINTIAN",
    "BUILD_DIR",
)
# sbuild 0.87 and later only: asking an older sbuild for them is pointless.
SBUILD_AUTO_CREATE_KEYS = (
    "UNSHARE_MMDEBSTRAP_AUTO_CREATE",
    "UNSHARE_MMDEBSTRAP_MAX_AGE",
    "UNSHARE_MMDEBSTRAP_KEEP_TARBALL",
)


def sbuild_config_keys(sbuild_ver: Optional[str]) -> Tuple[str, ...]:
    if sbuild_ver and debver.at_least(sbuild_ver, "0.87"):
        return SBUILD_CONFIG_KEYS + SBUILD_AUTO_CREATE_KEYS
    return SBUILD_CONFIG_KEYS


def effective_sbuild_config(sbuild_ver: Optional[str] = None) -> Dict[str, str]:
    """sbuild's own view of its configuration (system file plus ~/.sbuildrc)."""
    script = (
        "my $c = Sbuild::Conf::new(); for my $k (@ARGV) { my $v = eval { $c->get($k) };"
        " $v = '' unless defined $v; print \"$k=$v\\n\" }"
    )
    keys = sbuild_config_keys(sbuild_ver)
    result = proc.run(["perl", "-MSbuild::Conf", "-e", script, *keys], check=False)
    if result.returncode != 0:
        lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
        raise Error(
            "sbuild cannot read its configuration: " + " ".join(lines[-2:] or ["perl failed"])
        )
    config = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        config[key.lower()] = value
    return config


def auto_create_max_age(config: Dict[str, str], sbuild_ver: Optional[str]) -> Optional[int]:
    """The age in seconds at which sbuild re-creates an unshare tarball behind the user's
    back (sbuild >= 0.87 with $unshare_mmdebstrap_auto_create on and a max_age that is not
    negative), or None when it never does."""
    if not sbuild_ver or not debver.at_least(sbuild_ver, "0.87"):
        return None
    if "unshare_mmdebstrap_auto_create" not in config:  # sbuild could not tell
        return None
    auto_create = config["unshare_mmdebstrap_auto_create"].strip()
    if auto_create in ("", "0"):  # Perl's false ('' is also what an undef prints)
        return None
    try:
        max_age = int(float(config.get("unshare_mmdebstrap_max_age", "604800") or 604800))
    except ValueError:
        max_age = 604800
    return max_age if max_age >= 0 else None


# --- create / update ---------------------------------------------------------------------


def conflicting_files(cache_dir: Path, name: str, ours: str) -> List[str]:
    return [f for f in matching_files(cache_dir, name) if f != ours]


def chroot_argv(recipe: Dict, source: Optional[Path], output: str, mode: str) -> List[str]:
    if source is None:
        return mmdebstrap_argv(recipe, output, mode)
    return mmdebstrap_refresh_argv(recipe, str(source), output, mode)


def create_unshare(
    recipe: Dict,
    cache_dir: Path,
    dry_run: bool,
    refresh: bool = False,
    from_record: bool = False,
    mirror: Optional[str] = None,
) -> Dict:
    """Build the tarball (refresh: from the current one with apt update + dist-upgrade,
    when there is one) and rename it into place under the lock. from_record: the recipe
    is read again from the record under the lock (mirror overriding its mirror)."""
    name = recipe["name"]
    target = cache_dir / f"{name}.tar"
    state_dir = cache_dir / STATE_SUBDIR
    others = conflicting_files(cache_dir, name, target.name)
    if others:
        raise Error(
            f"{cache_dir / others[0]} would compete with {target.name} in sbuild's "
            "lookup: remove it first"
        )
    for shadow in shadowing_names(recipe["dist"], recipe["arch"]):
        for found in matching_files(cache_dir, shadow):
            log.warning(
                "%s is found before %s by 'sbuild -d %s'",
                cache_dir / found,
                target.name,
                recipe["dist"],
            )
    source = target if refresh and target.is_file() else None
    argv = chroot_argv(recipe, source, str(state_dir / "tmp.XXXXXXXXXX" / target.name), "unshare")
    if dry_run:
        return {"name": name, "path": str(target), "changed": False, "command": argv}
    for directory in (cache_dir, state_dir):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Error(f"cannot create {directory}: {exc.strerror}") from None
    with fsutil.locked(state_dir / "lock"):
        if from_record:
            recipe = reread_recipe(state_dir, recipe, mirror)
            if recipe is None:
                return {"name": name, "path": str(target), "changed": False, "removed": True}
        remove_stale_scratch(state_dir)
        with scratch_dir(state_dir) as scratch:
            output = scratch / target.name
            source = target if refresh and target.is_file() else None
            if refresh and source is None:
                log.info("%s is missing: creating it from the archive", target)
            argv = chroot_argv(recipe, source, str(output), "unshare")
            run_mmdebstrap(argv)
            if not output.is_file() or output.stat().st_size == 0:
                raise Error("mmdebstrap wrote no tarball")
            os.chmod(output, 0o644)
            fsutil.fsync_path(output)
            # rename(2): a build streaming the old tarball keeps reading the old inode.
            os.replace(output, target)
            fsutil.fsync_dir(cache_dir)
        state = dict(recipe, path=str(target), created=int(time.time()), version=__version__)
        write_state(state_dir, state)
    return {"name": name, "path": str(target), "changed": True, "command": argv}


def schroot_conf(recipe: Dict, directory: Path, aliases: Sequence[str]) -> str:
    lines = [
        f"# Written by sbuild-fast; 'sbuild-fast remove --mode schroot {recipe['dist']}'"
        " removes it.",
        f"[{recipe['name']}-sbuild-fast]",
        f"description=Debian {recipe['dist']}/{recipe['arch']} by sbuild-fast",
        "type=directory",
        f"directory={directory}",
        "union-type=overlay",
        "groups=root,sbuild",
        "root-groups=root,sbuild",
        "profile=sbuild",
    ]
    if aliases:
        lines.append("aliases=" + ",".join(aliases))
    if recipe["eatmydata"]:
        lines.append("command-prefix=eatmydata")
    return "\n".join(lines) + "\n"


def schroot_names(root: Path = Path("/"), skip: Optional[Path] = None) -> Dict[str, str]:
    """Every schroot chroot name and alias, mapped to the chroot it names (files in
    chroot.d in schroot's order, skip left out)."""
    names: Dict[str, str] = {}
    conf_dir = root / SCHROOT_CONF_DIR
    files = [root / "etc/schroot/schroot.conf"]
    with contextlib.suppress(OSError):
        # schroot reads only names run-parts would run (no .dpkg-old, no backup~)
        files += sorted(p for p in conf_dir.iterdir() if re.match(r"^[A-Za-z0-9_-]+$", p.name))
    for path in files:
        if path == skip:
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        section = None
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                names.setdefault(section, section)
            elif line.startswith("aliases=") and section:
                for alias in line[8:].split(","):
                    if alias.strip():
                        names.setdefault(alias.strip(), section)
    return names


def schroot_lookup(dist: str, arch: str, names: Dict[str, str]) -> Optional[Tuple[str, str]]:
    """(name, chroot) that 'sbuild -d DIST' takes in schroot mode for a native build:
    Sbuild::ChrootInfo::find tries DIST-ARCH-sbuild, DIST-sbuild, DIST-ARCH, DIST."""
    for candidate in (f"{dist}-{arch}-sbuild", f"{dist}-sbuild", f"{dist}-{arch}", dist):
        if candidate in names:
            return candidate, names[candidate]
    return None


def schroot_shadow_message(recipe: Dict, winner: Optional[Tuple[str, str]]) -> Optional[str]:
    """What to tell when 'sbuild -d DIST' would not build in sbuild-fast's schroot chroot."""
    ours = f"{recipe['name']}-sbuild-fast"
    if winner is not None and winner[1] == ours:
        return None
    taken = f"schroot chroot {winner[1]} (as {winner[0]})" if winner else "no schroot chroot"
    return (
        f"'sbuild -d {recipe['dist']}' uses {taken}, not {ours}: build with "
        f"'sbuild -c {ours}', or remove that chroot and run 'sbuild-fast create --mode "
        f"schroot --dist {recipe['dist']}' again"
    )


def current_generation(link: Path) -> Optional[Path]:
    """The directory the schroot symlink points at, if it is there."""
    try:
        real = link.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return real if real.is_dir() else None


def create_schroot(
    recipe: Dict,
    dry_run: bool,
    root: Path = Path("/"),
    refresh: bool = False,
    from_record: bool = False,
    mirror: Optional[str] = None,
) -> Dict:
    if os.geteuid() != 0 and not dry_run:
        raise Error("--mode schroot needs root")
    name = recipe["name"]
    base = root / SCHROOT_BASE.relative_to("/")
    link = base / name
    conf = root / SCHROOT_CONF_DIR / f"sbuild-fast-{name}"
    state_dir = root / SCHROOT_STATE_DIR
    in_use = schroot_names(root, skip=conf)
    aliases = [a for a in (f"{name}-sbuild", f"{recipe['dist']}-sbuild") if a not in in_use]
    mine = {a: f"{name}-sbuild-fast" for a in aliases}
    shadow = schroot_shadow_message(
        recipe, schroot_lookup(recipe["dist"], recipe["arch"], {**in_use, **mine})
    )
    if shadow:
        log.warning("%s", shadow)
    source = current_generation(link) if refresh else None
    argv = chroot_argv(recipe, source, str(base / "tmp.XXXXXXXXXX/tree"), "root")
    if dry_run:
        return {
            "name": name,
            "path": str(link),
            "changed": False,
            "command": argv,
            "schroot_conf": str(conf),
        }
    for directory in (base / "gen", state_dir, root / SCHROOT_CONF_DIR):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Error(f"cannot create {directory}: {exc.strerror}") from None
    with fsutil.locked(base / "lock"):
        if from_record:
            recipe = reread_recipe(state_dir, recipe, mirror)
            if recipe is None:
                return {"name": name, "path": str(link), "changed": False, "removed": True}
        remove_stale_scratch(base)
        generation = base / "gen" / f"{name}.{time.strftime('%Y%m%dT%H%M%S')}"
        with scratch_dir(base) as scratch:
            tree = scratch / "tree"
            source = current_generation(link) if refresh else None
            argv = chroot_argv(recipe, source, str(tree), "root")
            run_mmdebstrap(argv)
            proc.run(["sync", "--file-system", str(tree)], check=False)
            os.rename(tree, generation)
        # Swap the symlink atomically; running sessions keep their old generation.
        new_link = base / f".{name}.new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(new_link)
        os.symlink(os.path.relpath(generation, base), new_link)
        os.replace(new_link, link)
        fsutil.fsync_dir(base)
        fsutil.atomic_write(conf, schroot_conf(recipe, link, aliases))
        prune_generations(base, name, keep={generation.name})
        state = dict(recipe, path=str(link), created=int(time.time()), version=__version__)
        write_state(state_dir, state)
    return {
        "name": name,
        "path": str(link),
        "changed": True,
        "command": argv,
        "schroot_conf": str(conf),
    }


def prune_generations(base: Path, name: str, keep: set) -> None:
    """Keep the newest two generations: a session may still use the previous one."""
    gens = sorted(p for p in (base / "gen").glob(f"{name}.*") if p.name not in keep)
    for old in gens[:-1]:
        log.info("removing old generation %s", old)
        shutil.rmtree(old, ignore_errors=True)


def reread_recipe(state_dir: Path, recipe: Dict, mirror: Optional[str]) -> Optional[Dict]:
    """The recipe from the chroot's record as it is now (the caller holds the lock): a
    create that ran since update read the records may have changed it, and update must
    not undo that. None when the record has gone (removed meanwhile)."""
    state = load_state(state_dir / f"{recipe['name']}.json")
    if state is None or state["mode"] != recipe["mode"]:
        return None
    return recipe_from_state(state, mirror)


def build_chroot(
    recipe: Dict,
    dry_run: bool,
    would: str,
    done: str,
    refresh: bool = False,
    from_record: bool = False,
    mirror: Optional[str] = None,
) -> None:
    """Build the chroot recipe describes in its mode (or say what would be run); refresh
    starts from the current chroot instead of the archive alone; from_record (update)
    takes the recipe from the record again once the lock is held."""
    options = {"refresh": refresh, "from_record": from_record, "mirror": mirror}
    if recipe["mode"] == "schroot":
        result = create_schroot(recipe, dry_run, **options)
    else:
        result = create_unshare(recipe, user_cache_dir(), dry_run, **options)
    if result.get("removed"):
        print(f"{result['name']} was removed meanwhile: left alone")
        return
    if dry_run:
        print("would run: " + " ".join(result["command"]))
        print(f"would {would} {result['path']}")
    else:
        print(f"{done} {result['path']}")


def cmd_create(args: argparse.Namespace) -> int:
    recipe = recipe_from(args)
    build_chroot(recipe, args.dry_run, "write", "created")
    return configure(recipe["mode"], args.configure, args.dry_run)


# sbuild reads the configuration of the user who runs it, and schroot chroots are
# built by root for the members of the sbuild group.
SCHROOT_BUILDERS_NOTE = (
    "note: sbuild reads the configuration of the user who runs it: each builder in the "
    "sbuild group needs this block in their own ~/.sbuildrc (or "
    "~/.config/sbuild/config.pl), or at least 'sbuild --chroot-mode=schroot' (the default "
    "mode of sbuild 0.87 and later is unshare)"
)


def configure(mode: str, write: bool, dry_run: bool) -> int:
    sbuild_ver = sbuild_version()
    block = config_block(mode, sbuild_ver, tmpfs_unpack_template())
    rc_path = sbuildrc_path(sbuild_ver=sbuild_ver)
    current = fsutil.read_text(rc_path) or ""
    merged = merge_config(current, block)
    if merged == current:
        print(f"{rc_path} already has the sbuild-fast settings")
    elif write and not dry_run:
        # A ~/.sbuildrc kept in a dotfiles repository stays a symlink, its mode kept.
        fsutil.atomic_write(rc_path, merged, follow_symlinks=True)
        print(f"wrote the sbuild-fast settings to {rc_path}")
    elif write:
        print(f"would write the sbuild-fast settings to {rc_path}:")
        print(block, end="")
    else:
        print(f"sbuild settings for fast builds (add to {rc_path}, or rerun with --configure):")
        print(block, end="")
    if mode == "schroot":
        print(SCHROOT_BUILDERS_NOTE)
    return EXIT_OK


def recipe_from_state(state: Dict, mirror: Optional[str] = None) -> Dict:
    """The recorded recipe, validated again: a state file is input like any other."""
    dist = validate_dist(str(state["dist"]))
    arch = validate_arch(str(state["arch"]))
    include = state.get("include", [])
    if not isinstance(include, list):
        raise Error(f"malformed record for {dist}-{arch}: include is not a list")
    return {
        "name": chroot_name(dist, arch),
        "dist": dist,
        "arch": arch,
        "mirror": validate_mirror(mirror or str(state.get("mirror") or host_mirror(dist))),
        "include": parse_include([str(p) for p in include]),
        "keep_docs": bool(state.get("keep_docs", False)),
        "eatmydata": bool(state.get("eatmydata", True)),
        "mode": state["mode"],
    }


def cmd_update(args: argparse.Namespace) -> int:
    dists = [validate_dist(d) for d in args.dist]
    if args.mode == "schroot":
        states = read_states(Path("/") / SCHROOT_STATE_DIR)
    else:
        states = read_states(user_cache_dir() / STATE_SUBDIR)
    states = [s for s in states if s["mode"] == args.mode and (not dists or s["dist"] in dists)]
    missing = [d for d in dists if d not in {s["dist"] for s in states}]
    if missing:
        raise Error(f"no sbuild-fast chroot for {', '.join(missing)}: run 'sbuild-fast create'")
    if not states:
        print("no sbuild-fast chroots: nothing to update")
        return EXIT_OK
    # One chroot that cannot be refreshed (a suite gone from the mirror) must not keep
    # the others stale: each is tried, the failures reported, exit 2 at the end.
    failed = []
    for state in states:
        try:
            recipe = recipe_from_state(state, args.mirror)
            build_chroot(
                recipe,
                args.dry_run,
                "replace",
                "updated",
                refresh=not args.recreate,
                from_record=True,
                mirror=args.mirror,
            )
        except Error as exc:
            if len(states) == 1:
                raise
            print(f"sbuild-fast: error: {state['name']}: {exc}", file=sys.stderr)
            failed.append(state["name"])
    if failed:
        raise Error(f"not updated: {', '.join(failed)}")
    return EXIT_OK


# --- list / remove ------------------------------------------------------------------------


def all_states() -> List[Dict]:
    states = read_states(user_cache_dir() / STATE_SUBDIR)
    states += read_states(Path("/") / SCHROOT_STATE_DIR)
    return states


def describe(state: Dict, now: Optional[float] = None) -> Dict:
    """A record as list and doctor show it. The age of a tarball is that of its file, as
    sbuild 0.87 and later see it; a directory chroot's is that of its record."""
    now = time.time() if now is None else now
    path = Path(state["path"])
    created = int(state.get("created") or 0)
    modified = None
    try:
        real = path.resolve()
        info = real.stat()
        present = True
        size = info.st_size if real.is_file() else None
        if real.is_file():
            modified = int(info.st_mtime)
    except OSError:
        size, present = None, False
    since = modified if modified is not None else created
    return {
        "name": state["name"],
        "dist": state["dist"],
        "arch": state["arch"],
        "mode": state["mode"],
        "path": str(path),
        "present": present,
        "size_bytes": size,
        "created": created,
        "modified": modified,
        "age_days": round((now - since) / 86400, 1),
        "mirror": state.get("mirror"),
        "include": state.get("include") or [],
        "keep_docs": state.get("keep_docs", False),
        "eatmydata": state.get("eatmydata", True),
    }


def cmd_list(args: argparse.Namespace) -> int:
    chroots = [describe(s) for s in all_states()]
    if args.json:
        emit_json({"chroots": chroots})
        return EXIT_OK
    if not chroots:
        print("no sbuild-fast chroots")
    for c in chroots:
        size = f"{c['size_bytes'] // 1048576} MiB" if c["size_bytes"] else "-"
        flag = "" if c["present"] else " (missing)"
        print(f"{c['name']}\t{c['mode']}\t{c['age_days']} days\t{size}\t{c['path']}{flag}")
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    dist = validate_dist(args.dist)
    arch = validate_arch(args.arch or host_arch())
    name = chroot_name(dist, arch)
    if args.mode == "schroot":
        base = SCHROOT_BASE
        paths = [
            Path("/") / SCHROOT_CONF_DIR / f"sbuild-fast-{name}",
            base / name,
            Path("/") / SCHROOT_STATE_DIR / f"{name}.json",
        ]
        paths += sorted((base / "gen").glob(f"{name}.*"))
        lock = base / "lock"
    else:
        cache = user_cache_dir()
        record = cache / STATE_SUBDIR / f"{name}.json"
        paths = [cache / f"{name}.tar", record]
        lock = cache / STATE_SUBDIR / "lock"
        # sbuild's cache directory is shared with tarballs made by hand or by
        # sbuild-createchroot: only one sbuild-fast recorded is its to remove.
        if not record.exists() and paths[0].exists():
            raise Error(f"{paths[0]} was not made by sbuild-fast (no {record}): left alone")
    existing = [p for p in paths if p.exists() or p.is_symlink()]
    if not existing:
        raise Error(f"no sbuild-fast chroot {name} ({args.mode} mode)")
    if args.dry_run:
        for path in existing:
            print(f"would remove {path}")
        return EXIT_OK
    if args.mode == "schroot" and os.geteuid() != 0:
        raise Error("--mode schroot needs root")
    holding = fsutil.locked(lock) if lock.parent.is_dir() else contextlib.nullcontext()
    with holding:
        for path in existing:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                fsutil.remove_file(path)
            print(f"removed {path}")
        # Directories the last chroot leaves empty go too; the lock file stays, as
        # another run may be waiting on it.
        leftovers = [base / "gen", Path("/") / SCHROOT_STATE_DIR] if args.mode == "schroot" else []
        for directory in leftovers:
            with contextlib.suppress(OSError):
                directory.rmdir()
    return EXIT_OK


# --- doctor -------------------------------------------------------------------------------


def fs_of(path: Path) -> Tuple[Optional[str], str]:
    """(fstype, options) of the filesystem holding path, from findmnt (last line wins)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    result = proc.run(["findmnt", "-n", "-o", "FSTYPE,FS-OPTIONS", "-T", str(probe)], check=False)
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    if result.returncode != 0 or not lines:
        return None, ""
    fstype, _, options = lines[-1].strip().partition(" ")
    return fstype, options.strip()


def zstd_level(options: str) -> Optional[int]:
    """The zstd level of a btrfs compress=/compress-force= mount option (3 when unset)."""
    for opt in options.split(","):
        key, _, value = opt.partition("=")
        if key in ("compress", "compress-force") and value.startswith("zstd"):
            _, _, level = value.partition(":")
            return int(level) if level.isdigit() else 3
    return None


def btrfs_property_compression(path: Path) -> Optional[str]:
    if not shutil.which("btrfs"):
        return None
    result = proc.run(["btrfs", "property", "get", str(path), "compression"], check=False)
    match = re.search(r"compression=(\S+)", result.stdout)
    return match.group(1) if match else None


SUBID_COUNT = 65536
SUBID_MIN = 100000  # shadow's default SUB_UID_MIN / SUB_GID_MIN


def subid_ranges(path: Path) -> List[Tuple[str, int, int]]:
    """The (owner, first id, count) lines of an /etc/subuid or /etc/subgid file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    ranges = []
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
            ranges.append((fields[0], int(fields[1]), int(fields[2])))
    return ranges


def user_subids(path: Path, user: str) -> Optional[Tuple[int, int]]:
    """(first id, count) that sbuild's unshare mode takes for user: the first line whose
    owner is the user's name (Sbuild::Utility::read_subuid_subgid; a line for the numeric
    uid or a second line for the name is never read)."""
    for owner, start, count in subid_ranges(path):
        if owner == user:
            return start, count
    return None


def read_subids(path: Path, user: str) -> int:
    """How many subordinate ids sbuild's unshare mode gets for user from path."""
    entry = user_subids(path, user)
    return entry[1] if entry else 0


def free_subid_range(path: Path) -> Tuple[int, int]:
    """A range of SUBID_COUNT ids after every range path hands out (first, last)."""
    end = max([start + count for _, start, count in subid_ranges(path)] + [SUBID_MIN])
    return end, end + SUBID_COUNT - 1


def subid_advice(path: Path, kind: str, user: str) -> str:
    """The usermod commands that give user a range sbuild can use."""
    flag = f"sub{kind[3:]}s"  # subuids / subgids
    mine = [(start, count) for owner, start, count in subid_ranges(path) if owner == user]
    big = [i for i, (_, count) in enumerate(mine) if count >= SUBID_COUNT]
    # sbuild reads only the first line for the user: shorter ones before a big one go.
    keep = big[0] if big else len(mine)
    commands = [f"usermod --del-{flag} {a}-{a + max(n, 1) - 1} {user}" for a, n in mine[:keep]]
    if not big:
        first, last = free_subid_range(path)
        commands.append(f"usermod --add-{flag} {first}-{last} {user}")
    return " && ".join(commands)


def inspect_tarball(path: Path) -> Dict[str, bool]:
    """What the chroot really holds: debhelper, eatmydata wired into apt, man-db off."""
    found = {
        "debhelper": False,
        "fakeroot": False,
        "eatmydata": False,
        "eatmydata_dpkg": False,
        "apt_uses_eatmydata": False,
        "apt_under_eatmydata": False,
        "mandb_auto_update": False,
        "marker": False,
        "docs_excluded": False,
        "apt_lists": False,
    }
    wanted = "./" + EATMYDATA_APT_CONF.lstrip("/")
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                name = member.name if member.name.startswith("./") else "./" + member.name
                if name in ("./usr/bin/dh", "./bin/dh"):
                    found["debhelper"] = True
                elif name in ("./usr/bin/fakeroot", "./usr/bin/fakeroot-sysv"):
                    found["fakeroot"] = True
                elif name == "./usr/bin/eatmydata":
                    found["eatmydata"] = True
                elif name == "." + EATMYDATA_DIR + "/dpkg":
                    found["eatmydata_dpkg"] = member.issym() and member.linkname.endswith(
                        "/eatmydata"
                    )
                elif name == wanted and member.isfile():
                    handle = tar.extractfile(member)
                    text = handle.read(4096).decode("utf-8", "replace") if handle else ""
                    found["apt_uses_eatmydata"] = f'"{EATMYDATA_DIR}/dpkg"' in text
                elif name == f".{APT_WRAPPER_DIR}/apt-get" and member.isfile():
                    handle = tar.extractfile(member)
                    text = handle.read(4096).decode("utf-8", "replace") if handle else ""
                    found["apt_under_eatmydata"] = APT_WRAPPER_TAG in text and bool(
                        re.search(r"^exec /usr/bin/eatmydata /usr/bin/apt-get ", text, re.M)
                    )
                elif name == "./var/lib/man-db/auto-update":
                    found["mandb_auto_update"] = True
                elif name == "." + MARKER:
                    found["marker"] = True
                elif name == "./etc/dpkg/dpkg.cfg.d/99mmdebstrap" and member.isfile():
                    handle = tar.extractfile(member)
                    text = handle.read(65536).decode("utf-8", "replace") if handle else ""
                    found["docs_excluded"] = "path-exclude=/usr/share/doc/*" in text
                elif name.startswith("./var/lib/apt/lists/") and name.endswith("_Packages"):
                    found["apt_lists"] = True
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise Error(f"cannot read {path}: {exc}") from None
    return found


def inspect_directory(path: Path, conf: Path) -> Dict[str, bool]:
    """What a schroot-mode chroot holds, and whether schroot prefixes commands with eatmydata."""
    try:
        conf_text = conf.read_text(encoding="utf-8", errors="replace")
    except OSError:
        conf_text = ""
    return {
        "debhelper": (path / "usr/bin/dh").exists(),
        "fakeroot": (path / "usr/bin/fakeroot").exists(),
        "eatmydata": (path / "usr/bin/eatmydata").exists(),
        "command_prefix_eatmydata": bool(
            re.search(r"^command-prefix=eatmydata\b", conf_text, re.M)
        ),
        "mandb_auto_update": (path / "var/lib/man-db/auto-update").exists(),
        "marker": (path / MARKER.lstrip("/")).exists(),
    }


SCHROOT_OVERLAY_DIR = "/var/lib/schroot/union/overlay"  # schroot's union-overlay-directory


def schroot_overlay_dirs(states: Sequence[Dict], root: Path = Path("/")) -> List[Path]:
    """Where schroot sessions of the sbuild-fast chroots write: union-overlay-directory
    from their definitions, schroot's default otherwise."""
    dirs: List[Path] = []
    for state in states:
        if state["mode"] != "schroot":
            continue
        directory = SCHROOT_OVERLAY_DIR
        conf = root / SCHROOT_CONF_DIR / f"sbuild-fast-{state['name']}"
        with contextlib.suppress(OSError):
            for line in conf.read_text(encoding="utf-8", errors="replace").splitlines():
                key, _, value = line.strip().partition("=")
                if key == "union-overlay-directory" and value.startswith("/"):
                    directory = value
        path = root / directory.lstrip("/")
        if path not in dirs:
            dirs.append(path)
    return dirs


def doctor_findings(
    cache_dir: Path,
    config: Dict[str, str],
    build_dirs: Sequence[Path],
    states: List[Dict],
    sbuild_ver: Optional[str],
    now: float,
    root: Path = Path("/"),
    inspect: bool = True,
    uid: Optional[int] = None,
) -> Tuple[List[Dict], Dict]:
    """(findings, facts): each finding has kind, severity (warning|info), path and message.
    uid: the user who builds (default: the caller)."""
    findings: List[Dict] = []
    facts: Dict = {"chroots": []}

    def add(kind: str, message: str, path: Optional[str] = None, severity: str = "warning"):
        findings.append({"kind": kind, "severity": severity, "path": path, "message": message})

    uid = os.getuid() if uid is None else uid
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    mode = config.get("chroot_mode", "")
    facts["chroot_mode"] = mode
    unshare_used = mode == "unshare" or any(s["mode"] == "unshare" for s in states)
    # A user with no chroot yet is about to make one in unshare mode, the default.
    if unshare_used or (not states and uid != 0):
        for kind in ("subuid", "subgid"):
            path = root / "etc" / kind
            count = read_subids(path, user)
            facts[kind] = count
            if count < SUBID_COUNT:
                add(
                    f"no-{kind}",
                    f"sbuild's unshare mode takes the first line for {user} in /etc/{kind}: "
                    f"{count or 'none'} ids, it needs {SUBID_COUNT}: "
                    + subid_advice(path, kind, user),
                    f"/etc/{kind}",
                )
    if mode != "unshare" and any(s["mode"] == "unshare" for s in states):
        add(
            "chroot-mode",
            f"sbuild's chroot_mode is {mode or 'unset'}: plain 'sbuild -d DIST' "
            "ignores the sbuild-fast tarballs (run 'sbuild-fast create --configure')",
        )
    max_age = auto_create_max_age(config, sbuild_ver)
    facts["auto_create_trap"] = max_age is not None
    if max_age is not None and unshare_used:
        keep = config.get("unshare_mmdebstrap_keep_tarball", "").strip() not in ("", "0")
        what = "overwrites it with" if keep else "builds in"
        add(
            "auto-create",
            f"sbuild {sbuild_ver} re-creates unshare chroots whose tarball is "
            f"{max_age / 86400:g} days old and {what} a plain mmdebstrap chroot "
            "($unshare_mmdebstrap_auto_create is on): run 'sbuild-fast create --configure', "
            "or set $unshare_mmdebstrap_auto_create = 0 in the sbuild configuration",
        )
    schroot_conf_names = schroot_names(root) if any(s["mode"] == "schroot" for s in states) else {}
    for state in states:
        info = describe(state, now)
        facts["chroots"].append(info)
        if not info["present"]:
            add(
                "missing",
                f"{info['path']} is gone: run 'sbuild-fast create --dist " f"{info['dist']}'",
                info["path"],
            )
            continue
        age = now - (info["modified"] if info["modified"] is not None else info["created"])
        replaced_at = max_age if state["mode"] == "unshare" else None
        if replaced_at is not None and age >= replaced_at - AGE_MARGIN:
            add(
                "old-chroot",
                f"{info['name']} is {info['age_days']} days old and sbuild re-creates it "
                f"plainly at {replaced_at / 86400:g} days: run 'sbuild-fast update' or "
                "enable sbuild-fast-update.timer",
                info["path"],
            )
        elif info["age_days"] > MAX_AGE_DAYS:
            add(
                "old-chroot",
                f"{info['name']} is {info['age_days']} days old: run "
                "'sbuild-fast update' or enable sbuild-fast-update.timer",
                info["path"],
            )
        if state["mode"] == "unshare":
            for shadow in shadowing_names(state["dist"], state["arch"]):
                for found in matching_files(cache_dir, shadow):
                    add(
                        "shadowed",
                        f"'sbuild -d {state['dist']}' takes {found} before "
                        f"{state['name']}.tar",
                        str(cache_dir / found),
                    )
            others = conflicting_files(cache_dir, state["name"], f"{state['name']}.tar")
            for other in others:
                add(
                    "competing-file",
                    f"{other} competes with {state['name']}.tar in " "sbuild's lookup",
                    str(cache_dir / other),
                )
            content = None
            if inspect:
                try:
                    content = inspect_tarball(Path(info["path"]))
                except Error as exc:
                    add(
                        "unreadable",
                        f"{exc}: run 'sbuild-fast update --recreate {state['dist']}'",
                        info["path"],
                    )
            if content is not None:
                info["content"] = content
                for key, what in (("debhelper", "debhelper"), ("fakeroot", "fakeroot")):
                    if not content[key]:
                        add(
                            "not-preinstalled",
                            f"{what} is missing from {info['path']}",
                            info["path"],
                        )
                if state.get("eatmydata", True) and not (
                    content["eatmydata"]
                    and content["eatmydata_dpkg"]
                    and content["apt_uses_eatmydata"]
                    and content["apt_under_eatmydata"]
                ):
                    add(
                        "no-eatmydata",
                        f"apt and dpkg in {info['path']} do not run under eatmydata: "
                        f"run 'sbuild-fast update {state['dist']}'",
                        info["path"],
                    )
                if content["mandb_auto_update"]:
                    add(
                        "man-db",
                        f"man-db rebuilds its database in every build from " f"{info['path']}",
                        info["path"],
                    )
        elif state["mode"] == "schroot":
            own_conf = root / SCHROOT_CONF_DIR / f"sbuild-fast-{state['name']}"
            shadow = schroot_shadow_message(
                state, schroot_lookup(state["dist"], state["arch"], schroot_conf_names)
            )
            if shadow:
                add("shadowed", shadow, str(own_conf))
            if inspect:
                content = inspect_directory(Path(info["path"]), own_conf)
                info["content"] = content
                for key in ("debhelper", "fakeroot"):
                    if not content[key]:
                        add(
                            "not-preinstalled",
                            f"{key} is missing from {info['path']}",
                            info["path"],
                        )
                if state.get("eatmydata", True) and not (
                    content["eatmydata"] and content["command_prefix_eatmydata"]
                ):
                    add(
                        "no-eatmydata",
                        f"schroot does not run {info['name']}-sbuild-fast under " "eatmydata",
                        info["path"],
                    )
                if content["mandb_auto_update"]:
                    add(
                        "man-db",
                        f"man-db rebuilds its database in every build in {info['path']}",
                        info["path"],
                    )
    # Filesystems builds write to: the unpack dir, the build dir, the chroot store.
    template = config.get("unshare_tmpdir_template") or "/tmp/tmp.sbuild.XXXXXXXXXX"
    unpack_dir = root / Path(template).parent.relative_to("/")
    checked = []
    if unshare_used:
        checked.append(("unpack", unpack_dir))
    checked += [("build", Path(d)) for d in build_dirs]
    if unshare_used or not states:
        checked.append(("store", cache_dir))
    if any(s["mode"] == "schroot" for s in states):
        # schroot sessions write into an overlay directory over the chroot store.
        checked.append(("store", root / SCHROOT_BASE.relative_to("/")))
        checked += [("overlay", d) for d in schroot_overlay_dirs(states, root)]
    facts["filesystems"] = []
    for role, directory in checked:
        fstype, options = fs_of(directory)
        entry = {"role": role, "path": str(directory), "fstype": fstype, "options": options}
        facts["filesystems"].append(entry)
        if role == "unpack" and fstype != "tmpfs":
            tmpl = tmpfs_unpack_template(root)
            hint = f"set $unshare_tmpdir_template = '{tmpl}'" if tmpl else "mount a tmpfs for it"
            add(
                "unpack-not-tmpfs",
                f"sbuild unpacks every chroot into {directory} " f"({fstype}), not tmpfs: {hint}",
                str(directory),
            )
        if fstype == "btrfs":
            level = zstd_level(options)
            prop = btrfs_property_compression(directory)
            entry["zstd_level"] = level
            entry["compression_property"] = prop
            if prop and prop.startswith("zstd"):
                _, _, plevel = prop.partition(":")
                level = max(level or 0, int(plevel) if plevel.isdigit() else 3)
            if level is not None and level >= ZSTD_STALL_LEVEL:
                add(
                    "btrfs-compression",
                    f"{directory} is btrfs with zstd level {level}: "
                    "compression at write-back stalls fsync-heavy builds (a 2026 report "
                    "measured zstd:15 doubling build times); use compress=zstd:3 or lower",
                    str(directory),
                )
        if re.search(r"(^|,)(sync|dirsync)(,|$)", options or ""):
            add(
                "sync-mount",
                f"{directory} is mounted {options}: every write waits for the " "disk",
                str(directory),
            )
        if (
            fstype in ("btrfs", "zfs", "nfs", "nfs4")
            and role != "store"
            and any(not s.get("eatmydata", True) for s in states)
        ):
            add(
                "fsync-heavy",
                f"{directory} is {fstype} and a chroot runs dpkg without " "eatmydata",
                str(directory),
            )
    return findings, facts


def cmd_doctor(args: argparse.Namespace) -> int:
    now = time.time()
    cache_dir = user_cache_dir()
    versions = {}
    for pkg in ("sbuild", "mmdebstrap"):
        result = proc.run(["dpkg-query", "-W", "-f", "${Version}", pkg], check=False)
        versions[pkg] = result.stdout.strip() or None
    config: Dict[str, str] = {}
    config_error = None
    if versions["sbuild"]:
        try:
            config = effective_sbuild_config(versions["sbuild"])
        except Error as exc:
            config_error = str(exc)
    build_dirs = args.build_dir or [Path.cwd()]
    states = all_states()
    findings, facts = doctor_findings(
        cache_dir, config, build_dirs, states, versions["sbuild"], now
    )
    if config_error:
        # sbuild itself fails on this configuration: the first thing to fix.
        findings.insert(
            0,
            {
                "kind": "sbuild-config",
                "severity": "warning",
                "path": None,
                "message": config_error,
            },
        )
    for pkg, version in versions.items():
        if not version:
            findings.append(
                {
                    "kind": "not-installed",
                    "severity": "warning",
                    "path": None,
                    "message": f"{pkg} is not installed",
                }
            )
    if not states:
        findings.append(
            {
                "kind": "no-chroot",
                "severity": "warning",
                "path": str(cache_dir),
                "message": "no sbuild-fast chroot: run 'sbuild-fast create'",
            }
        )
    warnings = [f for f in findings if f["severity"] == "warning"]
    if args.json:
        emit_json(
            {
                "versions": versions,
                "sbuild_config": config,
                **facts,
                "findings": findings,
                "ok": not warnings,
            }
        )
    else:
        for pkg, version in versions.items():
            print(f"{pkg}: {version or 'not installed'}")
        for fs in facts["filesystems"]:
            print(f"{fs['role']} dir {fs['path']}: {fs['fstype']} ({fs['options']})")
        for c in facts["chroots"]:
            print(f"chroot {c['name']} ({c['mode']}): {c['age_days']} days old, {c['path']}")
        for f in findings:
            print(f"{f['severity']}: {f['message']}")
        if not warnings:
            print("nothing to fix")
    return EXIT_ACTION if warnings else EXIT_OK


# --- command line -------------------------------------------------------------------------


def mode_type(value: str) -> str:
    if value not in MODES:
        raise argparse.ArgumentTypeError(f"invalid mode {value!r} (unshare or schroot)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = cli.new_parser(
        PROG, "sbuild chroots with debhelper and eatmydata preinstalled, kept fresh."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def mode_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--mode",
            type=mode_type,
            default="unshare",
            metavar="{unshare,schroot}",
            help="unshare tarball for the user (default) or schroot chroot (root)",
        )

    create = sub.add_parser("create", help="build a fast chroot")
    create.add_argument("--dist", help="distribution (default: the host's)")
    create.add_argument("--arch", help="architecture (default: the host's)")
    create.add_argument(
        "--mirror", metavar="URL", help="Debian archive (default: the one the host's apt uses)"
    )
    create.add_argument(
        "--include",
        action="append",
        metavar="PKG,...",
        help="more packages to preinstall (repeatable)",
    )
    mode_option(create)
    create.add_argument(
        "--keep-docs", action="store_true", help="keep documentation, man pages and translations"
    )
    create.add_argument(
        "--no-eatmydata",
        action="store_true",
        help="run apt and dpkg with their fsyncs (slower, for pristine checks)",
    )
    create.add_argument(
        "--configure",
        action="store_true",
        help="write the sbuild settings block to the sbuild configuration file "
        "(~/.sbuildrc, or ~/.config/sbuild/config.pl for sbuild >= 0.87.1)",
    )
    create.add_argument("-n", "--dry-run", action="store_true", help="print what would be done")
    cli.add_verbosity(create)
    create.set_defaults(func=cmd_create)

    update = sub.add_parser(
        "update", help="refresh chroots (apt update + dist-upgrade) and replace them atomically"
    )
    update.add_argument("dist", nargs="*", metavar="DIST")
    update.add_argument("--mirror", metavar="URL", help="use another archive from now on")
    update.add_argument(
        "--recreate",
        action="store_true",
        help="build the chroots again from the archive instead of refreshing them",
    )
    mode_option(update)
    update.add_argument("-n", "--dry-run", action="store_true", help="print what would be done")
    cli.add_verbosity(update)
    update.set_defaults(func=cmd_update)

    lst = sub.add_parser("list", help="list the chroots sbuild-fast made")
    lst.add_argument("--json", action="store_true", help="print one JSON document")
    cli.add_verbosity(lst)
    lst.set_defaults(func=cmd_list)

    remove = sub.add_parser("remove", help="remove a chroot")
    remove.add_argument("dist", metavar="DIST")
    remove.add_argument("--arch", help="architecture (default: the host's)")
    mode_option(remove)
    remove.add_argument("-n", "--dry-run", action="store_true", help="print what would be done")
    cli.add_verbosity(remove)
    remove.set_defaults(func=cmd_remove)

    doctor = sub.add_parser("doctor", help="find what slows builds down")
    doctor.add_argument(
        "--build-dir",
        action="append",
        type=Path,
        metavar="DIR",
        help="a directory builds write to (default: the current one)",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON document")
    cli.add_verbosity(doctor)
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return cli.run(PROG, build_parser(), argv)
    finally:
        signal.signal(signal.SIGTERM, previous)
