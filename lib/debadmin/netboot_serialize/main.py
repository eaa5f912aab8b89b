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
import shlex
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Dict, Iterable, List, Optional, Set, Tuple

from debadmin import cli, fsutil
from debadmin.findings import finding
from debadmin.errors import EXIT_ACTION, EXIT_OK, Error
from debadmin.output import emit_json
from debadmin.netboot_serialize import tar as tarball

PROG = "netboot-serialize"
log = logging.getLogger("debadmin")

# Kernel serial console names this tool accepts: 8250/16550 UARTs (x86, many servers),
# the PL011 of arm64 (ttyAMA), Zynq (ttyPS), hypervisor consoles (hvc) and USB adapters.
CONSOLE = re.compile(
    r"^(ttyS(?:[0-9]|[12][0-9]|3[01])|ttyAMA[0-3]|ttyPS[0-3]|hvc[0-7]|ttyUSB[0-9]),([0-9]+)(n8)?$"
)
# The default console per architecture (the debian-installer/ARCH directory name).
DEFAULT_CONSOLE = {"arm64": "ttyAMA0,115200n8"}
X86_CONSOLE = "ttyS0,115200n8"
# Where GRUB's 'serial --unit=N' has ports to drive (see edit_grub).
SERIAL_UNIT_ARCHES = ("amd64", "i386")
BAUDS = (1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200)
MARKER = "# netboot-serialize:"
# The note of a menu file that differs in its settings comment only.
COMMENT_ONLY = "settings comment"
GRUB_END = "# netboot-serialize: end"
DISABLED = "# disabled by netboot-serialize (no autoboot on a serial console): "
VGA = "vga=788"
# Tokens d-i puts before vga=788 on its kernel command lines (syslinux and GRUB alike).
LEADING = re.compile(r"^(desktop|auto|priority)=")
# --default ENTRY: the syslinux label and the GRUB menu entry (submenus joined by '>').
ENTRIES = {
    "install": ("install", "Install"),
    "expert": ("expert", "Advanced options ...>... Expert install"),
    "rescue": ("rescue", "Advanced options ...>... Rescue mode"),
    "auto": ("auto", "Advanced options ...>... Automated install"),
}
TOP_LEVEL = ("syslinux.cfg", "prompt.cfg")  # files syslinux loads as a whole configuration
# Characters GRUB's script parser takes as syntax on a 'linux' line (grub-script-check
# rejects | & < >; a word starting with '#' comments out the rest, console= included).
UNSAFE = set("{}'\"\\;$|&<>")
AUTOBOOT = re.compile(r"^\s*(timeout|totaltimeout|ontimeout|menu\s+autoboot)\b", re.I)


# --- settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What a serialized tree looks like: the console and the extra kernel arguments."""

    device: str
    baud: int
    also_vga: bool = False
    extra_args: str = ""
    timeout: Optional[int] = None
    default: Optional[str] = None

    @property
    def console(self) -> str:
        return f"{self.device},{self.baud}n8"

    @property
    def port(self) -> Optional[int]:
        """The 8250 port number of ttyS<n> (syslinux's and GRUB's serial unit), else None."""
        match = re.fullmatch(r"ttyS([0-9]+)", self.device)
        return int(match.group(1)) if match else None

    def extra(self) -> Tuple[List[str], List[str]]:
        """Extra arguments before '---' (installer only) and after it (also installed)."""
        words = self.extra_args.split()
        if "---" in words:
            cut = words.index("---")
            return words[:cut], words[cut + 1 :]
        return words, []

    def marker(self, full: bool = False) -> str:
        """The settings comment; full (syslinux.cfg, grub.cfg) adds the timeout choices,
        which a rerun keeps, so that a new timeout rewrites only the files it touches."""
        text = (
            f"{MARKER} console={self.console} also-vga={'yes' if self.also_vga else 'no'}"
            f" extra-args={shlex.quote(self.extra_args)}"
        )
        if full:
            text += f" timeout={self.timeout or 0} default={self.default or 'install'}"
        return text


