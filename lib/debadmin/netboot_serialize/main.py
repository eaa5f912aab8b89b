"""netboot-serialize: put a Debian installer netboot tree (BIOS and UEFI) on a serial console."""

import argparse
import ctypes
import difflib
import filecmp
import hashlib
import logging
import os
import posixpath
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Dict, Iterable, List, Optional, Set, Tuple

from debadmin import cli, fsutil, metrics
from debadmin.findings import finding
from debadmin.errors import EXIT_ACTION, EXIT_OK, Error
from debadmin.output import emit_json
from debadmin.netboot_serialize import tar as tarball
from debadmin.netboot_serialize.menus import (
    COMMENT_ONLY,
    TOP_LEVEL,
    edit_grub,
    edit_syslinux_included,
    edit_syslinux_top,
    labels,
    recorded_settings,
    syslinux_marker,
)
from debadmin.netboot_serialize.settings import (
    KEPT_OPTION,
    Settings,
    _merge,
    parse_console,
)

PROG = "netboot-serialize"
log = logging.getLogger("debadmin")

# --- trees ---------------------------------------------------------------------------------


@dataclass
class Layout:
    """Where the files of one netboot tree are, relative to its top."""

    arch_dir: str
    configs: List[str]  # boot-screens/*.cfg
    grub: Optional[str]
    version: Optional[str]

    def wanted(self, name: str) -> bool:
        return name in self.configs or name == self.grub or name == self.version


# What boots each architecture's installer when its netboot tree has no boot menu of its
# own, and so where its serial console is set instead.
NO_MENU = {
    "armhf": "U-Boot boots it with tftpboot.scr, which passes U-Boot's 'console' variable "
    "to the kernel: set that in U-Boot (setenv console ttyS0,115200n8; saveenv)",
    "armel": "U-Boot boots it, passing its 'console' variable (or the bootargs you set) "
    "to the kernel: set console=DEVICE,BAUD there",
    "ppc64el": "petitboot or your own pxelinux-style configuration boots vmlinux and "
    "initrd.gz: put console=hvc0 (PowerVM, KVM) or console=ttyS0,115200n8 on its "
    "append line",
}
NO_MENU_OTHER = (
    "the firmware's loader (U-Boot, PMON, CFE) boots its kernel: put console=DEVICE,BAUD "
    "on the command line you give it"
)


def _first_groups(pattern: str, names: List[str]) -> List[str]:
    """The sorted distinct first groups of pattern matching whole names."""
    return sorted({m.group(1) for m in (re.fullmatch(pattern, n) for n in names) if m})


def _loader_kernel_dirs(names: List[str]) -> List[str]:
    """Directories holding an initrd and a kernel beside it (for a firmware's loader)."""
    return sorted(
        {
            posixpath.dirname(n) or "."
            for n in names
            if re.fullmatch(r"(?:.+/)?initrd[^/]*", n)
            and any(
                re.fullmatch(
                    re.escape(posixpath.dirname(n)) + r"/?(?:vmlinu[xz]|uImage|linux)[^/]*", k
                )
                for k in names
            )
        }
    )


def not_a_tree(names: List[str]) -> str:
    """Why names are not one installer netboot tree, saying what to give instead."""
    menus = _first_groups(
        r"(.+)/debian-installer/[a-z0-9]+/(?:boot-screens/syslinux|grub/grub)\.cfg", names
    )
    if menus:
        where = " and ".join(f"{p}/" for p in menus)
        return (
            f"the netboot {'trees are' if len(menus) > 1 else 'tree is'} in {where} below "
            f"SOURCE, not at its top: give {' or '.join(f'SOURCE/{p}' for p in menus)}"
        )
    bare = _first_groups(
        r"(?:.+/)?debian-installer/([a-z0-9]+)/(?:initrd\.gz|.*/initrd\.gz)", names
    )
    if bare:
        arch = bare[0]
        return (
            f"the {', '.join(bare)} netboot tree has no boot menu (no syslinux or GRUB "
            f"configuration), so there is nothing here to serialize: "
            + NO_MENU.get(arch, NO_MENU_OTHER)
        )
    kernels = _loader_kernel_dirs(names)
    if kernels:
        more = f" and {len(kernels) - 1} more" if len(kernels) > 1 else ""
        where = "at the top" if kernels[0] == "." else f"{kernels[0]}/"
        return (
            f"a kernel and initrd for a firmware loader ({where}{more}) but no boot "
            "menu (no syslinux or GRUB configuration), so there is nothing here to "
            "serialize (Debian's armel and mips netboot packages): " + NO_MENU_OTHER
        )
    return (
        "not a Debian installer netboot tree: expected "
        "debian-installer/ARCH/boot-screens/syslinux.cfg (BIOS) or "
        "debian-installer/ARCH/grub/grub.cfg (UEFI)"
    )


