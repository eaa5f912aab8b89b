"""sbuild-fast: what sbuild does, by version: where it looks, what it reads, and our records."""

import contextlib
import errno
import fcntl
import json
import logging
import os
import pwd
import re
import stat
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from debadmin import debver, fsutil, posixacl, proc
from debadmin.errors import Error

log = logging.getLogger("debadmin")

STATE_SUBDIR = ".sbuild-fast"  # under the sbuild cache dir: matches no sbuild chroot name
SCHROOT_BASE = Path("/srv/sbuild-fast")
SCHROOT_CONF_DIR = "etc/schroot/chroot.d"
SCHROOT_STATE_DIR = "var/lib/sbuild-fast"
EATMYDATA_DIR = "/usr/local/libexec/sbuild-fast"
EATMYDATA_APT_CONF = "/etc/apt/apt.conf.d/90sbuild-fast-eatmydata"
APPSTREAM_APT_CONF = "/etc/apt/apt.conf.d/90sbuild-fast-appstream"
MARKER = "/etc/sbuild-fast"
# passwd: sbuild's autopkgtest mode (the session backend) adds its build user with groupadd
# and useradd inside the chroot; trixie's buildd variant has no passwd (Priority: important).
BASE_INCLUDE = ("fakeroot", "debhelper", "passwd")
CONFIG_BEGIN = "# BEGIN sbuild-fast"
CONFIG_END = "# END sbuild-fast"
# sbuild's default $chroot_mode became unshare in 0.90.0; bookworm's 0.85 and trixie's 0.89
# default to schroot (0.89 with a warning), so a plain 'sbuild -d DIST' there needs the block.
UNSHARE_DEFAULT_MIN = "0.90"
MODES = ("unshare", "schroot")
MAX_AGE_DAYS = 7  # the weekly refresh keeps chroots younger than this
# Warn this long before sbuild >= 0.87 would re-create a tarball: the weekly timer's
# random delay (and a user session that is not running) can stretch the gap past a week.
AGE_MARGIN = 86400
DIST_RE = re.compile(r"^[a-z0-9][a-z0-9.+]{0,39}$")
ARCH_RE = re.compile(r"^[a-z0-9]{1,20}$")
PKG_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}$")
URL_RE = re.compile(r"^(https?|file)://[A-Za-z0-9._~:/?#@!$&()*+,;=%\[\]-]+$")
SBUILD_NAME_RE = re.compile(r"^[^-]+-[^-]+(-[^-]+)?(-sbuild)?\.t.+$")

# apt-get and apt-cache run under eatmydata through wrappers in /usr/local/bin (first in
# sbuild's PATH), tagged so that doctor can tell them.
APT_WRAPPERS = ("apt-get", "apt-cache")
APT_WRAPPER_DIR = "/usr/local/bin"
APT_WRAPPER_TAG = "# sbuild-fast: apt without fsync"

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
    """The user's sbuild configuration file that sbuild really reads. From sbuild 0.87.1 on,
    $XDG_CONFIG_HOME/sbuild/config.pl when it exists (~/.sbuildrc is then ignored), and
    also when neither exists: such an sbuild prints 'consider moving your ~/.sbuildrc' at
    every build that reads ~/.sbuildrc. A ~/.sbuildrc the user has stays where it is (it
    holds their settings, which a new config.pl would hide). Before 0.87.1: ~/.sbuildrc."""
    env = dict(os.environ) if env is None else env
    home = env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    sbuildrc = Path(home) / ".sbuildrc"
    if sbuild_ver and debver.at_least(sbuild_ver, "0.87.1"):
        config_home = Path(env.get("XDG_CONFIG_HOME") or Path(home) / ".config")
        config_pl = config_home / "sbuild/config.pl"
        if os.access(config_pl, os.R_OK) or not (sbuildrc.exists() or sbuildrc.is_symlink()):
            return config_pl
    return sbuildrc


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
    "lintian": bool,
    "cache": bool,
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


# --- sbuild configuration ---------------------------------------------------------------


def sbuild_version() -> Optional[str]:
    result = proc.run(["dpkg-query", "-W", "-f", "${Version}", "sbuild"], check=False)
    return result.stdout.strip() or None


def tmpfs_unpack_template(
    root: Path = Path("/"), fs_probe: Optional[Callable[[Path], Tuple[Optional[str], str]]] = None
) -> Optional[str]:
    """A tmpfs directory for sbuild's per-build unpack, when the host has one."""
    for candidate in ("dev/shm", "tmp"):
        fstype, _ = (fs_probe or fs_of)(root / candidate)
        if fstype == "tmpfs":
            return f"/{candidate}/tmp.sbuild.XXXXXXXXXX"
    return None