def parse_console(spec: str) -> Tuple[str, int]:
    match = CONSOLE.match(spec)
    if not match:
        raise Error(
            f"invalid console {spec!r}: expected DEVICE,BAUD[n8] with DEVICE one of "
            "ttyS0..ttyS31, ttyAMA0..3, ttyPS0..3, hvc0..7, ttyUSB0..9 (8N1 only), "
            "e.g. ttyS1,115200n8"
        )
    baud = int(match.group(2))
    if baud not in BAUDS:
        raise Error(
            f"invalid console {spec!r}: baud rate must be one of " f"{', '.join(map(str, BAUDS))}"
        )
    return match.group(1), baud


def parse_extra_args(text: str) -> str:
    words = text.split()
    for word in words:
        if word.startswith("console="):
            raise Error("--extra-args must not set console=; use --console")
        if any(ord(c) < 32 or ord(c) == 127 or c in UNSAFE for c in word) or word.startswith("#"):
            raise Error(
                f"refusing kernel argument {word!r}: quotes, braces, backslashes, "
                "'$ ; | & < >', control characters and a leading '#' do not survive "
                "both boot loaders"
            )
    if words.count("---") > 1:
        raise Error("--extra-args holds '---' more than once")
    return " ".join(words)


def parse_marker(line: str) -> Optional[Settings]:
    """The settings an earlier run recorded in its marker comment, or None."""
    if not line.startswith(MARKER) or line.strip() == GRUB_END:
        return None
    try:
        fields = dict(w.split("=", 1) for w in shlex.split(line[len(MARKER) :]) if "=" in w)
        device, baud = parse_console(fields.get("console", ""))
    except (ValueError, Error):
        return None
    timeout: Optional[int] = None
    if (
        re.fullmatch(r"[0-9]{1,4}", fields.get("timeout", ""))
        and 0 < int(fields["timeout"]) < 3600
    ):
        timeout = int(fields["timeout"])
    default = fields.get("default") if timeout and fields.get("default") in ENTRIES else None
    return Settings(
        device,
        baud,
        fields.get("also-vga") == "yes",
        fields.get("extra-args", ""),
        timeout,
        None if default == "install" else default,
    )


# --- kernel command lines --------------------------------------------------------------------


def _tokens(text: str) -> Tuple[List[List[str]], str]:
    """[[whitespace, word], ...] and the trailing whitespace, so that edits keep spacing."""
    pairs = [[m.group(1), m.group(2)] for m in re.finditer(r"(\s*)(\S+)", text)]
    trailing = text[len("".join(w + t for w, t in pairs)) :]
    return pairs, trailing


def _strip_suffix(pairs: List[List[str]], start: int, end: int, words: List[str]) -> int:
    """Remove words if they are the last ones of pairs[start:end]; return the new end."""
    if (
        words
        and end - start >= len(words)
        and [t for _, t in pairs[end - len(words) : end]] == words
    ):
        del pairs[end - len(words) : end]
        return end - len(words)
    return end


def edit_cmdline(text: str, old: Optional[Settings], new: Settings, has_path: bool) -> str:
    """Undo what old added to a kernel command line, then serialize it for new.

    text is what follows 'append' (syslinux) or 'linux' (GRUB, where the kernel path
    comes first).
    """
    pairs, trailing = _tokens(text)
    first = 1 if has_path and pairs else 0

    def sep() -> int:
        words = [t for _, t in pairs]
        return words.index("---", first) if "---" in words[first:] else len(pairs)

    # Undo: our console= words, the old extra arguments, vga=788 where we removed it.
    cut = sep()
    tail_start = cut + 1 if cut < len(pairs) else first
    pairs[tail_start:] = [p for p in pairs[tail_start:] if not p[1].startswith("console=")]
    if old is not None:
        old_pre, old_post = old.extra()
        cut = sep()
        if cut < len(pairs):
            _strip_suffix(pairs, cut + 1, len(pairs), old_post)
            _strip_suffix(pairs, first, sep(), old_pre)
        else:
            _strip_suffix(pairs, first, len(pairs), old_pre + old_post)
        if not old.also_vga and not any(t.startswith("vga=") for _, t in pairs[first : sep()]):
            at = first
            while at < sep() and LEADING.match(pairs[at][1]):
                at += 1
            pairs.insert(at, [" ", VGA])
    # Apply.
    if not new.also_vga:
        pairs[first : sep()] = [p for p in pairs[first : sep()] if p[1] != VGA]
    pre, post = new.extra()
    consoles = (["console=tty0"] if new.also_vga else []) + [f"console={new.console}"]
    cut = sep()
    pairs[cut:cut] = [[" ", w] for w in pre]
    pairs.extend([" ", w] for w in post + consoles)
    return "".join(w + t for w, t in pairs) + trailing


