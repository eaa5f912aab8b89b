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
MAX_AGE_DAYS = 7  # sbuild >= 0.87 re-creates unshare chroots older than a week
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


def host_mirror(root: Path = Path("/")) -> str:
    """The Debian archive the host's apt uses (not the security archive)."""
    candidates: List[str] = []
    sources_dir = root / "etc/apt/sources.list.d"
    try:
        deb822 = sorted(p for p in sources_dir.iterdir() if p.name.endswith(".sources"))
    except OSError:
        deb822 = []
    for path in deb822:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            fields: Dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[0].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" not in fields.get("types", "").split():
                continue
            if fields.get("enabled", "yes").lower() == "no":
                continue
            candidates.extend(fields.get("uris", "").split())
    lists = [root / "etc/apt/sources.list"]
    try:
        lists += sorted(p for p in sources_dir.iterdir() if p.name.endswith(".list"))
    except OSError:
        pass
    for path in lists:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                candidates.append(words[1])
    for uri in candidates:
        if "security" not in uri and URL_RE.match(uri):
            return uri.rstrip("/")
    return "http://deb.debian.org/debian"


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


def read_states(state_dir: Path) -> List[Dict]:
    states = []
    try:
        paths = sorted(state_dir.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log.warning("ignoring unreadable state file %s", path)
            continue
        if isinstance(state, dict) and {"dist", "arch", "mode"} <= state.keys():
            states.append(state)
    return states


def write_state(state_dir: Path, state: Dict) -> None:
    data = json.dumps(state, indent=2, sort_keys=True) + "\n"
    fsutil.atomic_write(state_dir / f"{state['name']}.json", data)


def recipe_from(args: argparse.Namespace, root: Path = Path("/")) -> Dict:
    dist = validate_dist(args.dist or host_codename(root))
    arch = validate_arch(args.arch or host_arch())
    mirror = validate_mirror(args.mirror or host_mirror(root))
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


def effective_sbuild_config() -> Dict[str, str]:
    """sbuild's own view of its configuration (system file plus ~/.sbuildrc)."""
    keys = (
        "CHROOT_MODE",
        "UNSHARE_TMPDIR_TEMPLATE",
        "APT_UPDATE",
        "APT_DISTUPGRADE",
        "APT_UPGRADE",
        "PURGE_BUILD_DEPS",
        "RUN_LINTIAN",
        "BUILD_DIR",
    )
    script = (
        "my $c = Sbuild::Conf::new(); for my $k (@ARGV) { my $v = eval { $c->get($k) };"
        " $v = '' unless defined $v; print \"$k=$v\\n\" }"
    )
    result = proc.run(["perl", "-MSbuild::Conf", "-e", script, *keys], check=False)
    if result.returncode != 0:
        raise Error(
            "cannot read sbuild's configuration: "
            + (result.stderr.strip().splitlines() or ["perl failed"])[-1]
        )
    config = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition("=")
        config[key.lower()] = value
    return config


# --- create / update ---------------------------------------------------------------------


def conflicting_files(cache_dir: Path, name: str, ours: str) -> List[str]:
    return [f for f in matching_files(cache_dir, name) if f != ours]


def chroot_argv(recipe: Dict, source: Optional[Path], output: str, mode: str) -> List[str]:
    if source is None:
        return mmdebstrap_argv(recipe, output, mode)
    return mmdebstrap_refresh_argv(recipe, str(source), output, mode)


def create_unshare(recipe: Dict, cache_dir: Path, dry_run: bool, refresh: bool = False) -> Dict:
    """Build the tarball (refresh: from the current one with apt update + dist-upgrade,
    when there is one) and rename it into place under the lock."""
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


def schroot_names_in_use(root: Path, own_conf: Path) -> set:
    names = set()
    conf_dir = root / SCHROOT_CONF_DIR
    files = [root / "etc/schroot/schroot.conf"]
    with contextlib.suppress(OSError):
        files += sorted(conf_dir.iterdir())
    for path in files:
        if path == own_conf:
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                names.add(line[1:-1])
            elif line.startswith("aliases="):
                names.update(a.strip() for a in line[8:].split(",") if a.strip())
    return names


def current_generation(link: Path) -> Optional[Path]:
    """The directory the schroot symlink points at, if it is there."""
    try:
        real = link.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return real if real.is_dir() else None


def create_schroot(
    recipe: Dict, dry_run: bool, root: Path = Path("/"), refresh: bool = False
) -> Dict:
    if os.geteuid() != 0 and not dry_run:
        raise Error("--mode schroot needs root")
    name = recipe["name"]
    base = root / SCHROOT_BASE.relative_to("/")
    link = base / name
    conf = root / SCHROOT_CONF_DIR / f"sbuild-fast-{name}"
    state_dir = root / SCHROOT_STATE_DIR
    in_use = schroot_names_in_use(root, conf)
    aliases = [a for a in (f"{name}-sbuild", f"{recipe['dist']}-sbuild") if a not in in_use]
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


def build_chroot(
    recipe: Dict, dry_run: bool, would: str, done: str, refresh: bool = False
) -> None:
    """Build the chroot recipe describes in its mode (or say what would be run); refresh
    starts from the current chroot instead of the archive alone."""
    if recipe["mode"] == "schroot":
        result = create_schroot(recipe, dry_run, refresh=refresh)
    else:
        result = create_unshare(recipe, user_cache_dir(), dry_run, refresh=refresh)
    if dry_run:
        print("would run: " + " ".join(result["command"]))
        print(f"would {would} {result['path']}")
    else:
        print(f"{done} {result['path']}")


def cmd_create(args: argparse.Namespace) -> int:
    recipe = recipe_from(args)
    build_chroot(recipe, args.dry_run, "write", "created")
    return configure(recipe["mode"], args.configure, args.dry_run)


def configure(mode: str, write: bool, dry_run: bool) -> int:
    sbuild_ver = sbuild_version()
    block = config_block(mode, sbuild_ver, tmpfs_unpack_template())
    rc_path = sbuildrc_path(sbuild_ver=sbuild_ver)
    try:
        current = rc_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise Error(f"cannot read {rc_path}: {exc}") from None
    merged = merge_config(current, block)
    if merged == current:
        print(f"{rc_path} already has the sbuild-fast settings")
        return EXIT_OK
    if write and not dry_run:
        # A ~/.sbuildrc kept in a dotfiles repository stays a symlink, its mode kept.
        fsutil.atomic_write(rc_path, merged, follow_symlinks=True)
        print(f"wrote the sbuild-fast settings to {rc_path}")
    elif write:
        print(f"would write the sbuild-fast settings to {rc_path}:")
        print(block, end="")
    else:
        print(f"sbuild settings for fast builds (add to {rc_path}, or rerun with --configure):")
        print(block, end="")
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
        "mirror": validate_mirror(mirror or str(state.get("mirror") or host_mirror())),
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
            build_chroot(recipe, args.dry_run, "replace", "updated", refresh=not args.recreate)
        except Error as exc:
            if len(states) == 1:
                raise
            print(f"sbuild-fast: error: {state.get('name', state['dist'])}: {exc}", file=sys.stderr)
            failed.append(state.get("name", state["dist"]))
    if failed:
        raise Error(f"not updated: {', '.join(failed)}")
    return EXIT_OK


# --- list / remove ------------------------------------------------------------------------


def all_states() -> List[Dict]:
    states = read_states(user_cache_dir() / STATE_SUBDIR)
    states += read_states(Path("/") / SCHROOT_STATE_DIR)
    return states


def describe(state: Dict, now: Optional[float] = None) -> Dict:
    now = time.time() if now is None else now
    path = Path(state.get("path", ""))
    try:
        real = path.resolve()
        size = real.stat().st_size if real.is_file() else None
        present = real.exists()
    except OSError:
        size, present = None, False
    created = int(state.get("created", 0))
    return {
        "name": state.get("name"),
        "dist": state["dist"],
        "arch": state["arch"],
        "mode": state["mode"],
        "path": str(path),
        "present": present,
        "size_bytes": size,
        "created": created,
        "age_days": round((now - created) / 86400, 1),
        "mirror": state.get("mirror"),
        "include": state.get("include", []),
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


def read_subids(path: Path, user: str, uid: int) -> int:
    """How many subordinate ids path grants user (by name or uid)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0
    total = 0
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] in (user, str(uid)) and fields[2].isdigit():
            total += int(fields[2])
    return total


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


def doctor_findings(
    cache_dir: Path,
    config: Dict[str, str],
    build_dirs: Sequence[Path],
    states: List[Dict],
    sbuild_ver: Optional[str],
    now: float,
    root: Path = Path("/"),
    inspect: bool = True,
) -> Tuple[List[Dict], Dict]:
    """(findings, facts): each finding has kind, severity (warning|info), path and message."""
    findings: List[Dict] = []
    facts: Dict = {"chroots": []}

    def add(kind: str, message: str, path: Optional[str] = None, severity: str = "warning"):
        findings.append({"kind": kind, "severity": severity, "path": path, "message": message})

    user = pwd.getpwuid(os.getuid()).pw_name
    mode = config.get("chroot_mode", "")
    facts["chroot_mode"] = mode
    if os.getuid() != 0 or mode == "unshare":
        for kind in ("subuid", "subgid"):
            count = read_subids(root / "etc" / kind, user, os.getuid())
            facts[kind] = count
            if count < 65536:
                add(
                    f"no-{kind}",
                    f"/etc/{kind} grants {user} {count} ids, unshare mode needs "
                    f"65536: usermod --add-sub{kind[3:]}s 100000-165535 {user}",
                    f"/etc/{kind}",
                )
    if mode != "unshare" and any(s["mode"] == "unshare" for s in states):
        add(
            "chroot-mode",
            f"sbuild's chroot_mode is {mode or 'unset'}: plain 'sbuild -d DIST' "
            "ignores the sbuild-fast tarballs (run 'sbuild-fast create --configure')",
        )
    if sbuild_ver and debver.at_least(sbuild_ver, "0.87"):
        facts["auto_create_trap"] = True
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
        if info["age_days"] > MAX_AGE_DAYS:
            extra = (
                " and sbuild >= 0.87 silently replaces it with a plain chroot"
                if facts.get("auto_create_trap")
                else ""
            )
            add(
                "old-chroot",
                f"{info['name']} is {info['age_days']} days old{extra}: run "
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
        elif state["mode"] == "schroot" and inspect:
            content = inspect_directory(
                Path(info["path"]), root / SCHROOT_CONF_DIR / f"sbuild-fast-{state['name']}"
            )
            info["content"] = content
            for key in ("debhelper", "fakeroot"):
                if not content[key]:
                    add("not-preinstalled", f"{key} is missing from {info['path']}", info["path"])
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
    if mode == "unshare" or any(s["mode"] == "unshare" for s in states):
        checked.append(("unpack", unpack_dir))
    checked += [("build", Path(d)) for d in build_dirs]
    checked.append(("store", cache_dir))
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
    config = effective_sbuild_config() if versions["sbuild"] else {}
    build_dirs = args.build_dir or [Path.cwd()]
    states = all_states()
    findings, facts = doctor_findings(
        cache_dir, config, build_dirs, states, versions["sbuild"], now
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
