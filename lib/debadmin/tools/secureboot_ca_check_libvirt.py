"""secureboot-ca-check --libvirt: check (and --fix) the NVRAM of every libvirt domain."""

import argparse
import datetime
import errno
import fcntl
import os
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from debadmin.errors import EXIT_ACTION, EXIT_ERROR, EXIT_OK, Error, NotApplicable
from debadmin.output import emit_json
from debadmin.tools import secureboot_ca_check as sbc
from debadmin.tools import secureboot_ca_check_efi as efi
from debadmin.tools import secureboot_ca_check_fix as fix

DOMAIN_DIR = "etc/libvirt/qemu"
RUN_DIR = "run/libvirt/qemu"
SAVE_DIR = "var/lib/libvirt/qemu/save"
MAX_XML = 1 << 20


@dataclass
class Domain:
    name: str
    xml: str
    nvram: Optional[str]
    error: Optional[str] = None  # why the definition could not be read


def parse_xml(path: Path, what: str) -> ElementTree.Element:
    """The XML libvirt wrote: UTF-8, no DTD (libvirt writes none; an internal entity would
    let the file say one thing to a reader and another to libvirt)."""
    blob = efi.read_bounded(path, MAX_XML, what)
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise Error(f"{path}: not UTF-8") from None
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise Error(f"{path}: has a DOCTYPE or an entity declaration, which libvirt never writes")
    try:
        return ElementTree.fromstring(blob)
    except ElementTree.ParseError as exc:
        raise Error(f"{path}: not well-formed XML ({exc})") from None


def nvram_problem(path_text: str) -> Optional[str]:
    """Why an <nvram> path is not one --libvirt reads or writes, or None."""
    if not path_text.startswith("/"):
        return "not an absolute path"
    if ".." in path_text.split("/"):
        return "a path with '..'"
    if path_text.startswith("/usr/"):
        return "a file under /usr (a firmware template, not a VM's own NVRAM)"
    return None


def read_domains(root: Path) -> List[Domain]:
    """The persistent qemu domains libvirt keeps in /etc/libvirt/qemu/*.xml."""
    directory = root / DOMAIN_DIR
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".xml"))
    except FileNotFoundError:
        raise NotApplicable(f"{directory} does not exist: libvirt is not installed") from None
    except OSError as exc:
        raise Error(f"cannot read {directory}: {exc.strerror}") from None
    domains = []
    for file_name in names:
        path = directory / file_name
        # One unreadable definition is that domain's error verdict, not the others'.
        try:
            tree = parse_xml(path, "a domain definition")
        except Error as exc:
            domains.append(Domain(file_name[:-4], str(path), None, str(exc)))
            continue
        if tree.tag != "domain":
            continue
        name = (tree.findtext("name") or file_name[:-4]).strip()
        if not name or "/" in name:
            message = f"{path}: domain name {name!r} is not one libvirt accepts"
            domains.append(Domain(file_name[:-4], str(path), None, message))
            continue
        nvram = tree.find("os/nvram")
        path_text: Optional[str] = None
        if nvram is not None:
            # libvirt < 9: <nvram>PATH</nvram>; 9+ may write <nvram><source file=.../>.
            source = nvram.find("source")
            path_text = (
                source.get("file") if source is not None else (nvram.text or "").strip()
            ) or None
        os_element = tree.find("os")
        if path_text is None and os_element is not None and os_element.get("firmware") == "efi":
            # Firmware autoselection without a chosen file yet: libvirt's default name.
            default = f"/var/lib/libvirt/qemu/nvram/{name}_VARS.fd"
            if (root / default.lstrip("/")).exists():
                path_text = default
        domains.append(Domain(name, str(path), path_text))
    return domains


def domain_running(domain: Domain, root: Path) -> bool:
    """libvirt's view (virsh domstate) when it answers, else its pid file."""
    if root == Path("/") and shutil.which("virsh"):
        try:
            result = subprocess.run(
                ["virsh", "--connect", "qemu:///system", "domstate", "--domain", domain.name],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env={**os.environ, "LC_ALL": "C.UTF-8"},
                timeout=30,
            )
            if result.returncode == 0:
                return result.stdout.strip() not in ("shut off", "crashed")
        except (OSError, subprocess.TimeoutExpired):
            pass
    return (root / RUN_DIR / f"{domain.name}.pid").exists()