def find_layout(names: List[str], quiet: bool = False) -> Layout:
    """Recognise an installer netboot tree from its relative file names."""
    arch_dirs = sorted(
        {
            match.group(1)
            for match in (
                re.fullmatch(
                    r"(debian-installer/[a-z0-9]+)/(boot-screens/syslinux|grub/grub)\.cfg", n
                )
                for n in names
            )
            if match
        }
    )
    if len(arch_dirs) > 1:
        raise Error(
            "a TFTP root with several installer trees ("
            + ", ".join(d.split("/")[1] for d in arch_dirs)
            + ") is not supported: serialize each architecture's netboot tree, then "
            "merge them"
        )
    if not arch_dirs:
        raise Error(not_a_tree(names))
    arch = arch_dirs[0]
    if f"{arch}/boot-screens/syslinux.cfg" in names and "pxelinux.0" not in names:
        raise Error("not a Debian installer netboot tree: syslinux menus but no pxelinux.0")
    configs = sorted(
        n for n in names if re.fullmatch(re.escape(arch) + r"/boot-screens/[^/]+\.cfg", n)
    )
    grub = f"{arch}/grub/grub.cfg" if f"{arch}/grub/grub.cfg" in names else None
    if grub is None and not quiet:
        log.warning("%s has no grub/grub.cfg: UEFI clients stay on their VGA console", arch)
    return Layout(arch, configs, grub, "version.info" if "version.info" in names else None)


def installer_version(data: Optional[bytes]) -> Dict[str, Optional[str]]:
    result: Dict[str, Optional[str]] = {"debian_version": None, "installer_build": None}
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "Debian version":
            result["debian_version"] = value.strip()
        elif sep and key.strip() == "Installer build":
            result["installer_build"] = value.strip()
    return result


@dataclass
class Change:
    path: str
    notes: List[str]
    old: bytes
    new: bytes


def serialize(files: Dict[str, bytes], layout: Layout, new: Settings) -> List[Change]:
    """The edits that serialize the tree whose relevant files are given; pure."""
    prefix = layout.arch_dir + "/boot-screens/"
    if layout.configs and new.port not in range(4):
        raise Error(
            f"console {new.device}: this tree boots BIOS clients with syslinux, which "
            "drives ttyS0..ttyS3 only"
        )
    legacy = syslinux_marker(files.get(prefix + "syslinux.cfg", b""))
    result: Dict[str, Tuple[bytes, List[str]]] = {}
    for name in layout.configs:
        if name[len(prefix) :] not in TOP_LEVEL:
            result[name] = edit_syslinux_included(files[name], legacy, new)
    menu = labels({n: result[n][0] for n in result})
    for base in TOP_LEVEL:
        name = prefix + base
        if name in files:
            result[name] = edit_syslinux_top(files[name], new, base, menu)
    if layout.grub:
        result[layout.grub] = edit_grub(files[layout.grub], new, layout.arch_dir.split("/")[-1])
    return [
        Change(name, notes, files[name], data)
        for name, (data, notes) in sorted(result.items())
        if data != files[name]
    ]


# --- reading and writing -----------------------------------------------------------------------


