"""netboot-serialize's settings: the console and kernel arguments of a run, as the options
give them, as an earlier run recorded them in its settings comment, and merged."""

import argparse
import re
import shlex
from dataclasses import dataclass
from typing import List, Optional, Tuple

from debadmin.errors import Error

# Kernel serial console names this tool accepts: 8250/16550 UARTs (x86, many servers),
# the PL011 of arm64 (ttyAMA), Zynq (ttyPS), hypervisor consoles (hvc) and USB adapters.
CONSOLE = re.compile(
    r"^(ttyS(?:[0-9]|[12][0-9]|3[01])|ttyAMA[0-3]|ttyPS[0-3]|hvc[0-7]|ttyUSB[0-9]),([0-9]+)(n8)?$"
)
# The default console per architecture (the debian-installer/ARCH directory name).
DEFAULT_CONSOLE = {"arm64": "ttyAMA0,115200n8"}
X86_CONSOLE = "ttyS0,115200n8"
BAUDS = (1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200)
MARKER = "# netboot-serialize:"
GRUB_END = "# netboot-serialize: end"
# --default ENTRY: the syslinux label and the GRUB menu entry (submenus joined by '>').
ENTRIES = {
    "install": ("install", "Install"),
    "expert": ("expert", "Advanced options ...>... Expert install"),
    "rescue": ("rescue", "Advanced options ...>... Rescue mode"),
    "auto": ("auto", "Advanced options ...>... Automated install"),
}
# Characters GRUB's script parser takes as syntax on a 'linux' line (grub-script-check
# rejects | & < >; a word starting with '#' comments out the rest, console= included).
UNSAFE = set("{}'\"\\;$|&<>")


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


# --- this run's settings ---------------------------------------------------------------------


def settings_from(
    args: argparse.Namespace, arch: str = "amd64", recorded: Optional[Settings] = None
) -> Settings:
    """The settings of this run: the options given, and for those not given the choices
    recorded by an earlier run (recorded), else the defaults."""
    return _merge(args, arch, recorded)[0]


def _given_or_recorded(given, recorded_value, default, name: str, kept: List[str]):
    """An option's value: as given, else as recorded (named in kept), else the default."""
    if given is not None:
        return given
    if recorded_value:
        kept.append(name)
        return recorded_value
    return default


def _check_timeout_options(args: argparse.Namespace) -> None:
    if args.timeout is not None and not 0 <= args.timeout <= 3599:
        raise Error("--timeout must be between 1 and 3599 seconds (0: wait for a key)")
    if args.default is not None and args.default not in ENTRIES:
        raise Error(f"--default {args.default!r}: choose one of {', '.join(ENTRIES)}")


def _merge(
    args: argparse.Namespace, arch: str, recorded: Optional[Settings]
) -> Tuple[Settings, List[str]]:
    """(settings, names of the choices kept from recorded)."""
    kept: List[str] = []
    spec = _given_or_recorded(
        args.console,
        recorded and recorded.console,
        DEFAULT_CONSOLE.get(arch, X86_CONSOLE),
        "console",
        kept,
    )
    device, baud = parse_console(spec)
    _check_timeout_options(args)
    also_vga = _given_or_recorded(
        args.also_vga, recorded and recorded.also_vga, False, "also_vga", kept
    )
    extra_args = _given_or_recorded(
        args.extra_args, recorded and recorded.extra_args, "", "extra_args", kept
    )
    timeout = (
        _given_or_recorded(args.timeout, recorded and recorded.timeout, None, "timeout", kept)
        or None
    )
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