def nvram_locked(path: Path) -> bool:
    """Whether a process (a running qemu) holds a lock on the NVRAM file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        # A write lock conflicts with any lock another open file description holds.
        lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        result = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, lock)
        return struct.unpack("hhqqi4x", result)[0] != fcntl.F_UNLCK
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return True
        return False
    finally:
        os.close(fd)


def saved_state(domain: Domain, root: Path) -> Optional[str]:
    """Why the VM's next start resumes saved memory, or None.  The flash contents travel
    with the memory (qemu's pflash): resumed after --fix, qemu writes the saved, unfixed
    store back over the file and the fix is silently gone.  (A snapshot is not such a
    case: reverting to one is meant to bring its NVRAM back.)"""
    if (root / SAVE_DIR / f"{domain.name}.save").exists():
        return "has a managed save image (virsh managedsave)"
    return None


def nvram_path(domain: Domain, root: Path) -> Path:
    return root / domain.nvram.lstrip("/")


def check_domain(domain: Domain, root: Path, now: datetime.datetime) -> dict:
    entry = {"domain": domain.name, "definition": domain.xml, "nvram": domain.nvram}
    if domain.error:
        entry.update({"verdict": "error", "error": domain.error, "exit_status": 2})
        return entry
    if domain.nvram is None:
        entry.update({"verdict": "no-nvram", "exit_status": 3})
        return entry
    problem = nvram_problem(domain.nvram)
    if problem:
        entry.update({"verdict": "error", "error": f"{domain.nvram}: {problem}", "exit_status": 2})
        return entry
    path = nvram_path(domain, root)
    entry["running"] = domain_running(domain, root) or nvram_locked(path)
    entry["saved_state"] = saved_state(domain, root)
    try:
        data = fix.read_nvram(path)
        variables = efi.parse_varstore(data, str(path))
        report = sbc.build_report("varstore", str(path), variables, [], root, now)
    except FileNotFoundError:
        entry.update({"verdict": "error", "error": f"{path}: no such file", "exit_status": 2})
        return entry
    except OSError as exc:
        entry.update(
            {"verdict": "error", "error": f"cannot read {path}: {exc.strerror}", "exit_status": 2}
        )
        return entry
    except Error as exc:
        entry.update({"verdict": "error", "error": str(exc), "exit_status": 2})
        return entry
    entry.update(
        {"verdict": report["verdict"], "exit_status": report["exit_status"], "report": report}
    )
    return entry


def render(entries: List[dict], quiet: bool) -> str:
    out = []
    for entry in entries:
        state = "running" if entry.get("running") else "shut off"
        head = f"domain {entry['domain']} ({state}): "
        if "running" not in entry and entry["verdict"] == "error":
            head = f"domain {entry['domain']}: "  # its state was not looked at
        if entry["verdict"] == "no-nvram":
            out.append(head + "no UEFI NVRAM (BIOS boot or no <nvram> element)")
        elif entry["verdict"] == "error":
            out.append(head + f"error: {entry['error']}")
        else:
            out.append(head + entry["verdict"])
            if not quiet:
                text = sbc.render_text(entry["report"], quiet)
                out += ["    " + line if line else "" for line in text.splitlines()]
        fixed = entry.get("fix")
        if fixed:
            out += ["    " + line for line in fix.render_fix(fixed, entry.get("dry_run", False))]
        if entry.get("skipped"):
            out.append(f"    not fixed: {entry['skipped']}")
    return "\n".join(sbc.printable(line) for line in out) + "\n"


def combined(entries: List[dict]) -> int:
    codes = [e["exit_status"] for e in entries]
    if EXIT_ERROR in codes:
        return EXIT_ERROR
    if EXIT_ACTION in codes:
        return EXIT_ACTION
    if EXIT_OK in codes:
        return EXIT_OK
    return 3


def cmd_libvirt(args: argparse.Namespace) -> int:
    root = Path(args.root or "/")
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    domains = read_domains(root)
    if not domains:
        raise NotApplicable(f"no libvirt domains in {root / DOMAIN_DIR}")
    certs = fix.available_certs(args.cert or [], root) if args.fix else {}
    entries = []
    for domain in domains:
        entry = check_domain(domain, root, now)
        if args.fix and entry["verdict"] == "action-needed":
            if entry["running"]:
                entry["skipped"] = "running: shut it down, then run --fix again"
            elif entry["saved_state"]:
                entry["skipped"] = (
                    f"{entry['saved_state']}: its next start would write the saved store "
                    "back over the change; discard the saved state (virsh "
                    "managedsave-remove) or start and shut it down, then run --fix again"
                )
            else:
                try:
                    entry["fix"] = fix.fix_file(
                        nvram_path(domain, root), certs, dry_run=bool(args.dry_run)
                    )
                    entry["dry_run"] = bool(args.dry_run)
                    if entry["fix"]["written"]:
                        after = check_domain(domain, root, now)
                        for key in ("verdict", "exit_status", "report"):
                            entry[key] = after.get(key)
                except Error as exc:
                    entry["skipped"] = f"refused: {exc}"
                    entry["exit_status"] = EXIT_ERROR
        entries.append(entry)
    status = combined(entries)
    if args.json:
        emit_json({"domains": entries, "exit_status": status})
    else:
        print(render(entries, getattr(args, "verbosity", 0) == -1), end="")
    return status