def tree_names(top: Path) -> List[str]:
    """Relative names below top, without entering symlinked directories."""
    names = []
    for dirpath, dirnames, filenames in os.walk(top, onerror=tarball.walk_error):
        rel = os.path.relpath(dirpath, top)
        for name in dirnames + filenames:
            names.append(os.path.normpath(os.path.join(rel, name)))
    return names


def read_tree(top: Path) -> Tuple[Layout, Dict[str, bytes]]:
    if not top.is_dir():
        raise Error(f"{top} is not a directory or a tarball")
    layout = find_layout(tree_names(top))
    if (top / layout.arch_dir / "grub").is_symlink():
        raise Error(
            f"refusing {top / layout.arch_dir / 'grub'}: a symlinked directory "
            "(its grub.cfg is not edited through a link)"
        )
    files = {}
    real_top = top.resolve()
    for name in layout.configs + [n for n in (layout.grub, layout.version) if n]:
        path = top / name
        if path.is_symlink() or not path.is_file():
            raise Error(f"refusing {path}: not a regular file (symlinks are not edited)")
        if path.stat().st_size > MAX_CONFIG_SIZE:
            raise Error(f"refusing {path}: over {MAX_CONFIG_SIZE} bytes, not a boot config")
        if real_top not in path.resolve().parents:
            raise Error(f"refusing {path}: it resolves outside {top}")
        try:
            files[name] = path.read_bytes()
        except OSError as exc:
            raise Error(f"cannot read {path}: {exc.strerror}") from None
    return layout, files


MAX_CONFIG_SIZE = 1 << 20  # d-i's largest, grub.cfg, is 10 kB


def read_tarball(path: Path) -> Tuple[Layout, Dict[str, bytes], List[tarball.Member]]:
    found: List[Layout] = []

    def choose(names: List[str]) -> List[str]:
        # Only the files of the one recognised tree are read, never every *.cfg.
        found.append(find_layout(names))
        return [n for n in names if found[0].wanted(n)]

    members, contents = tarball.read_members(path, choose)
    layout = found[0]
    if any(m.name == f"{layout.arch_dir}/grub" and m.kind == "symlink" for m in members):
        raise Error(
            f"refusing tarball: {layout.arch_dir}/grub is a symlinked directory "
            "(its grub.cfg is not edited through a link)"
        )
    for name in layout.configs + [n for n in (layout.grub, layout.version) if n]:
        if name not in contents:
            raise Error(f"refusing tarball: {name} is not a regular file")
        if len(contents[name]) > MAX_CONFIG_SIZE:
            raise Error(f"refusing tarball: {name} is over {MAX_CONFIG_SIZE} bytes")
    return layout, contents, members


def _sibling_temp_dir(dest: Path, suffix: str = ".tmp") -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=suffix, dir=dest.parent))
    except OSError as exc:
        raise Error(f"cannot create a directory next to {dest}: {exc.strerror}") from None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where unsupported."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    return False


def put_tree_in_place(staging: Path, dest: Path) -> None:
    """Rename the finished staging directory to dest, replacing an old dest whole.

    The caller has checked that the old dest holds nothing the new tree lacks.
    """
    fsutil.fsync_dir(staging)
    if not os.path.lexists(dest):
        os.rename(staging, dest)
    elif _exchange(staging, dest):
        shutil.rmtree(staging)
    else:
        old = _sibling_temp_dir(dest, ".old")  # a fresh name: never someone else's
        os.rename(dest, old)
        os.rename(staging, dest)
        shutil.rmtree(old)
    fsutil.fsync_dir(dest.parent)


class _Unchanged(Exception):
    """Raised inside atomic_writer to drop a new file that equals the one it would replace."""


def _same_bytes(fd: int, path: Path) -> bool:
    try:
        other = open(path, "rb")
    except OSError:
        return False
    with other:
        if os.fstat(fd).st_size != os.fstat(other.fileno()).st_size:
            return False
        offset = 0
        while True:
            chunk = os.pread(fd, 1 << 20, offset)
            if chunk != other.read(1 << 20):
                return False
            if not chunk:
                return True
            offset += len(chunk)