def default_chroot_mode(sbuild_ver: Optional[str]) -> str:
    """The $chroot_mode sbuild uses when nobody sets one."""
    if sbuild_ver and debver.at_least(sbuild_ver, UNSHARE_DEFAULT_MIN):
        return "unshare"
    return "schroot"


def uses_session_backend(config: Dict[str, str]) -> bool:
    """Whether sbuild's configuration (as sbuild reads it) sends plain builds through
    sbuild-fast's session backend."""
    return (
        config.get("chroot_mode") == "autopkgtest"
        and os.path.basename(config.get("autopkgtest_virt_server", "")) == "sbuild-fast"
    )


def config_block(
    mode: str,
    sbuild_ver: Optional[str],
    tmp_template: Optional[str],
    cache_dir: Optional[str] = None,
    session_server: Optional[str] = None,
    cache: bool = False,
) -> str:
    """The sbuild settings the speed needs, as a marked block for ~/.sbuildrc; cache_dir:
    the package cache to bind-mount in unshare mode (schroot mode's is in its fstab);
    cache: whether builds use a package cache (either mode), which sbuild's own
    'apt-get distclean' would empty;
    session_server: sbuild-fast's path, when plain builds go through its session backend
    (sbuild's autopkgtest mode); the unshare settings stay for --chroot-mode=unshare."""
    lines = [
        f"{CONFIG_BEGIN} (written by 'sbuild-fast create --configure'; edits inside are lost)",
    ]
    sbuild_mode = "autopkgtest" if session_server and mode == "unshare" else mode
    if default_chroot_mode(sbuild_ver) != sbuild_mode:
        lines.append(
            f"# sbuild {sbuild_ver or ''} defaults to {default_chroot_mode(sbuild_ver)} mode "
            f"(unshare from {UNSHARE_DEFAULT_MIN} on)".replace("  ", " ")
        )
    if sbuild_mode == "autopkgtest":
        lines += [
            "# One namespace set per build, entered per command: sbuild-fast's session",
            "# backend, through sbuild's autopkgtest mode (the build without network,",
            "# every process killed when the build ends, ids as unshare mode maps them).",
            f"$chroot_mode = '{sbuild_mode}';",
            f"$autopkgtest_virt_server = {perl_quote(session_server or '')};",
            "$autopkgtest_virt_server_options = ['session', '--dist', '%r', '--arch', '%a'];",
            "# The session is thrown away when the build ends: purging the build",
            "# dependencies first (sbuild does it in autopkgtest mode, not in unshare",
            "# mode) costs 1-2 s a build for nothing. Not when the command line names",
            "# a chroot or chroot mode: that may be a chroot that persists.",
            f"$purge_build_deps = 'never' unless {PERSISTENT_CHROOT_TEST};",
            "# A chroot named on the command line (-c, --chroot) is built in as named,",
            "# in sbuild's unshare mode: the session serves sbuild-fast's chroots only.",
            f"$chroot_mode = 'unshare' if {NAMED_CHROOT_TEST};",
        ]
    else:
        lines.append(f"$chroot_mode = '{mode}';")
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
        lines += cache_config_lines(cache_dir, sbuild_ver)
    if cache or cache_dir:
        lines += distclean_config_lines(sbuild_ver)
    # Nothing else: sbuild's defaults stay (apt update and dist-upgrade cost nothing
    # measurable on a chroot the weekly refresh keeps fresh; $purge_build_deps does nothing
    # for a cloned session, which both modes use; lintian is preinstalled when it runs).
    lines += ["1;", CONFIG_END]
    return "\n".join(lines) + "\n"


def block_backend(text: str) -> Optional[str]:
    """The backend an existing sbuild-fast block in text chose for plain builds: 'session'
    (sbuild's autopkgtest mode through sbuild-fast), 'unshare', or None (no block, or a
    schroot one)."""
    match = re.search(
        "^" + re.escape(CONFIG_BEGIN) + r".*?^" + re.escape(CONFIG_END), text, re.M | re.S
    )
    if not match:
        return None
    modes = re.findall(r"^\$chroot_mode = '([a-z]+)';", match.group(0), re.M)
    if modes == ["autopkgtest"]:
        return "session"
    return "unshare" if modes == ["unshare"] else None


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
    "AUTOPKGTEST_VIRT_SERVER",
)
# sbuild 0.87 and later only: asking an older sbuild for them is pointless.
SBUILD_AUTO_CREATE_KEYS = (
    "UNSHARE_MMDEBSTRAP_AUTO_CREATE",
    "UNSHARE_MMDEBSTRAP_MAX_AGE",
    "UNSHARE_MMDEBSTRAP_KEEP_TARBALL",
)


