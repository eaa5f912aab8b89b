"""netboot-serialize's menu editors: kernel command lines, syslinux menus and grub.cfg,
and the settings an earlier run wrote into them."""

import re
from typing import Dict, List, Optional, Tuple

from debadmin.errors import Error
from debadmin.netboot_serialize.settings import ENTRIES, GRUB_END, MARKER, Settings, parse_marker

# Where GRUB's 'serial --unit=N' has ports to drive (see edit_grub).
SERIAL_UNIT_ARCHES = ("amd64", "i386")
# The note of a menu file that differs in its settings comment only.
COMMENT_ONLY = "settings comment"
DISABLED = "# disabled by netboot-serialize (no autoboot on a serial console): "
VGA = "vga=788"
# Tokens d-i puts before vga=788 on its kernel command lines (syslinux and GRUB alike).
LEADING = re.compile(r"^(desktop|auto|priority)=")
TOP_LEVEL = ("syslinux.cfg", "prompt.cfg")  # files syslinux loads as a whole configuration
AUTOBOOT = re.compile(r"^\s*(timeout|totaltimeout|ontimeout|menu\s+autoboot)\b", re.I)


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


def _separator(pairs: List[List[str]], first: int) -> int:
    """The index of '---' (from first on), else the end of the command line."""
    words = [t for _, t in pairs]
    return words.index("---", first) if "---" in words[first:] else len(pairs)


def _undo_cmdline(pairs: List[List[str]], first: int, old: Optional[Settings]) -> None:
    """Remove our console= words and old's extra arguments, put back vga=788 where old
    removed it."""
    cut = _separator(pairs, first)
    tail_start = cut + 1 if cut < len(pairs) else first
    pairs[tail_start:] = [p for p in pairs[tail_start:] if not p[1].startswith("console=")]
    if old is None:
        return
    old_pre, old_post = old.extra()
    cut = _separator(pairs, first)
    if cut < len(pairs):
        _strip_suffix(pairs, cut + 1, len(pairs), old_post)
        _strip_suffix(pairs, first, _separator(pairs, first), old_pre)
    else:
        _strip_suffix(pairs, first, len(pairs), old_pre + old_post)
    if not old.also_vga and not any(
        t.startswith("vga=") for _, t in pairs[first : _separator(pairs, first)]
    ):
        at = first
        while at < _separator(pairs, first) and LEADING.match(pairs[at][1]):
            at += 1
        pairs.insert(at, [" ", VGA])


def _apply_cmdline(pairs: List[List[str]], first: int, new: Settings) -> None:
    """Drop vga=788 unless new keeps VGA, add new's extra arguments and consoles."""
    if not new.also_vga:
        cut = _separator(pairs, first)
        pairs[first:cut] = [p for p in pairs[first:cut] if p[1] != VGA]
    pre, post = new.extra()
    consoles = (["console=tty0"] if new.also_vga else []) + [f"console={new.console}"]
    cut = _separator(pairs, first)
    pairs[cut:cut] = [[" ", w] for w in pre]
    pairs.extend([" ", w] for w in post + consoles)


def edit_cmdline(text: str, old: Optional[Settings], new: Settings, has_path: bool) -> str:
    """Undo what old added to a kernel command line, then serialize it for new.

    text is what follows 'append' (syslinux) or 'linux' (GRUB, where the kernel path
    comes first).
    """
    pairs, trailing = _tokens(text)
    first = 1 if has_path and pairs else 0
    _undo_cmdline(pairs, first, old)
    _apply_cmdline(pairs, first, new)
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


def _included_old(lines: List[str], legacy: Optional[Settings]) -> Optional[Settings]:
    """What a menu file's kernel lines were serialized for: its own marker, else (0.1.0
    wrote none) legacy where it has console= words."""
    own = [parse_marker(ln) for ln in lines if ln.startswith(MARKER)]
    old = next((m for m in own if m), None)
    if old is None and _has_console(lines):
        old = legacy
    return old