def write_tarball_atomically(dest: Path, writer: Callable[[BinaryIO], None]) -> bool:
    """Write dest through writer; False (and dest untouched) when the bytes are the same.

    An existing dest keeps its mode, owner and group.
    """
    old = os.stat(dest) if dest.is_file() else None
    mode, uid, gid = (0o644, None, None) if old is None else _ownership(dest, old)
    try:
        with fsutil.atomic_writer(dest, mode, uid, gid) as out:
            writer(out)
            out.flush()
            if old is not None and _same_bytes(out.fileno(), dest):
                raise _Unchanged
    except _Unchanged:
        return False
    return True


def _can_chown() -> bool:
    """Whether this process may give files away (CAP_CHOWN), as root normally may."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def _ownership(path: Path, old: os.stat_result) -> Tuple[int, int, int]:
    """Mode, uid and gid for the file replacing path; Error when they cannot be kept."""
    if not _can_chown() and (
        old.st_uid != os.geteuid() or old.st_gid not in (os.getegid(), *os.getgroups())
    ):
        raise Error(
            f"cannot keep the owner of {path} (uid {old.st_uid}, gid {old.st_gid}): "
            "run as root or as its owner"
        )
    return stat.S_IMODE(old.st_mode), old.st_uid, old.st_gid


def write_in_place(source: Path, replace: Dict[str, bytes]) -> None:
    """Replace files of the tree one by one, each keeping its mode, owner and group."""
    # syslinux.cfg goes last: the menu files a 0.1.0 run left without their own marker
    # fall back to its marker, which must stay the old one until they are all rewritten.
    names = sorted(replace, key=lambda n: (n.endswith("/syslinux.cfg"), n))
    keep = {name: _ownership(source / name, os.stat(source / name)) for name in names}
    for name in names:
        mode, uid, gid = keep[name]
        fsutil.atomic_write(source / name, replace[name], mode=mode, uid=uid, gid=gid)


def same_tree(new: Path, old: Path, replaced: Iterable[str]) -> bool:
    """Whether old already is new: names, kinds, modes, link targets, contents, and the
    time stamps of the files copied unchanged."""
    names = sorted(tree_names(new))
    if names != sorted(tree_names(old)):
        return False
    for name in names:
        a, b = os.lstat(new / name), os.lstat(old / name)
        if a.st_mode != b.st_mode:
            return False
        if stat.S_ISLNK(a.st_mode):
            if os.readlink(new / name) != os.readlink(old / name):
                return False
        elif stat.S_ISREG(a.st_mode):
            if a.st_size != b.st_size:
                return False
            if name not in replaced and a.st_mtime_ns != b.st_mtime_ns:
                return False
            if not filecmp.cmp(new / name, old / name, shallow=False):
                return False
    return True


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a tree keeping symlinks as symlinks; refuse anything but files and dirs."""
    for name in sorted(tree_names(src)):
        s, d = src / name, dest / name
        kind = tarball.lstat_kind(s)
        if kind == "symlink":
            os.symlink(os.readlink(s), d)
        elif kind == "dir":
            d.mkdir()
        elif kind == "file":
            shutil.copy2(s, d, follow_symlinks=False)
        else:
            raise Error(f"refusing to copy {s}: not a file, directory or symlink")
    for name in sorted(tree_names(src), reverse=True):
        if tarball.lstat_kind(src / name) == "dir":
            shutil.copystat(src / name, dest / name)


# --- command line ----------------------------------------------------------------------------