def sbuild_config_keys(sbuild_ver: Optional[str]) -> Tuple[str, ...]:
    keys = SBUILD_CONFIG_KEYS
    if sbuild_ver and debver.at_least(sbuild_ver, "0.87"):
        keys += SBUILD_AUTO_CREATE_KEYS
    if sbuild_ver and debver.at_least(sbuild_ver, CLEAN_APT_CACHE_MIN):
        keys += ("CLEAN_APT_CACHE",)
    return keys


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


def sbuild_unshare_view() -> Tuple[Optional[str], List[Tuple[Path, str]]]:
    """sbuild's BUILD_ARCH and $unshare_bind_mounts (directory, mount point) as its
    configuration sets them: what its unshare mode builds on and mounts."""
    # After a marker: sbuild 0.87.1 and later print "I: consider moving your ~/.sbuildrc"
    # on standard output while reading a ~/.sbuildrc.
    script = (
        'my $c = Sbuild::Conf::new(); print "\\0sbuild-fast-view\\0",'
        " $c->get('BUILD_ARCH') // '', \"\\0\";"
        " for my $m (@{$c->get('UNSHARE_BIND_MOUNTS') // []}) {"
        ' print $m->{directory}, "\\0", $m->{mountpoint}, "\\0" }'
    )
    result = proc.run(["perl", "-MSbuild::Conf", "-e", script], check=False)
    if result.returncode != 0:
        lines = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
        raise Error(
            "sbuild cannot read its configuration: " + " ".join(lines[-2:] or ["perl failed"])
        )
    fields = result.stdout.split("\0sbuild-fast-view\0")[-1].split("\0")
    build_arch, pairs = fields[0] or None, fields[1:-1]
    return build_arch, [(Path(d), m) for d, m in zip(pairs[0::2], pairs[1::2])]


def find_unshare_tarball(cache_dir: Path, name: str) -> Optional[Path]:
    """The tarball sbuild's unshare mode finds for chroot name in cache_dir
    (ChrootUnshare.pm: a file matching ^NAME\\.t.+$; sorted here, readdir order there).
    A cache_dir that cannot be read is an Error, as for matching_files' other callers."""
    for entry in matching_files(cache_dir, name):
        if (cache_dir / entry).is_file():
            return cache_dir / entry
    return None


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


def conflicting_files(cache_dir: Path, name: str, ours: str) -> List[str]:
    return [f for f in matching_files(cache_dir, name) if f != ours]


# schroot sessions write into an overlay directory: on tmpfs, a build's writes (the
# build-deps installed, the build tree) never reach a disk. /dev/shm is tmpfs on every
# systemd host and half the RAM by default; the directory is root's (0700), made again at
# boot by sbuild-fast's tmpfiles.d entry, since schroot only creates sessions inside it.
TMPFS_OVERLAY_DIR = "/dev/shm/sbuild-fast-overlay"
TMPFS_OVERLAY_MIN = 4 << 30  # a tmpfs smaller than this is left to small builds


def tmpfs_overlay_fit(
    root: Path = Path("/"), fs_probe: Optional[Callable[[Path], Tuple[Optional[str], str]]] = None
) -> Tuple[bool, str]:
    """(whether schroot's overlay can go to TMPFS_OVERLAY_DIR, why or why not)."""
    shm = root / "dev/shm"
    fstype, _ = (fs_probe or fs_of)(shm)
    if fstype != "tmpfs":
        return False, f"{shm} is {fstype or 'not mounted'}, not tmpfs"
    try:
        info = os.statvfs(shm)
    except OSError as exc:
        return False, f"cannot read {shm}: {exc.strerror}"
    size = info.f_blocks * info.f_frsize
    if size < TMPFS_OVERLAY_MIN:
        return False, (
            f"{shm} holds {size / (1 << 30):.1f} GiB, under the "
            f"{TMPFS_OVERLAY_MIN >> 30} GiB a build's overlay may need"
        )
    return True, f"{shm} is tmpfs of {size / (1 << 30):.1f} GiB"