# --- syslinux ----------------------------------------------------------------------------------


def _split_lines(data: bytes) -> List[str]:
    return data.decode("utf-8", "surrogateescape").splitlines(keepends=True)


def _join_lines(lines: List[str]) -> bytes:
    return "".join(lines).encode("utf-8", "surrogateescape")


def _eol(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :] or "\n"


def _directive(line: str) -> Tuple[str, str, str]:
    """(indent, keyword, rest) of a syslinux or GRUB line; keyword '' for blanks/comments."""
    body = line.rstrip("\r\n")
    match = re.match(r"^(\s*)(\S+)(.*)$", body)
    if not match or match.group(2).startswith("#"):
        return "", "", body
    return match.group(1), match.group(2), match.group(3)


def syslinux_marker(data: bytes) -> Optional[Settings]:
    for line in _split_lines(data):
        settings = parse_marker(line)
        if settings:
            return settings
    return None


def _has_console(lines: List[str]) -> bool:
    return any(
        _directive(ln)[1].lower() == "append" and " console=" in _directive(ln)[2] for ln in lines
    )


def edit_syslinux_included(
    data: bytes, legacy: Optional[Settings], new: Settings
) -> Tuple[bytes, List[str]]:
    """A menu file (txt.cfg, spk.cfg, ...): kernel command lines and autoboot lines.

    A file with kernel lines carries its own marker comment with the settings they were
    serialized for, written in the same rename as they are, so that undoing them never
    depends on another file: an interrupted run leaves each file consistent. A file
    serialized by netboot-serialize 0.1.0 has console= words but no marker of its own;
    then legacy, the marker of syslinux.cfg (written last), says what was applied.
    """
    lines = _split_lines(data)
    own = [parse_marker(ln) for ln in lines if ln.startswith(MARKER)]
    old = next((m for m in own if m), None)
    if old is None and _has_console(lines):
        old = legacy
    lines = [ln for ln in lines if not ln.startswith(MARKER)]
    notes: List[str] = []
    kernel_lines = 0
    has_kernel_lines = False
    for i, line in enumerate(lines):
        indent, keyword, rest = _directive(line)
        if keyword.lower() == "append":
            has_kernel_lines = True
            edited = indent + keyword + edit_cmdline(rest, old, new, False) + _eol(line)
            if edited != line:
                lines[i] = edited
                kernel_lines += 1
        elif keyword and AUTOBOOT.match(line) and not re.match(r"^\s*timeout\s+0\s*$", line):
            lines[i] = DISABLED + line.lstrip()
            notes.append(f"{AUTOBOOT.match(line).group(1)} disabled")
    if has_kernel_lines:
        at = 1 if lines and lines[0].startswith("# D-I config version") else 0
        lines.insert(at, new.marker() + (_eol(lines[0]) if lines else "\n"))
    if kernel_lines:
        notes.insert(0, f"{kernel_lines} kernel command line(s)")
    result = _join_lines(lines)
    if result != data and not notes:
        notes.append(COMMENT_ONLY)
    return result, notes


def labels(files: Dict[str, bytes]) -> Dict[str, Tuple[str, str]]:
    """syslinux label -> (kernel, append arguments) over every menu file."""
    found: Dict[str, Tuple[str, str]] = {}
    for name in sorted(files):
        current = None
        for line in _split_lines(files[name]):
            _, keyword, rest = _directive(line)
            keyword = keyword.lower()
            if keyword == "label":
                current = rest.strip()
                found[current] = ("", "")
            elif current and keyword in ("kernel", "linux"):
                found[current] = (rest.strip(), found[current][1])
            elif current and keyword == "append":
                found[current] = (found[current][0], rest.strip())
    return found