@dataclass
class Report:
    source: str
    source_kind: str
    output: Optional[str]
    output_kind: Optional[str]
    version: Dict[str, Optional[str]]
    settings: Settings
    changes: List[Change] = field(default_factory=list)
    mode: str = "apply"
    written: bool = False
    warnings: List[dict] = field(default_factory=list)
    kept: List[str] = field(default_factory=list)
    kept_from: Optional[str] = None

    def findings(self) -> List[dict]:
        """The shared shape: each file not serialized as asked (action under --check,
        info otherwise: a run fixes it), then the warnings about the tree."""
        severity = "action" if self.mode == "check" else "info"
        return [
            finding(
                "comment-only" if c.notes == [COMMENT_ONLY] else "not-serialized",
                "info" if c.notes == [COMMENT_ONLY] else severity,
                f"{c.path}: {'; '.join(c.notes)}",
                c.path,
                what=c.notes,
            )
            for c in self.changes
        ] + self.warnings

    def diff(self) -> str:
        chunks = []
        for change in self.changes:
            chunks.extend(
                difflib.unified_diff(
                    change.old.decode("utf-8", "replace").splitlines(keepends=True),
                    change.new.decode("utf-8", "replace").splitlines(keepends=True),
                    f"a/{change.path}",
                    f"b/{change.path}",
                )
            )
        return "".join(chunks)

    def as_dict(self) -> dict:
        document = {
            "mode": self.mode,
            "source": self.source,
            "source_kind": self.source_kind,
            "output": self.output,
            "output_kind": self.output_kind,
            **self.version,
            "console": self.settings.console,
            "also_vga": self.settings.also_vga,
            "extra_args": self.settings.extra_args,
            "timeout": self.settings.timeout,
            "default": self.settings.default,
            "kept": self.kept,
            "serialized": not self.changes,
            "changes": [{"path": c.path, "what": c.notes} for c in self.changes],
            "findings": self.findings(),
            "written": self.written,
        }
        if self.mode == "dry-run":
            document["diff"] = self.diff()
        return document


def kind_of(path: Path) -> str:
    if path.is_dir():
        return "tree"
    if path.is_file():
        return "tarball"
    raise Error(
        f"{path} does not exist"
        if not os.path.lexists(path)
        else f"{path} is neither a directory nor a tarball"
    )


def output_path(text: Optional[str]) -> Optional[Path]:
    """--output as an absolute path with its parent resolved (DEST itself may be a link)."""
    if text is None:
        return None
    if not text:
        raise Error("--output needs a file or directory name")
    path = Path(text)
    path = path.resolve() if path.name in ("", "..") else path.parent.resolve() / path.name
    if path == Path(path.anchor):
        raise Error(f"--output {text}: refusing to replace the root directory")
    return path


def new_names(source: Path, source_kind: str, members: List[tarball.Member]) -> Set[str]:
    """Every name the written tree will hold."""
    if source_kind == "tree":
        return set(tree_names(source))
    names = set()
    for member in members:
        parts = member.name.split("/")
        names.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


def _foreign_names(dest: Path, names: Set[str], arch_dir: str) -> List[str]:
    """What the tree at dest holds that the new tree (names) has not, apart from the
    installer's own directory of an installer tree of the same architecture."""
    old_names = tree_names(dest)
    foreign = sorted(set(old_names) - names)
    if foreign and arch_dir:
        try:
            same = find_layout(old_names, quiet=True).arch_dir == arch_dir
        except Error:
            same = False
        if same:
            foreign = [n for n in foreign if not n.startswith(arch_dir + "/")]
    return foreign


def check_output(
    source: Path, source_kind: str, dest: Path, names: Set[str], arch_dir: str = ""
) -> str:
    """Refuse a DEST that would lose data; return its kind, tree or tarball.

    An existing tree may be replaced when all it holds is in the new tree, except below
    the installer's own directory (arch_dir, debian-installer/ARCH) when the old tree is
    an installer tree of the same architecture: that directory is the installer's, and a
    newer release drops files from it (trixie's GRUB has no linuxefi.mod).
    """
    if tarball.is_unsupported_tarball_name(dest):
        raise Error(
            f"--output {dest}: tarballs are written as .tar.gz, .tgz, .tar.xz, .txz, "
            ".tar.bz2, .tbz2 or .tar"
        )
    dest_kind = "tarball" if tarball.is_tarball_name(dest) else "tree"
    real_source, real_dest = source.resolve(), dest.resolve()
    if source_kind == "tree" and real_source in real_dest.parents:
        raise Error(f"--output {dest} lies inside the source tree")
    if real_dest in real_source.parents:
        raise Error(
            f"--output {dest} holds the source {source}; "
            "write to a new or empty directory beside it"
        )
    is_tree = dest.is_dir() and not dest.is_symlink()
    if os.path.lexists(dest) and (dest_kind == "tree") != is_tree:
        raise Error(f"--output {dest} exists and is not a {dest_kind}")
    if not dest.parent.is_dir():
        raise Error(f"--output {dest}: {dest.parent} is not a directory")
    # The old directory is replaced whole: only when all it holds is in the new tree.
    foreign = _foreign_names(dest, names, arch_dir) if dest_kind == "tree" and is_tree else []
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise Error(
            f"refusing to replace {dest}: it holds {foreign[0]}{more}, which the new "
            "tree has not; write to a new or empty directory"
        )
    return dest_kind