def schroot_conf(
    recipe: Dict,
    directory: Path,
    aliases: Sequence[str],
    overlay_dir: Optional[str] = None,
    fstab: Optional[str] = None,
) -> str:
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
    if overlay_dir:
        lines.append(f"union-overlay-directory={overlay_dir}")
    if fstab:  # after profile=, which would set it to sbuild's
        lines.append(f"setup.fstab={fstab}")
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
        "lintian": state.get("lintian"),  # None: a record from before lintian was asked
        "cache": state.get("cache", False),
    }


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


# --- what each command in the chroot costs ------------------------------------------------

# Commands sbuild runs in the chroot for one build of a small debhelper package (0.85, 0.89
# and 0.91 alike, counted from --debug logs by bench/sbuild-fast).
COMMANDS_PER_BUILD = 105
COST_SAMPLES = 5

# sbuild 0.85's own way into an unshare-mode chroot, timed around 'true': the user
# namespace (perl, newuidmap, newgidmap) that sbuild makes afresh for every command.
UNSHARE_COST_PERL = r"""
use Sbuild::Utility; use Time::HiRes qw(time);
my @idmap = read_subuid_subgid;
my @cmd = get_unshare_cmd({UNSHARE_FLAGS => CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS
    | CLONE_NEWIPC, FORK => 1, IDMAP => \@idmap});
for (1 .. $ARGV[0]) {
    my $t = time; system(@cmd, "true") == 0 or exit 1; printf "%.4f\n", time - $t }
"""


def _median(values: List[float]) -> Optional[float]:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def unshare_command_cost(sbuild_ver: Optional[str]) -> Optional[float]:
    """Seconds sbuild's unshare mode spends entering the chroot's namespaces for each
    command (a lower bound: the mounts and the chroot itself come on top), or None where
    it cannot be timed: no subordinate ids, or sbuild >= 0.87, whose sbuild-usernsexec
    needs an unpacked chroot."""
    if not sbuild_ver or debver.at_least(sbuild_ver, "0.87"):
        return None
    result = proc.run(["perl", "-e", UNSHARE_COST_PERL, str(COST_SAMPLES)], check=False)
    if result.returncode != 0:
        return None
    return _median([float(x) for x in result.stdout.split() if re.match(r"^[\d.]+$", x)])


def schroot_command_cost(chroot: str) -> Optional[float]:
    """Seconds per command in a session of schroot chroot chroot, as sbuild runs them
    ('schroot -r -c SESSION -- ...'), or None when the caller cannot open a session."""
    begin = proc.run(["schroot", "-b", "-c", chroot], check=False)
    session = begin.stdout.strip()
    if begin.returncode != 0 or not re.match(r"^[\w.:-]+$", session):
        return None
    try:
        times = []
        for _ in range(COST_SAMPLES):
            start = time.monotonic()
            if proc.run(["schroot", "-r", "-c", session, "--", "true"], check=False).returncode:
                return None
            times.append(time.monotonic() - start)
        return _median(times)
    finally:
        proc.run(["schroot", "-e", "-c", session], check=False)


# --- the package cache shared across builds ------------------------------------------------

# A host directory bind-mounted over apt's archive directory in every build: the .debs a
# build downloads stay for the next one (pbuilder's APTCACHE). apt in the chroot downloads
# as the chroot's root (APT::Sandbox::User), not as _apt. In unshare mode sbuild maps the
# chroot's root to the user's first subordinate id and leaves the user's own uid unmapped,
# so nothing in the chroot can write a file the user owns: the directory stays the
# user's (who can so read, prune and remove every file in it) and a POSIX ACL lets the
# subordinate root write there; the files are that id's. apt-get runs under flock on
# CACHE_LOCK, so that builds sharing the cache wait for each other instead of failing on
# apt's own lock, and update prunes under that lock too.
CACHE_MOUNTPOINT = "/var/cache/apt/archives"
CACHE_LOCK = ".sbuild-fast.lock"
CACHE_APT_CONF = "/etc/apt/apt.conf.d/90sbuild-fast-cache"
CACHE_SUBDIR = "debs"  # under STATE_SUBDIR, for the user's unshare chroots
SCHROOT_CACHE_DIR = Path("/var/cache/sbuild-fast/debs")
SCHROOT_FSTAB = "etc/schroot/sbuild-fast/fstab"  # sbuild's profile fstab plus the cache
SBUILD_PROFILE_FSTAB = "etc/schroot/sbuild/fstab"
CACHE_MAX_FILE = "cache-max"  # beside the records: the cap in bytes, as text
DEFAULT_CACHE_MAX = 2 << 30
MAX_SIZE = 1 << 60  # sizes above are typing errors, and overflow a float
CACHE_LOCK_WAIT = 600  # seconds apt-get (and a prune) wait for a build holding the cache
PARTIAL_MAX_AGE = 86400  # partial downloads older than this are an interrupted build's
SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?$", re.I)
UNSHARE_BIND_MOUNTS_MIN = "0.85"  # bookworm's sbuild has $unshare_bind_mounts; older: none