def edit_syslinux_top(
    data: bytes, new: Settings, name: str, menu: Dict[str, Tuple[str, str]]
) -> Tuple[bytes, List[str]]:
    """syslinux.cfg or prompt.cfg: 'serial' as the first directive, timeout, marker."""
    lines = [
        ln
        for ln in _split_lines(data)
        if _directive(ln)[1].lower() != "serial" and not ln.startswith(MARKER)
    ]
    notes: List[str] = []
    if name == "syslinux.cfg":
        kept = []
        for line in lines:
            _, keyword, _ = _directive(line)
            if keyword.lower() == "ontimeout":
                continue
            if keyword.lower() == "timeout":
                line = f"timeout {new.timeout * 10 if new.timeout else 0}" + _eol(line)
                kept.append(line)
                if new.timeout:
                    label = ENTRIES[new.default or "install"][0]
                    kernel, append = menu.get(label, ("", ""))
                    if not kernel:
                        raise Error(
                            f"--default {new.default or 'install'}: no syslinux "
                            f"label {label!r} in this tree"
                        )
                    kept.append(f"ontimeout {kernel} {append}" + _eol(line))
                continue
            kept.append(line)
        if new.timeout and not any(_directive(ln)[1].lower() == "timeout" for ln in kept):
            raise Error("syslinux.cfg has no 'timeout' directive to set")
        lines = kept
    at = 0
    if lines and lines[0].startswith("# D-I config version"):
        at = 1
    eol = _eol(lines[0]) if lines else "\n"
    insert = [f"serial {new.port} {new.baud}{eol}"]
    if name == "syslinux.cfg":
        insert.insert(0, new.marker(full=True) + eol)
    lines[at:at] = insert
    result = _join_lines(lines)
    if result != data:
        notes.append(f"serial {new.port} {new.baud} as the first directive")
        if name == "syslinux.cfg":
            notes.append(
                f"timeout {new.timeout} s, then boot {new.default or 'install'}"
                if new.timeout
                else "no timeout"
            )
    return result, notes


# --- GRUB --------------------------------------------------------------------------------------


def grub_entries(data: bytes) -> List[str]:
    """Titles of every menuentry, submenus joined by '>' as 'set default' wants them."""
    stack: List[Optional[str]] = []
    titles: List[str] = []
    for line in _split_lines(data):
        stripped = line.strip()
        match = re.match(r"^(menuentry|submenu)\b.*?'([^']*)'.*\{$", stripped)
        if match:
            path = [t for t in stack if t is not None] + [match.group(2)]
            if match.group(1) == "menuentry":
                titles.append(">".join(path))
            stack.append(match.group(2))
        elif stripped.endswith("{"):
            stack.append(None)
        elif stripped == "}" and stack:
            stack.pop()
    return titles


def edit_grub(data: bytes, new: Settings, arch: str = "amd64") -> Tuple[bytes, List[str]]:
    """grub.cfg: a serial terminal after the gfxterm block, every 'linux' line serialized."""
    lines = _split_lines(data)
    old = None
    start = next((i for i, ln in enumerate(lines) if parse_marker(ln)), None)
    if start is not None:
        old = parse_marker(lines[start])
        end = next((i for i in range(start, len(lines)) if lines[i].strip() == GRUB_END), None)
        if end is None:
            raise Error("grub.cfg holds a netboot-serialize block without its end line")
        del lines[start : end + 1]
    notes = []
    kernel_lines = 0
    for i, line in enumerate(lines):
        indent, keyword, rest = _directive(line)
        if keyword in ("linux", "linuxefi"):
            edited = indent + keyword + edit_cmdline(rest, old, new, True) + _eol(line)
            if edited != line:
                lines[i] = edited
                kernel_lines += 1
    if kernel_lines:
        notes.append(f"{kernel_lines} kernel command line(s)")
    at = 0
    for i, line in enumerate(lines):
        if re.match(r"^\s*if\s+loadfont\b", line):
            at = next((j + 1 for j in range(i + 1, len(lines)) if lines[j].strip() == "fi"), 0)
            break
    # 'serial --unit=N' names GRUB's port comN, which only x86 builds of GRUB have (its
    # ns8250 driver probes the PC's I/O ports); on arm64 and riscv64 EFI GRUB knows the
    # firmware's serial I/O protocol (efi0) alone, and that is the firmware console's line.
    unit = new.port if arch in SERIAL_UNIT_ARCHES else None
    if unit is not None:
        block = [
            new.marker(full=True),
            f"serial --unit={unit} --speed={new.baud} --word=8 --parity=no --stop=1",
            "terminal_input serial console",
            "terminal_output serial console",
        ]
        what = f"serial terminal on unit {unit} at {new.baud} baud"
    else:
        # A PL011, hypervisor console or (off x86) any serial line is the UEFI console
        # itself on arm64 servers, AAVMF and riscv64 firmware (EDK2, U-Boot's EFI), which
        # SPCR or the device tree points at: the menu goes to the firmware console.
        # 'terminal_output serial console' with efi0 would print every line twice.
        block = [new.marker(full=True), "terminal_input console", "terminal_output console"]
        what = f"firmware console for {new.device}"
    if new.timeout:
        title = ENTRIES[new.default or "install"][1]
        if title not in grub_entries(data):
            raise Error(
                f"--default {new.default or 'install'}: no GRUB menu entry "
                f"{title!r} in grub.cfg"
            )
        block += [f"set timeout={new.timeout}", f'set default="{title}"']
    block.append(GRUB_END)
    lines[at:at] = [ln + "\n" for ln in block]
    result = _join_lines(lines)
    if result != data:
        notes.insert(
            0,
            what + (f", timeout {new.timeout} s" if new.timeout else ""),
        )
    return result, notes