def _disables_autoboot(line: str, keyword: str) -> bool:
    """An autoboot line of a menu file, which a serial console must not have ('timeout 0'
    waits for a key and stays)."""
    return bool(keyword and AUTOBOOT.match(line) and not re.match(r"^\s*timeout\s+0\s*$", line))


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
    old = _included_old(lines, legacy)
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
        elif _disables_autoboot(line, keyword):
            lines[i] = DISABLED + line.lstrip()
            notes.append(f"{AUTOBOOT.match(line).group(1)} disabled")
    if has_kernel_lines:
        _insert_after_version(lines, [new.marker() + (_eol(lines[0]) if lines else "\n")])
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


def _insert_after_version(lines: List[str], insert: List[str]) -> None:
    """Insert lines at the top of a syslinux file, below d-i's config version comment."""
    at = 1 if lines and lines[0].startswith("# D-I config version") else 0
    lines[at:at] = insert


def _syslinux_timeout(
    lines: List[str], new: Settings, menu: Dict[str, Tuple[str, str]]
) -> List[str]:
    """syslinux.cfg's lines with new's timeout, and with new's timeout an 'ontimeout'
    booting the --default entry's kernel line."""
    kept = []
    for line in lines:
        keyword = _directive(line)[1].lower()
        if keyword == "ontimeout":
            continue
        if keyword != "timeout":
            kept.append(line)
            continue
        kept.append(f"timeout {new.timeout * 10 if new.timeout else 0}" + _eol(line))
        if new.timeout:
            label = ENTRIES[new.default or "install"][0]
            kernel, append = menu.get(label, ("", ""))
            if not kernel:
                raise Error(
                    f"--default {new.default or 'install'}: no syslinux "
                    f"label {label!r} in this tree"
                )
            kept.append(f"ontimeout {kernel} {append}" + _eol(line))
    if new.timeout and not any(_directive(ln)[1].lower() == "timeout" for ln in kept):
        raise Error("syslinux.cfg has no 'timeout' directive to set")
    return kept


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
        lines = _syslinux_timeout(lines, new, menu)
    eol = _eol(lines[0]) if lines else "\n"
    insert = [f"serial {new.port} {new.baud}{eol}"]
    if name == "syslinux.cfg":
        insert.insert(0, new.marker(full=True) + eol)
    _insert_after_version(lines, insert)
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


def _remove_grub_block(lines: List[str]) -> Optional[Settings]:
    """Remove an earlier run's block from grub.cfg's lines; the settings it recorded."""
    start = next((i for i, ln in enumerate(lines) if parse_marker(ln)), None)
    if start is None:
        return None
    old = parse_marker(lines[start])
    end = next((i for i in range(start, len(lines)) if lines[i].strip() == GRUB_END), None)
    if end is None:
        raise Error("grub.cfg holds a netboot-serialize block without its end line")
    del lines[start : end + 1]
    return old


def _after_gfxterm(lines: List[str]) -> int:
    """Where our block goes: after the 'if loadfont ... fi' block, else at the top."""
    for i, line in enumerate(lines):
        if re.match(r"^\s*if\s+loadfont\b", line):
            return next((j + 1 for j in range(i + 1, len(lines)) if lines[j].strip() == "fi"), 0)
    return 0