def parse_size(text: str) -> int:
    """Bytes from '2G', '500M', '1.5GiB' or a plain number of bytes (powers of 1024)."""
    match = SIZE_RE.match(str(text).strip())
    if not match:
        raise Error(f"invalid size {text!r} (a number with K, M, G or T)")
    unit = match.group(2).upper()
    scale = 1024 ** ("KMGT".find(unit) + 1) if unit else 1
    try:
        size = int(float(match.group(1)) * scale)
    except (OverflowError, ValueError):  # float("9" * 400) is inf
        size = MAX_SIZE + 1
    if size <= 0:
        raise Error(f"invalid size {text!r}: must be above zero")
    if size > MAX_SIZE:
        raise Error(f"invalid size {str(text)[:40]!r}: above {MAX_SIZE >> 50} PiB")
    return size


def mode_state_dir(mode: str, root: Path = Path("/")) -> Path:
    if mode == "schroot":
        return root / SCHROOT_STATE_DIR
    return user_cache_dir() / STATE_SUBDIR


def package_cache_dir(mode: str, root: Path = Path("/")) -> Path:
    """The host directory that holds a mode's cached .debs: the user's for unshare mode,
    the system's (root's, for the sbuild group's schroot builds) for schroot mode."""
    if mode == "schroot":
        return root / SCHROOT_CACHE_DIR.relative_to("/")
    return user_cache_dir() / STATE_SUBDIR / CACHE_SUBDIR