# --- what an earlier run chose ------------------------------------------------------------


def recorded_settings(files: Dict[str, bytes], layout: "Layout") -> Optional[Settings]:
    """The settings an earlier run wrote into this tree (grub.cfg's, else syslinux.cfg's
    settings comment), with the timeout choices; None for a tree never serialized."""
    sources = [layout.grub, layout.arch_dir + "/boot-screens/syslinux.cfg"]
    for name in sources:
        lines = _split_lines(files.get(name or "", b""))
        at = next((i for i, ln in enumerate(lines) if parse_marker(ln)), None)
        if at is None:
            continue
        found = parse_marker(lines[at])
        if found is None or " timeout=" in lines[at]:
            return found
        # Written before the marker held the timeout: read what the run wrote.
        timeout: Optional[int] = None
        default: Optional[str] = None
        if name == layout.grub:
            for line in lines[at:]:
                if line.strip() == GRUB_END:
                    break
                match = re.fullmatch(r"\s*set timeout=([0-9]+)\s*", line)
                if match:
                    timeout = int(match.group(1)) or None
                match = re.fullmatch(r'\s*set default="([^"]*)"\s*', line)
                if match:
                    default = next((k for k, v in ENTRIES.items() if v[1] == match.group(1)), None)
        else:
            ontimeout = ""
            for line in lines:
                _, keyword, rest = _directive(line)
                if keyword.lower() == "timeout" and rest.strip().isdigit():
                    timeout = (int(rest.strip()) + 9) // 10 or None
                elif keyword.lower() == "ontimeout":
                    ontimeout = rest.strip()
            menu = labels({n: files[n] for n in layout.configs if n in files})
            default = next(
                (k for k, v in ENTRIES.items() if " ".join(menu.get(v[0], ("", ""))) == ontimeout),
                None,
            )
        if not timeout or not 1 <= timeout <= 3599:
            timeout, default = None, None
        return Settings(
            found.device,
            found.baud,
            found.also_vga,
            found.extra_args,
            timeout,
            None if default == "install" else default,
        )
    return None


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