def verify_sha256sums(source: Path, sums: Path) -> str:
    """Check source against a SHA256SUMS file as Debian publishes it next to netboot.tar.gz
    (lines 'HASH  ./netboot/netboot.tar.gz'); the listed path whose hash matches.

    The text and gtk tarballs share a file name, so any line with source's name may match.
    """
    try:
        text = sums.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise Error(f"cannot read --sha256sums {sums}: {exc.strerror}") from None
    listed = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([0-9a-fA-F]{64}) [ *](.+)", line.strip())
        if match and posixpath_name(match.group(2)) == source.name:
            listed[match.group(2)] = match.group(1).lower()
    if not listed:
        raise Error(f"--sha256sums {sums} lists no file named {source.name}")
    digest = hashlib.sha256()
    try:
        with open(source, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise Error(f"cannot read {source}: {exc.strerror}") from None
    found = [name for name, value in listed.items() if value == digest.hexdigest()]
    if not found:
        raise Error(
            f"{source} does not match its SHA256SUMS entry ({', '.join(sorted(listed))}): "
            "a damaged or different download"
        )
    return found[0]


def posixpath_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _read_source(
    args: argparse.Namespace, source: Path
) -> Tuple[str, Layout, Dict[str, bytes], List[tarball.Member]]:
    """(source kind, layout, relevant files, tarball members) of SOURCE, checked against
    --sha256sums when given."""
    source_kind = kind_of(source)
    if args.sha256sums is not None:
        if source_kind != "tarball":
            raise Error("--sha256sums checks a downloaded tarball, not a directory tree")
        log.info(
            "%s matches %s in %s",
            source,
            verify_sha256sums(source, Path(args.sha256sums)),
            args.sha256sums,
        )
    members: List[tarball.Member] = []
    if source_kind == "tree":
        layout, files = read_tree(source)
    else:
        layout, files, members = read_tarball(source)
    return source_kind, layout, files, members


def _recorded(
    files: Dict[str, bytes], layout: Layout, source: Path, dest: Optional[Path]
) -> Tuple[Optional[Settings], str]:
    """The choices an earlier run recorded, and where: in the source, else in DEST."""
    recorded = recorded_settings(files, layout)
    if recorded is None and dest is not None and dest.is_dir() and not dest.is_symlink():
        # A newer download into a TFTP root serialized before keeps the root's choices.
        try:
            dest_layout, dest_files = read_tree(dest)
            return recorded_settings(dest_files, dest_layout), str(dest)
        except Error:
            return None, str(source)
    return recorded, str(source)


def _warn_packaged(source: Path, source_kind: str, dest: Optional[Path], changes) -> None:
    """Say that a package's upgrade undoes changes made in place to its tree."""
    if (
        dest is None
        and source_kind == "tree"
        and changes
        and source.resolve().is_relative_to("/usr/lib/debian-installer")
    ):
        log.warning(
            "%s belongs to a package: its next upgrade undoes these changes " "(use --output)",
            source,
        )


def run(args: argparse.Namespace) -> int:
    # Bad options are refused before the source is read.
    if args.console is not None:
        parse_console(args.console)
    _merge(args, "amd64", Settings("ttyS0", 115200, timeout=1))
    source = Path(args.source)
    source_kind, layout, files, members = _read_source(args, source)
    dest = output_path(args.output)
    if dest is not None and dest.resolve() == source.resolve():
        dest = None
    recorded, recorded_in = _recorded(files, layout, source, dest)
    new, kept = _merge(args, layout.arch_dir.split("/")[-1], recorded)
    dest_kind = None
    if dest is not None:
        dest_kind = check_output(
            source, source_kind, dest, new_names(source, source_kind, members), layout.arch_dir
        )
    changes = serialize(files, layout, new)
    mode = "check" if args.check else "dry-run" if args.dry_run else "apply"
    report = Report(
        str(source),
        source_kind,
        str(dest) if dest else None,
        dest_kind,
        installer_version(files.get(layout.version or "")),
        new,
        changes,
        mode,
        kept=[KEPT_OPTION[k](new) for k in kept],
        kept_from=recorded_in if kept else None,
    )
    if layout.grub is None:
        report.warnings.append(
            finding(
                "no-grub-cfg",
                "warning",
                f"{layout.arch_dir} has no grub/grub.cfg: UEFI clients stay on their VGA console",
                layout.arch_dir,
            )
        )
    if mode == "apply":
        _warn_packaged(source, source_kind, dest, changes)
        replace = {c.path: c.new for c in changes}
        report.written = write(source, source_kind, dest, dest_kind, members, replace)
    return _result(args, report)


def _result(args: argparse.Namespace, report: Report) -> int:
    """Print the report as asked; the exit status."""
    metrics.findings(report.findings())
    if args.json:
        emit_json(report.as_dict())
    elif getattr(args, "verbosity", 0) >= 0 or report.mode == "dry-run":
        # -q: the exit status says it all (a dry run's diff is its result, kept).
        print_report(report)
    # A file whose only difference is the settings comment (written by 0.1.0, which
    # kept it in syslinux.cfg alone) boots as asked: not a reason to alarm a monitor.
    if report.mode == "check" and any(c.notes != [COMMENT_ONLY] for c in report.changes):
        return EXIT_ACTION
    return EXIT_OK


def write(
    source: Path,
    source_kind: str,
    dest: Optional[Path],
    dest_kind: Optional[str],
    members: List[tarball.Member],
    replace: Dict[str, bytes],
) -> bool:
    """Write the result; False when nothing needed writing (dest already is the result)."""
    if dest is None:
        if not replace:
            return False
        if source_kind == "tree":
            write_in_place(source, replace)
            return True
        compression = tarball.detect_compression(source)  # kept, whatever the name says
        return write_tarball_atomically(
            source, lambda out: tarball.rewrite(source, members, out, replace, compression)
        )
    if dest_kind == "tarball":
        compression = tarball.compression_of_name(dest) or "plain"
        if source_kind == "tree":
            return write_tarball_atomically(
                dest, lambda out: tarball.write_tree_tarball(source, out, replace, compression)
            )
        return write_tarball_atomically(
            dest, lambda out: tarball.rewrite(source, members, out, replace, compression)
        )
    return write_tree(source, source_kind, dest, members, replace)


def write_tree(
    source: Path,
    source_kind: str,
    dest: Path,
    members: List[tarball.Member],
    replace: Dict[str, bytes],
) -> bool:
    """Build the tree next to dest, then rename it into place unless dest already is it."""
    old = os.lstat(dest) if os.path.lexists(dest) else None
    staging = _sibling_temp_dir(dest)
    try:
        if source_kind == "tree":
            copy_tree(source, staging)
            for name, data in replace.items():
                path = staging / name
                mode = stat.S_IMODE(os.stat(path).st_mode)
                path.unlink()
                path.write_bytes(data)
                os.chmod(path, mode)
        else:
            tarball.extract(source, members, staging, replace)
        if old is not None and same_tree(staging, dest, replace):
            shutil.rmtree(staging)
            return False
        # A replaced directory (a TFTP root) keeps its mode, and as root its owner.
        os.chmod(staging, stat.S_IMODE(old.st_mode) if old else 0o755)
        if old is not None and _can_chown():
            os.chown(staging, old.st_uid, old.st_gid)
        put_tree_in_place(staging, dest)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise Error(f"cannot write {dest}: {exc.strerror or exc}") from None
        raise
    return True


def print_report(report: Report) -> None:
    version = report.version
    print(
        f"installer: {version['installer_build'] or 'unknown build'} "
        f"(Debian {version['debian_version'] or 'unknown version'})"
    )
    target = report.output or report.source
    if report.kept:
        print(f"kept from the earlier run in {report.kept_from}: {' '.join(report.kept)}")
    if report.mode == "check":
        if not report.changes:
            print(f"ok: {report.source} is serialized for {report.settings.console}")
            return
        for change in report.changes:
            print(f"differs: {change.path}: {'; '.join(change.notes)}")
        print(
            f"{len(report.changes)} file(s) not serialized for {report.settings.console}; "
            f"run '{PROG}' without --check to fix them"
        )
        return
    if report.mode == "dry-run":
        print(report.diff(), end="")
        print(
            f"would change {len(report.changes)} file(s)"
            + (f" and write {target}" if report.output else "")
        )
        return
    if report.written:
        for change in report.changes:
            print(f"changed: {change.path}: {'; '.join(change.notes)}")
        print(f"wrote {target} ({report.settings.console})")
    else:
        print(f"nothing to change: {target} is serialized for {report.settings.console}")


def build_parser() -> argparse.ArgumentParser:
    parser = cli.new_parser(
        PROG,
        "Put a Debian installer netboot tree or netboot.tar.gz on a serial console, for BIOS "
        "(pxelinux) and UEFI (shim + GRUB).",
        epilog="exit status: 0 ok, 1 not serialized (--check), 2 error or refused input",
    )
    parser.add_argument(
        "source",
        metavar="SOURCE",
        help="netboot tree (TFTP root) or netboot.tar.gz (or .tar, .tar.xz, .tar.bz2)",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="DEST",
        help="write DEST instead of editing SOURCE: a tarball when it ends in "
        ".tar.gz, .tgz, .tar.xz, .txz, .tar.bz2, .tbz2 or .tar, else a directory tree "
        "(an existing one only when it is empty or holds nothing the new tree lacks)",
    )
    parser.add_argument(
        "-c",
        "--console",
        metavar="DEVICE,BAUD",
        help="serial console: ttyS0..31, ttyAMA0..3, ttyPS0..3, hvc0..7 or ttyUSB0..9 and "
        "a baud rate (default: ttyS0,115200n8; ttyAMA0,115200n8 for arm64)",
    )
    parser.add_argument(
        "--also-vga",
        action=argparse.BooleanOptionalAction,
        help="keep a VGA console too (vga=788 and console=tty0); --no-also-vga drops it",
    )
    parser.add_argument(
        "--extra-args",
        metavar="ARGS",
        help="arguments appended to every kernel command line; those after "
        "a '---' in ARGS also go to the installed system",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        metavar="SECONDS",
        help="boot the default entry after SECONDS (0 or default: wait for a key)",
    )
    parser.add_argument(
        "--default",
        metavar="ENTRY",
        help="entry booted on --timeout: install (default), expert, rescue " "or auto",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--check", action="store_true", help="exit 0 when SOURCE is already serialized, 1 when not"
    )
    group.add_argument(
        "-n", "--dry-run", action="store_true", help="print a unified diff and write nothing"
    )
    parser.add_argument(
        "--sha256sums",
        metavar="FILE",
        help="check the tarball SOURCE against FILE, the installer's SHA256SUMS (lines "
        "'HASH  ./netboot/netboot.tar.gz'), before reading it",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    # debadmin(7) metrics: the runs that write (not --check, not --dry-run).
    parser.set_defaults(metrics=lambda a: not a.check, metrics_command="apply")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    return cli.run(PROG, build_parser(), argv, run)