def read_cache_max(state_dir: Path) -> int:
    try:
        text = (state_dir / CACHE_MAX_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return DEFAULT_CACHE_MAX
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8
        log.warning("ignoring unreadable %s: %s", state_dir / CACHE_MAX_FILE, exc)
        return DEFAULT_CACHE_MAX
    try:
        return parse_size(text)
    except Error:
        log.warning("ignoring malformed %s: %r", state_dir / CACHE_MAX_FILE, text[:40])
        return DEFAULT_CACHE_MAX


def write_cache_max(state_dir: Path, size: int) -> None:
    fsutil.atomic_write(state_dir / CACHE_MAX_FILE, f"{size}\n")


def cache_entries(
    directory: Path, dir_fd: Optional[int] = None
) -> List[Tuple[Path, int, float, int]]:
    """(path, size, last use, owner) of each .deb in directory (read through dir_fd, an
    open descriptor of it, when given). Last use is the later of mtime (downloaded) and
    atime (apt read it to check its hash: relatime records that once a day)."""
    entries = []
    try:
        names = os.listdir(directory if dir_fd is None else dir_fd)
    except OSError:
        return []
    for name in names:
        if not name.endswith(".deb"):
            continue
        try:
            if dir_fd is None:
                info = os.lstat(directory / name)
            else:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            # What the file holds on disk: a sparse file's apparent size could
            # otherwise evict every other package from the cache.
            size = min(info.st_size, info.st_blocks * 512)
            entries.append(
                (directory / name, size, max(info.st_mtime, info.st_atime), info.st_uid)
            )
    return entries


def cache_usage(directory: Path, max_bytes: int) -> Dict:
    """What list and doctor show of a package cache."""
    entries = cache_entries(directory)
    return {
        "path": str(directory),
        "present": directory.is_dir(),
        "files": len(entries),
        "size_bytes": sum(e[1] for e in entries),
        "max_bytes": max_bytes,
    }


def prune_plan(entries: Sequence[Tuple[Path, int, float, int]], max_bytes: int) -> List[Path]:
    """The least recently used .debs to remove so that the rest fit in max_bytes."""
    total = sum(e[1] for e in entries)
    remove = []
    for path, size, _, _ in sorted(entries, key=lambda e: (e[2], e[0].name)):
        if total <= max_bytes:
            break
        remove.append(path)
        total -= size
    return remove


def subordinate_root(user: str, root: Path = Path("/")) -> Optional[int]:
    """The host uid of an unshare-mode chroot's root: the first id of the first
    /etc/subuid line of user's name (Sbuild::Utility::read_subuid_subgid)."""
    with contextlib.suppress(OSError):
        for line in (root / "etc/subuid").read_text(encoding="utf-8").splitlines():
            fields = line.strip().split(":")
            if len(fields) == 3 and fields[0] == user and fields[1].isdigit():
                return int(fields[1])
    return None


ACL_XATTR = posixacl.ACCESS_XATTR


def acl_granting(uid: int) -> bytes:
    """The access ACL u::rwx,u:UID:rwx,g::r-x,m::rwx,o::r-x."""
    entries = posixacl.from_mode(0o755)
    entries[(posixacl.USER, uid)] = 7
    entries[(posixacl.MASK, posixacl.UNDEFINED)] = 7
    return posixacl.pack(entries)


def acl_with_search(data: Optional[bytes], mode: int, uid: int) -> bytes:
    """The access ACL data (or, with none, the one mode makes) with search (x) for uid
    added, no one else's effective rights changed. Raises Error when uid's x would only
    be effective by adding x to the mask while another group-class entry (the owning
    group, a named user or group) holds x: that would widen their access too."""
    entries = posixacl.parse(data or b"") or posixacl.from_mode(mode)
    mask_key = (posixacl.MASK, posixacl.UNDEFINED)
    if mask_key in entries and not entries[mask_key] & 1:
        widened = [
            acl_entry_name(tag, ident)
            for (tag, ident), perm in sorted(entries.items())
            if tag in (posixacl.USER, posixacl.GROUP, posixacl.GROUP_OBJ)
            and perm & 1
            and (tag, ident) != (posixacl.USER, uid)
        ]
        if widened:
            raise Error(
                f"its ACL mask has no x: adding it would also let {', '.join(widened)} search"
            )
    entries[(posixacl.USER, uid)] = entries.get((posixacl.USER, uid), 0) | 1
    group = entries[(posixacl.GROUP_OBJ, posixacl.UNDEFINED)]
    entries[mask_key] = entries.get(mask_key, group) | 1
    return posixacl.pack(entries)


def acl_entry_name(tag: int, ident: int) -> str:
    if tag == posixacl.GROUP_OBJ:
        return "the owning group"
    return f"{'user' if tag == posixacl.USER else 'group'} {ident}"


def acl_searchable(data: bytes, uid: int) -> bool:
    """Whether the ACL lets uid search, through its named entry and the mask."""
    entries = posixacl.parse(data) or {}
    mask = entries.get((posixacl.MASK, posixacl.UNDEFINED), 7)
    return bool(entries.get((posixacl.USER, uid), 0) & mask & 1)


def grant_search_path(directory: Path, uid: int, dry_run: bool = False) -> List[Path]:
    """Let uid reach directory: search (x) through an ACL on each of the caller's own
    directories above it that others cannot search (a home of mode 0700, trixie's
    useradd default). In unshare mode sbuild resolves the bind mount's source as the
    chroot's root, a subordinate id of the user's. No one else's access changes: a
    directory where uid's entry would need a wider mask, one that would open it to
    others with ACL entries there too, is refused (Error, with the command that does it
    knowingly). Returns the directories changed (dry_run: that would be; directories
    not made yet are skipped, ensure_cache_dir makes them 0755)."""
    changed = []
    for parent in directory.parents:
        try:
            info = os.stat(parent)
        except FileNotFoundError:
            if dry_run:
                continue
            break
        except OSError:
            break
        if info.st_mode & 0o001:
            continue
        if info.st_uid != os.geteuid():
            raise Error(f"{parent} is not searchable by the chroot's root and not the caller's")
        try:
            current: Optional[bytes] = os.getxattr(parent, ACL_XATTR)
        except OSError:
            current = None
        if current and acl_searchable(current, uid):
            continue
        try:
            acl = acl_with_search(current, info.st_mode, uid)
        except Error as exc:
            raise Error(
                f"cannot let uid {uid} (the chroot's root) search {parent}: {exc}; "
                f"run 'setfacl -m u:{uid}:x {parent}' if that is meant, or use --no-cache"
            ) from None
        if dry_run:
            changed.append(parent)
            continue
        try:
            os.setxattr(parent, ACL_XATTR, acl)
        except OSError as exc:
            raise Error(f"cannot let uid {uid} search {parent}: {exc.strerror}") from None
        changed.append(parent)
    return changed


def check_acl_support(directory: Path) -> None:
    """Raise Error when the filesystem directory is (or will be made) on has no POSIX
    ACLs (ZFS with acltype=off, ext4 mounted noacl): the chroot's root could not be let
    write to the cache there."""
    existing = next((d for d in (directory, *directory.parents) if d.exists()), Path("/"))
    try:
        os.getxattr(existing, ACL_XATTR)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            raise Error(
                f"{existing} is on a filesystem without POSIX ACLs: the chroot's root "
                "cannot be let write to the package cache there; use --no-cache"
            ) from None


def ensure_cache_dir(directory: Path, writer: Optional[int] = None) -> None:
    """The cache directory, the caller's, mode 0755; writer: a uid that gets write access
    through an ACL (an unshare-mode chroot's root), and search access to the caller's
    directories above it. apt makes partial/ itself."""
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        raise Error(f"cannot create {directory}: {exc.strerror}") from None
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise Error(f"{directory} is not a directory of the caller's own: not used as a cache")
    if writer is not None:
        try:
            os.setxattr(directory, ACL_XATTR, acl_granting(writer))
        except OSError as exc:
            raise Error(
                f"cannot let the chroot's root (uid {writer}) write to {directory}: "
                f"{exc.strerror} (a filesystem without POSIX ACLs? use --no-cache)"
            ) from None
        for parent in grant_search_path(directory, writer):
            log.warning("%s: search access for uid %d (the chroot's root) added", parent, writer)


def open_dir_nofollow(name: str, dir_fd: int) -> int:
    """A descriptor of the directory name in dir_fd, never through a symbolic link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, dir_fd=dir_fd)


def prune_cache(directory: Path, max_bytes: int, now: Optional[float] = None) -> Dict:
    """Remove the least recently used .debs above max_bytes, and partial downloads older
    than a day, under the lock the chroots' apt-get holds (a build installing from the
    cache keeps its files). Returns what was removed and what is left.

    The chroot's root can write to the cache: everything below directory is reached
    through descriptors, never a symbolic link, so that a link it planted (partial ->
    /elsewhere) cannot turn pruning on files outside the cache."""
    now = time.time() if now is None else now
    result: Dict = {"path": str(directory), "removed_files": 0, "removed_bytes": 0}
    result["skipped"] = None
    try:
        parent_fd = os.open(directory.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return dict(result, size_bytes=0, files=0)
    try:
        dfd = open_dir_nofollow(directory.name, parent_fd)
    except FileNotFoundError:
        return dict(result, size_bytes=0, files=0)
    except OSError as exc:
        raise Error(f"{directory} is not a directory: not pruned ({exc.strerror})") from None
    finally:
        os.close(parent_fd)
    try:
        return prune_cache_at(directory, dfd, max_bytes, now, result)
    finally:
        os.close(dfd)


def prune_cache_at(directory: Path, dfd: int, max_bytes: int, now: float, result: Dict) -> Dict:
    # flock(2) needs no write access: the chroot's root may have made the file. It may
    # also have planted a FIFO there: O_NONBLOCK keeps the open from waiting for a writer.
    try:
        flags = os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(CACHE_LOCK, flags, 0o644, dir_fd=dfd)
    except OSError as exc:
        raise Error(f"cannot open {directory / CACHE_LOCK}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Error(f"{directory / CACHE_LOCK} is not a regular file: cache not pruned")
    try:
        deadline = time.monotonic() + CACHE_LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("%s is in use by a build: not pruned", directory)
                    entries = cache_entries(directory, dfd)
                    return dict(
                        result,
                        skipped="in use",
                        files=len(entries),
                        size_bytes=sum(e[1] for e in entries),
                    )
                time.sleep(1)
        entries = cache_entries(directory, dfd)
        for path in prune_plan(entries, max_bytes):
            size = next(e[1] for e in entries if e[0] == path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=dfd)
                result["removed_files"] += 1
                result["removed_bytes"] += size
        prune_partial(directory, dfd, now, result)
    finally:
        os.close(fd)
    left = cache_entries(directory, dfd)
    return dict(result, files=len(left), size_bytes=sum(e[1] for e in left))


def prune_partial(directory: Path, dfd: int, now: float, result: Dict) -> None:
    """Remove partial downloads older than PARTIAL_MAX_AGE from partial/ (apt's, the
    chroot root's: the caller may not be able to read it). A partial that is not a
    real directory (a symbolic link) is left alone and reported."""
    try:
        pfd = open_dir_nofollow("partial", dfd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            log.warning("%s is not a directory: left alone", directory / "partial")
            result["partial_skipped"] = "not a directory"
        return
    try:
        for name in os.listdir(pfd):
            with contextlib.suppress(OSError):
                info = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and now - info.st_mtime > PARTIAL_MAX_AGE:
                    os.unlink(name, dir_fd=pfd)
    except OSError:
        pass
    finally:
        os.close(pfd)


def package_caches(states: Sequence[Dict]) -> List[Dict]:
    """The package cache of each mode whose chroots use one, as list and doctor show it."""
    caches = []
    for mode in MODES:
        if any(s["mode"] == mode and s.get("cache") for s in states):
            limit = read_cache_max(mode_state_dir(mode))
            caches.append(dict(cache_usage(package_cache_dir(mode), limit), mode=mode))
    return caches


def perl_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Perl, in the block: whether sbuild's command line names a chroot (-c NAME, -cNAME,
# --chroot NAME, --chroot=NAME; not --chroot-mode nor --chroot-setup-commands), which
# sbuild then builds in rather than the sbuild-fast chroot of the distribution. sbuild's
# Getopt::Long spec (Sbuild/Options.pm, 0.85 to 0.91): "c|chroot=s", "chroot-mode=s",
# "chroot-setup-commands=s", "chroot-update-failed-commands=s",
# "chroot-cleanup-commands=s"; with gnu_getopt (-cNAME) and auto_abbrev (--chroot-m,
# --chroot-mo and --chroot-mod are --chroot-mode; --chroot is exact, its shorter
# prefixes ambiguous). Nothing after '--' is an option.
NAMED_CHROOT_RE = r"^(?:-c|--chroot(?:=|$))"
CHROOT_MODE_RE = r"^--chroot-m(?:o(?:de?)?)?(?:=|$)"


def _options_test(regex: str) -> str:
    return f"grep {{ /{regex}/ }} @ARGV[0 .. ((grep {{ $ARGV[$_] eq '--' }} 0 .. $#ARGV)[0] // scalar(@ARGV)) - 1]"


NAMED_CHROOT_TEST = _options_test(NAMED_CHROOT_RE)
# A session that may persist: a chroot or a chroot mode named on the command line.
PERSISTENT_CHROOT_TEST = _options_test(f"{NAMED_CHROOT_RE}|{CHROOT_MODE_RE}")


def cache_config_lines(cache_dir: Optional[str], sbuild_ver: Optional[str]) -> List[str]:
    """The unshare-mode sbuild setting that bind-mounts the cache (kept: the user's own
    $unshare_bind_mounts for other mount points)."""
    if not cache_dir or not sbuild_ver or not debver.at_least(sbuild_ver, UNSHARE_BIND_MOUNTS_MIN):
        return []
    return [
        "# The package cache shared across builds (sbuild-fast update prunes it), for",
        "# sbuild-fast's chroots: a chroot named on the command line lacks the apt",
        "# settings that make builds take turns, and two of its builds would fail on",
        "# apt's lock of the cache.",
        "$unshare_bind_mounts = [(grep { $_->{mountpoint} ne "
        f"'{CACHE_MOUNTPOINT}' }} @{{$unshare_bind_mounts // []}}),",
        f"    {{ directory => {perl_quote(cache_dir)}, mountpoint => '{CACHE_MOUNTPOINT}' }}]",
        f"    unless {NAMED_CHROOT_TEST};",
    ]


# sbuild 0.91.3 and later run 'apt-get distclean' as root in the chroot once the build
# dependencies are in ($clean_apt_cache, on by default; the setting came in 0.89.3, off):
# with the package cache mounted on /var/cache/apt/archives, that empties the cache itself.
CLEAN_APT_CACHE_DEFAULT_MIN = "0.91.3"
CLEAN_APT_CACHE_MIN = "0.89.3"


def distclean_config_lines(sbuild_ver: Optional[str]) -> List[str]:
    """The setting that keeps sbuild's 'apt-get distclean' from emptying the package
    cache, for an sbuild that runs it by default."""
    if not sbuild_ver or not debver.at_least(sbuild_ver, CLEAN_APT_CACHE_DEFAULT_MIN):
        return []
    return [
        "# sbuild's 'apt-get distclean' before the build would empty the shared package",
        "# cache: off, as before sbuild 0.91.3 (the build sees apt's package lists).",
        "$clean_apt_cache = 0;",
    ]


def schroot_fstab(profile_fstab: str, cache_dir: Path) -> str:
    """sbuild's schroot profile fstab with the package cache bind-mounted."""
    if not profile_fstab.endswith("\n"):
        profile_fstab += "\n"
    return (
        profile_fstab
        + "# sbuild-fast: the package cache shared across builds (sbuild-fast update prunes it)\n"
        + f"{cache_dir}  {CACHE_MOUNTPOINT}  none  rw,bind  0  0\n"
    )