def not_a_tree(names: List[str]) -> str:
    """Why names are not one installer netboot tree, saying what to give instead."""
    menus = sorted(
        {
            m.group(1)
            for m in (
                re.fullmatch(
                    r"(.+)/debian-installer/[a-z0-9]+/(?:boot-screens/syslinux|grub/grub)\.cfg",
                    n,
                )
                for n in names
            )
            if m
        }
    )
    if menus:
        where = " and ".join(f"{p}/" for p in menus)
        return (
            f"the netboot {'trees are' if len(menus) > 1 else 'tree is'} in {where} below "
            f"SOURCE, not at its top: give {' or '.join(f'SOURCE/{p}' for p in menus)}"
        )
    bare = sorted(
        {
            m.group(1)
            for m in (
                re.fullmatch(
                    r"(?:.+/)?debian-installer/([a-z0-9]+)/(?:initrd\.gz|.*/initrd\.gz)", n
                )
                for n in names
            )
            if m
        }
    )
    if bare:
        arch = bare[0]
        return (
            f"the {', '.join(bare)} netboot tree has no boot menu (no syslinux or GRUB "
            f"configuration), so there is nothing here to serialize: "
            + NO_MENU.get(arch, NO_MENU_OTHER)
        )
    kernels = sorted(
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


def settings_from(
    args: argparse.Namespace, arch: str = "amd64", recorded: Optional[Settings] = None
) -> Settings:
    """The settings of this run: the options given, and for those not given the choices
    recorded by an earlier run (recorded), else the defaults."""
    return _merge(args, arch, recorded)[0]


def _merge(
    args: argparse.Namespace, arch: str, recorded: Optional[Settings]
) -> Tuple[Settings, List[str]]:
    """(settings, names of the choices kept from recorded)."""
    kept: List[str] = []
    if args.console is not None:
        spec = args.console
    elif recorded is not None:
        spec = recorded.console
        kept.append("console")
    else:
        spec = DEFAULT_CONSOLE.get(arch, X86_CONSOLE)
    device, baud = parse_console(spec)
    if args.timeout is not None and not 0 <= args.timeout <= 3599:
        raise Error("--timeout must be between 1 and 3599 seconds (0: wait for a key)")
    if args.default is not None and args.default not in ENTRIES:
        raise Error(f"--default {args.default!r}: choose one of {', '.join(ENTRIES)}")
    also_vga = args.also_vga
    if also_vga is None:
        also_vga = bool(recorded and recorded.also_vga)
        if recorded is not None and recorded.also_vga:
            kept.append("also_vga")
    extra_args = args.extra_args
    if extra_args is None:
        extra_args = recorded.extra_args if recorded else ""
        if recorded is not None and recorded.extra_args:
            kept.append("extra_args")
    timeout = args.timeout or None
    if args.timeout is None and recorded is not None and recorded.timeout:
        timeout = recorded.timeout
        kept.append("timeout")
    default = args.default
    if default and timeout is None:
        raise Error("--default needs --timeout: it names the entry booted when it expires")
    if default is None and timeout and args.timeout is None and recorded is not None:
        default = recorded.default
        if default:
            kept.append("default")
    settings = Settings(device, baud, also_vga, parse_extra_args(extra_args), timeout, default)
    return settings, kept


KEPT_OPTION = {
    "console": lambda s: f"--console {s.console}",
    "also_vga": lambda s: "--also-vga",
    "extra_args": lambda s: f"--extra-args {shlex.quote(s.extra_args)}",
    "timeout": lambda s: f"--timeout {s.timeout}",
    "default": lambda s: f"--default {s.default}",
}


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
    if dest_kind == "tree" and is_tree:
        # The old directory is replaced whole: only when all it holds is in the new tree.
        old_names = tree_names(dest)
        foreign = sorted(set(old_names) - names)
        if foreign and arch_dir:
            try:
                same = find_layout(old_names, quiet=True).arch_dir == arch_dir
            except Error:
                same = False
            if same:
                foreign = [n for n in foreign if not n.startswith(arch_dir + "/")]
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


def run(args: argparse.Namespace) -> int:
    # Bad options are refused before the source is read.
    if args.console is not None:
        parse_console(args.console)
    _merge(args, "amd64", Settings("ttyS0", 115200, timeout=1))
    source = Path(args.source)
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
    dest = output_path(args.output)
    if dest is not None and dest.resolve() == source.resolve():
        dest = None
    recorded = recorded_settings(files, layout)
    recorded_in = str(source)
    if recorded is None and dest is not None and dest.is_dir() and not dest.is_symlink():
        # A newer download into a TFTP root serialized before keeps the root's choices.
        try:
            dest_layout, dest_files = read_tree(dest)
            recorded = recorded_settings(dest_files, dest_layout)
            recorded_in = str(dest)
        except Error:
            recorded = None
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
        replace = {c.path: c.new for c in changes}
        report.written = write(source, source_kind, dest, dest_kind, members, replace)
    if args.json:
        emit_json(report.as_dict())
    elif getattr(args, "verbosity", 0) >= 0 or mode == "dry-run":
        # -q: the exit status says it all (a dry run's diff is its result, kept).
        print_report(report)
    # A file whose only difference is the settings comment (written by 0.1.0, which
    # kept it in syslinux.cfg alone) boots as asked: not a reason to alarm a monitor.
    if mode == "check" and any(c.notes != [COMMENT_ONLY] for c in changes):
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
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    return cli.run(PROG, build_parser(), argv, run)