def _grub_terminal(new: Settings, arch: str) -> Tuple[List[str], str]:
    """The terminal lines of our block and what they do, in words."""
    # 'serial --unit=N' names GRUB's port comN, which only x86 builds of GRUB have (its
    # ns8250 driver probes the PC's I/O ports); on arm64 and riscv64 EFI GRUB knows the
    # firmware's serial I/O protocol (efi0) alone, and that is the firmware console's line.
    unit = new.port if arch in SERIAL_UNIT_ARCHES else None
    if unit is not None:
        return [
            f"serial --unit={unit} --speed={new.baud} --word=8 --parity=no --stop=1",
            "terminal_input serial console",
            "terminal_output serial console",
        ], f"serial terminal on unit {unit} at {new.baud} baud"
    # A PL011, hypervisor console or (off x86) any serial line is the UEFI console
    # itself on arm64 servers, AAVMF and riscv64 firmware (EDK2, U-Boot's EFI), which
    # SPCR or the device tree points at: the menu goes to the firmware console.
    # 'terminal_output serial console' with efi0 would print every line twice.
    return ["terminal_input console", "terminal_output console"], (
        f"firmware console for {new.device}"
    )


def _grub_timeout(data: bytes, new: Settings) -> List[str]:
    """The timeout lines of our block: none without a timeout."""
    if not new.timeout:
        return []
    title = ENTRIES[new.default or "install"][1]
    if title not in grub_entries(data):
        raise Error(
            f"--default {new.default or 'install'}: no GRUB menu entry " f"{title!r} in grub.cfg"
        )
    return [f"set timeout={new.timeout}", f'set default="{title}"']


def edit_grub(data: bytes, new: Settings, arch: str = "amd64") -> Tuple[bytes, List[str]]:
    """grub.cfg: a serial terminal after the gfxterm block, every 'linux' line serialized."""
    lines = _split_lines(data)
    old = _remove_grub_block(lines)
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
    at = _after_gfxterm(lines)
    terminal, what = _grub_terminal(new, arch)
    block = [new.marker(full=True)] + terminal + _grub_timeout(data, new) + [GRUB_END]
    lines[at:at] = [ln + "\n" for ln in block]
    result = _join_lines(lines)
    if result != data:
        notes.insert(
            0,
            what + (f", timeout {new.timeout} s" if new.timeout else ""),
        )
    return result, notes


# --- what an earlier run chose ------------------------------------------------------------


def _grub_recorded_timeout(lines: List[str]) -> Tuple[Optional[int], Optional[str]]:
    """(timeout, default) as an earlier run's grub.cfg block (lines from its marker on) set."""
    timeout: Optional[int] = None
    default: Optional[str] = None
    for line in lines:
        if line.strip() == GRUB_END:
            break
        match = re.fullmatch(r"\s*set timeout=([0-9]+)\s*", line)
        if match:
            timeout = int(match.group(1)) or None
        match = re.fullmatch(r'\s*set default="([^"]*)"\s*', line)
        if match:
            default = next((k for k, v in ENTRIES.items() if v[1] == match.group(1)), None)
    return timeout, default


def _syslinux_recorded_timeout(
    lines: List[str], menu: Dict[str, Tuple[str, str]]
) -> Tuple[Optional[int], Optional[str]]:
    """(timeout, default) as syslinux.cfg's 'timeout' and 'ontimeout' (one of menu's
    kernel lines) set them."""
    timeout: Optional[int] = None
    ontimeout = ""
    for line in lines:
        _, keyword, rest = _directive(line)
        if keyword.lower() == "timeout" and rest.strip().isdigit():
            timeout = (int(rest.strip()) + 9) // 10 or None
        elif keyword.lower() == "ontimeout":
            ontimeout = rest.strip()
    default = next(
        (k for k, v in ENTRIES.items() if " ".join(menu.get(v[0], ("", ""))) == ontimeout),
        None,
    )
    return timeout, default


def recorded_settings(files: Dict[str, bytes], layout) -> Optional[Settings]:
    """The settings an earlier run wrote into this tree (grub.cfg's, else syslinux.cfg's
    settings comment), with the timeout choices; None for a tree never serialized.
    layout is the tree's Layout (its arch_dir, configs and grub)."""
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
        if name == layout.grub:
            timeout, default = _grub_recorded_timeout(lines[at:])
        else:
            menu = labels({n: files[n] for n in layout.configs if n in files})
            timeout, default = _syslinux_recorded_timeout(lines, menu)
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
