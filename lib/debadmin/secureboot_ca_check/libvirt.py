"""secureboot-ca-check --libvirt: check (and --fix) the NVRAM of every libvirt domain."""

import argparse
import datetime
import errno
import fcntl
import fnmatch
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from debadmin.errors import (
    EXIT_ACTION,
    EXIT_ERROR,
    EXIT_NOT_APPLICABLE,
    EXIT_OK,
    Error,
    NotApplicable,
)
from debadmin.output import emit_json
from debadmin.secureboot_ca_check import PROG, checks
from debadmin.secureboot_ca_check import efi
from debadmin.secureboot_ca_check import fix
from debadmin.secureboot_ca_check import payloads

DOMAIN_DIR = "etc/libvirt/qemu"
RUN_DIR = "run/libvirt/qemu"
SAVE_DIR = "var/lib/libvirt/qemu/save"
NVRAM_DIR = "/var/lib/libvirt/qemu/nvram"
# Where libvirt (privileged) finds firmware descriptors: a file in /etc replaces the one of
# the same name in /usr/share, an empty one hides it; taken in the order of their names.
DESCRIPTOR_DIRS = ("usr/share/qemu/firmware", "etc/qemu/firmware")
MAX_XML = 1 << 20
MAX_DESCRIPTOR = 1 << 16
CONNECT = "qemu:///system"
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass
class Domain:
    name: str
    xml: str  # where the definition came from: a file, or "virsh dumpxml UUID"
    nvram: Optional[str]
    error: Optional[str] = None  # why the definition could not be read
    template: Optional[str] = None  # <nvram template=...>
    os_element: Optional[ElementTree.Element] = None  # for the firmware selection
    nvram_format: Optional[str] = None
    state: Optional[str] = None  # libvirt's: "running" or "shut off"; None when read from files
    transient: bool = False
    managed_save: bool = False
    pm: Tuple[bool, bool] = (False, False)  # <pm> suspend-to-mem, suspend-to-disk enabled
    no_nvram: Optional[str] = None  # why a UEFI domain has no NVRAM file at all


def check_xml_text(blob: bytes, where: str) -> ElementTree.Element:
    """The XML libvirt wrote: UTF-8, no DTD (libvirt writes none; an internal entity would
    let the file say one thing to a reader and another to libvirt)."""
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise Error(f"{where}: not UTF-8") from None
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise Error(f"{where}: has a DOCTYPE or an entity declaration, which libvirt never writes")
    try:
        return ElementTree.fromstring(blob)
    except ElementTree.ParseError as exc:
        raise Error(f"{where}: not well-formed XML ({exc})") from None


def parse_xml(path: Path, what: str) -> ElementTree.Element:
    return check_xml_text(efi.read_bounded(path, MAX_XML, what), str(path))


def nvram_problem(path_text: str) -> Optional[str]:
    """Why an <nvram> path is not one --libvirt reads or writes, or None."""
    if not path_text.startswith("/"):
        return "not an absolute path"
    if ".." in path_text.split("/"):
        return "a path with '..'"
    if path_text.startswith("/usr/"):
        return "a file under /usr (a firmware template, not a VM's own NVRAM)"
    return None


def template_problem(path_text: str) -> Optional[str]:
    if not path_text.startswith("/"):
        return "not an absolute path"
    if ".." in path_text.split("/"):
        return "a path with '..'"
    return None


def stateless_reason(loader: Optional[ElementTree.Element]) -> Optional[str]:
    """Why a loader never has an NVRAM file (libvirt: a stateless loader, or one loaded
    as a ROM), or None."""
    if loader is None:
        return None
    if loader.get("stateless") == "yes":
        what = "stateless firmware (<loader stateless='yes'>)"
    elif loader.get("type") == "rom":
        what = "firmware loaded as a ROM (<loader type='rom'>)"
    else:
        return None
    return (
        f"{what}: no NVRAM file, the VM keeps no variables between boots; its keys are "
        "the firmware image's own, which --fix does not change"
    )


def parse_domain(tree: ElementTree.Element, where: str, fallback: str) -> Optional[Domain]:
    """A Domain from a <domain> element (a file in /etc/libvirt/qemu or virsh dumpxml)."""
    if tree.tag != "domain":
        return None
    name = (tree.findtext("name") or fallback).strip()
    if not name or "/" in name:
        message = f"{where}: domain name {name!r} is not one libvirt accepts"
        return Domain(fallback, where, None, message)
    os_element = tree.find("os")
    path_text, template, nvram_format = nvram_element(tree.find("os/nvram"))
    loader = tree.find("os/loader")
    no_nvram = stateless_reason(loader)
    if no_nvram:
        path_text = None  # libvirt gives such a loader no NVRAM (and refuses one named)
    elif path_text is None and uses_pflash(os_element, loader):
        # No file chosen yet: the one libvirt names NVRAM_DIR/NAME_VARS.fd at the first start.
        path_text = f"{NVRAM_DIR}/{name}_VARS.fd"
    pm = tuple(
        tree.find(f"pm/{kind}") is not None and tree.find(f"pm/{kind}").get("enabled") == "yes"
        for kind in ("suspend-to-mem", "suspend-to-disk")
    )
    return Domain(
        name,
        where,
        path_text,
        None,
        template,
        os_element,
        nvram_format,
        pm=pm,
        no_nvram=no_nvram,
    )


def nvram_element(
    nvram: Optional[ElementTree.Element],
) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(path, template, format) of an <nvram> element, each None where it says nothing."""
    if nvram is None:
        return None, None, None
    # libvirt < 9: <nvram>PATH</nvram>; 9+ may write <nvram><source file=.../>.
    source = nvram.find("source")
    path_text = (source.get("file") if source is not None else (nvram.text or "").strip()) or None
    return path_text, nvram.get("template") or None, nvram.get("format") or None


def uses_pflash(
    os_element: Optional[ElementTree.Element], loader: Optional[ElementTree.Element]
) -> bool:
    """The domain boots UEFI from flash: firmware='efi', or a read-only pflash loader."""
    if os_element is None:
        return False
    if os_element.get("firmware") == "efi":
        return True
    return (
        loader is not None
        and loader.get("type") == "pflash"
        and loader.get("readonly") == "yes"
        and bool((loader.text or "").strip())
    )


def domains_from_files(root: Path) -> List[Domain]:
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
        domain = parse_domain(tree, str(path), file_name[:-4])
        if domain is not None:
            domains.append(domain)
    return domains


def virsh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["virsh", "--connect", CONNECT, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
        timeout=60,
    )


def virsh_uuids(*flags: str) -> List[str]:
    result = virsh("list", "--uuid", *flags)
    if result.returncode:
        message = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise Error(message[0] if message else f"virsh exited {result.returncode}")
    lines = result.stdout.decode("utf-8", "replace").split()
    bad = [line for line in lines if not UUID_RE.match(line)]
    if bad:
        raise Error(f"virsh list printed {bad[0][:60]!r}, not a UUID")
    return lines


def still_listed(domain_uuid: str) -> Optional[bool]:
    """Whether libvirt still lists the domain; None when it cannot be asked."""
    try:
        return domain_uuid in virsh_uuids("--all")
    except (Error, OSError, subprocess.TimeoutExpired):
        return None


def domain_name(domain_uuid: str) -> Optional[str]:
    """The domain's name (virsh domname), for an entry whose definition was not read."""
    try:
        result = virsh("domname", domain_uuid)
    except (OSError, subprocess.TimeoutExpired):
        return None
    name = result.stdout.decode("utf-8", "replace").strip()
    return name if not result.returncode and name and "\n" not in name else None


def domains_from_libvirt() -> Tuple[List[Domain], List[str]]:
    """Every qemu:///system domain, transient ones too, as libvirt itself describes them
    (virsh dumpxml: the running definition of a running domain), and the UUIDs of those
    that went away while they were read. Error when libvirt cannot be asked."""
    every = virsh_uuids("--all")
    off = set(virsh_uuids("--all", "--state-shutoff"))
    transient = set(virsh_uuids("--all", "--transient"))
    saved = set(virsh_uuids("--all", "--with-managed-save"))
    domains, gone = [], []
    for domain_uuid in every:
        where = f"virsh dumpxml {domain_uuid}"
        result = virsh("dumpxml", domain_uuid)
        error = None
        if result.returncode:
            # virsh says only "error: failed to get domain 'UUID'" for a domain undefined
            # meanwhile (virshLookupDomainInternal resets libvirt's error): asked again.
            if still_listed(domain_uuid) is False:
                gone.append(domain_uuid)  # a transient one that stopped
                continue
            message = result.stderr.decode("utf-8", "replace").strip().splitlines()
            error = f"{where}: {message[0] if message else result.returncode}"
        elif len(result.stdout) > MAX_XML:
            error = f"{where}: larger than 1 MiB"
        else:
            try:
                domain = parse_domain(check_xml_text(result.stdout, where), where, domain_uuid)
            except Error as exc:
                error = str(exc)
            else:
                if domain is None:
                    continue
        if error is not None:
            domain = Domain(domain_name(domain_uuid) or domain_uuid, where, None, error)
        domain.state = "shut off" if domain_uuid in off else "running"
        domain.transient = domain_uuid in transient
        domain.managed_save = domain_uuid in saved
        domains.append(domain)
    return sorted(domains, key=lambda d: d.name), gone


def read_domains(root: Path) -> Tuple[List[Domain], dict]:
    """The domains, and where they came from: libvirt when it answers (on the host itself),
    else its persistent definitions in /etc/libvirt/qemu, saying why."""
    files = str(root / DOMAIN_DIR) + "/*.xml"
    if root != Path("/"):
        why = "--root names another tree"
    elif not shutil.which("virsh"):
        why = "virsh is not installed (libvirt-clients)"
    else:
        try:
            domains, gone = domains_from_libvirt()
            note = None
            if gone:
                note = (
                    f"not checked, gone while they were read (transient domains that "
                    f"stopped): {', '.join(gone)}"
                )
            return domains, {"source": "libvirt", "connect": CONNECT, "note": note}
        except subprocess.TimeoutExpired:
            why = "virsh did not answer within 60 s"
        except OSError as exc:
            why = f"cannot run virsh: {exc.strerror}"
        except Error as exc:
            why = f"libvirt is not reachable ({exc})"
    note = f"{why}: read {files}, where transient domains are not seen"
    return domains_from_files(root), {"source": "files", "connect": None, "note": note}


# --- the template libvirt copies to a domain's NVRAM at its first start ----------------------


def read_descriptor(path: Path) -> Optional[dict]:
    try:
        blob = efi.read_bounded(path, MAX_DESCRIPTOR, "a firmware descriptor")
        document = json.loads(blob)
    except (Error, ValueError):
        return None
    return document if isinstance(document, dict) else None


def descriptors(root: Path) -> List[Tuple[str, Optional[dict]]]:
    """(path, document) of each descriptor libvirt reads, in its order; None for one it
    cannot parse."""
    chosen: Dict[str, Path] = {}
    for directory in DESCRIPTOR_DIRS:
        try:
            names = os.listdir(root / directory)
        except OSError:
            continue
        for name in names:
            if name.endswith(".json"):
                chosen[name] = root / directory / name
    out = []
    for name in sorted(chosen):
        shown = "/" + str(chosen[name].relative_to(root))
        try:
            path = in_root(root, shown)
            if path.stat().st_size == 0:
                continue  # masked (an empty file, or a link to /dev/null)
        except (OSError, Error):
            continue
        out.append((shown, read_descriptor(path)))
    return out


def tristate(element: Optional[ElementTree.Element], name: str) -> Optional[bool]:
    if element is None:
        return None
    for feature in element.findall("firmware/feature"):
        if feature.get("name") == name:
            return feature.get("enabled") == "yes"
    return None


def descriptor_matches(document: dict, os_element: ElementTree.Element, pm) -> bool:
    """libvirt's qemuFirmwareMatchDomain, for what decides a UEFI flash template: the
    flash mapping and its loader, the architecture and machine, the features."""
    if stateless_reason(os_element.find("loader")):
        # libvirt matches these to a 'stateless' flash or a 'memory' descriptor only:
        # neither has an NVRAM template.
        return False
    template = split_flash_template(document, os_element)
    return (
        template is not None
        and "uefi" in (document.get("interface-types") or [])
        and target_matches(document, os_element)
        and features_match(document, os_element, pm)
        and template.get("format", "raw") == "raw"
        and isinstance(template.get("filename"), str)
    )


def split_flash_template(document: dict, os_element: ElementTree.Element) -> Optional[dict]:
    """The nvram-template of a descriptor's split flash mapping, when the domain may use
    that mapping (a legacy domain names its loader: matched by file name); else None."""
    mapping = document.get("mapping")
    if not isinstance(mapping, dict) or mapping.get("device") != "flash":
        return None
    if mapping.get("mode", "split") != "split":
        return None
    executable = mapping.get("executable") or {}
    template = mapping.get("nvram-template") or {}
    if not isinstance(executable, dict) or not isinstance(template, dict):
        return None
    if os_element.get("firmware") != "efi":
        loader = os_element.find("loader")
        if loader is None or executable.get("filename") != (loader.text or "").strip():
            return None
    return template


def target_matches(document: dict, os_element: ElementTree.Element) -> bool:
    """One of the descriptor's targets has the domain's architecture and a machine glob
    that its machine type fits."""
    type_element = os_element.find("type")
    arch = type_element.get("arch") if type_element is not None else None
    machine = type_element.get("machine") if type_element is not None else None
    if not machine:
        return False
    for target in document.get("targets") or []:
        if not isinstance(target, dict) or target.get("architecture") != arch:
            continue
        globs = [glob for glob in target.get("machines") or [] if isinstance(glob, str)]
        if any(fnmatch.fnmatchcase(machine, glob) for glob in globs):
            return True
    return False


def features_match(document: dict, os_element: ElementTree.Element, pm) -> bool:
    """The features the domain asks for (or refuses) are the descriptor's: Secure Boot,
    enrolled keys, SMM for a secure loader, ACPI S3 and S4 for enabled suspend."""
    features = set(f for f in document.get("features") or [] if isinstance(f, str))
    for name in ("secure-boot", "enrolled-keys"):
        wanted = tristate(os_element, name)
        if wanted is not None and wanted != (name in features):
            return False
    loader = os_element.find("loader")
    if loader is not None and loader.get("secure") == "yes" and "requires-smm" not in features:
        return False
    suspend_to_mem, suspend_to_disk = pm
    return not (suspend_to_mem and "acpi-s3" not in features) and not (
        suspend_to_disk and "acpi-s4" not in features
    )


def qemu_conf_templates(root: Path) -> Dict[str, str]:
    """qemu.conf's nvram = [ "LOADER:TEMPLATE", ... ] (libvirt's fallback for a loader
    that no descriptor names)."""
    try:
        text = efi.read_bounded(root / "etc/libvirt/qemu.conf", MAX_XML, "qemu.conf").decode(
            "utf-8", "replace"
        )
    except Error:
        return {}
    lines = [line.split("#", 1)[0] for line in text.splitlines()]
    match = re.search(r"^\s*nvram\s*=\s*\[(.*?)\]", "\n".join(lines), re.S | re.M)
    pairs = {}
    for item in re.findall(r'"([^"]*)"', match.group(1) if match else ""):
        loader, _, template = item.partition(":")
        if loader and template:
            pairs[loader] = template
    return pairs


def select_template(domain: Domain, root: Path) -> Tuple[Optional[str], str]:
    """The template libvirt would copy to the NVRAM of a domain that has none yet, and
    how it was found (the domain's <nvram template=>, a descriptor, qemu.conf)."""
    if domain.template:
        return domain.template, "the domain definition"
    os_element = domain.os_element
    if os_element is None:
        return None, "no <os> element"
    found = descriptors(root)
    for path, document in found:
        if document is None:
            # libvirt parses them all first and then selects no firmware at all.
            return None, f"{path} is not a firmware descriptor libvirt can read"
    for path, document in found:
        if descriptor_matches(document, os_element, domain.pm):
            return document["mapping"]["nvram-template"]["filename"], path
    loader = os_element.find("loader")
    if os_element.get("firmware") != "efi" and loader is not None:
        template = qemu_conf_templates(root).get((loader.text or "").strip())
        if template:
            return template, "/etc/libvirt/qemu.conf (nvram)"
    return None, "no firmware descriptor in /usr/share/qemu/firmware matches the domain"


def domain_running(domain: Domain, root: Path) -> bool:
    """libvirt's view when the domain came from libvirt, else libvirt's pid file."""
    if domain.state is not None:
        return domain.state != "shut off"
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
    if domain.managed_save or (root / SAVE_DIR / f"{domain.name}.save").exists():
        return "has a managed save image (virsh managedsave)"
    return None


def in_root(root: Path, path_text: str) -> Path:
    """path_text (absolute) inside root with its symbolic links resolved as a chroot
    would: an absolute target starts again at root, '..' stops there. Debian's
    /usr/share/OVMF and /usr/share/AAVMF hold such links; followed as they are, one in
    another tree would open this host's file. Without --root, the path itself."""
    if root == Path("/"):
        return Path(path_text)
    parts = [p for p in path_text.split("/") if p]
    resolved: List[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        try:
            target = os.readlink(root.joinpath(*resolved, part))
        except OSError:  # not a link, or nothing there: taken as it is
            resolved.append(part)
            continue
        links += 1
        if links > 40:
            raise Error(f"{path_text}: too many levels of symbolic links under {root}")
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p] + parts
    return root.joinpath(*resolved)


def nvram_path(domain: Domain, root: Path) -> Path:
    """The NVRAM file under root: its directory resolved inside root, the file itself not
    (--fix refuses a symbolic link there)."""
    path_text = domain.nvram.rstrip("/")
    parent, _, name = path_text.rpartition("/")
    return in_root(root, parent or "/") / name


# Pauses between reads of a running VM's NVRAM that did not agree: the firmware writes
# its variables in bursts (at boot, at an update), so a pause lets one end (3.1 s in all).
RUNNING_PAUSES = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


def read_running(path: Path) -> bytes:
    """The store of a running VM's NVRAM, read without taking its lock: qemu may write
    to the file while it is read, so it is read until two reads in a row agree, with
    longer pauses between them while they do not (a loaded host's guest may take a
    while to finish a burst of writes)."""
    import time

    previous = fix.read_nvram(path)
    for pause in RUNNING_PAUSES:
        if pause:
            time.sleep(pause)
        data = fix.read_nvram(path)
        if data == previous:
            return data
        previous = data
    raise Error(f"{path}: changed between reads while the VM runs; check it again later")


def error_entry(entry: dict, message: str) -> dict:
    entry.update({"verdict": "error", "error": message, "exit_status": 2})
    return entry


def check_template(domain: Domain, entry: dict, root: Path, now: datetime.datetime) -> dict:
    """A domain that was never started has no NVRAM yet: its first start copies a
    template, so the verdict is that template's."""
    template, found_in = select_template(domain, root)
    entry.update({"nvram_exists": False, "template": template, "template_from": found_in})
    if template is None:
        return error_entry(entry, f"{domain.nvram}: no such file, and no template ({found_in})")
    problem = template_problem(template)
    if problem:
        return error_entry(entry, f"template {template}: {problem}")

    def read() -> Tuple[Path, bytes]:
        path = in_root(root, template)
        return path, fix.read_nvram(path)

    gone = f"template {in_root_shown(root, template)}"
    return judge_store(entry, read, gone, f"template {template}", root, now)


def in_root_shown(root: Path, path_text: str) -> str:
    """in_root's answer as an error message names it, or the text where it has none."""
    try:
        return str(in_root(root, path_text))
    except Error:
        return path_text


def judge_store(
    entry: dict,
    read: Callable[[], Tuple[Path, bytes]],
    gone: str,
    label: str,
    root: Path,
    now: datetime.datetime,
) -> dict:
    """entry with the verdict on the store read() returns (the path the report names and
    the bytes), or with an error verdict naming gone (no such file) or label (any other
    reason) where it cannot be read."""
    try:
        path, data = read()
        report = store_report(path, data, root, now)
    except FileNotFoundError:
        return error_entry(entry, f"{gone}: no such file")
    except OSError as exc:
        return error_entry(entry, f"cannot read {label}: {exc.strerror}")
    except payloads.PayloadError:
        raise  # the package's objects, not this domain's store: exit 2
    except Error as exc:
        return error_entry(entry, str(exc))
    entry.update(
        {"verdict": report["verdict"], "exit_status": report["exit_status"], "report": report}
    )
    return entry


def store_report(path: Path, data: bytes, root: Path, now: datetime.datetime) -> dict:
    """The report on a domain's store; a blank one (a template such as bookworm's
    AAVMF_VARS.fd, all zeros, or a VM never started) is not applicable, not an error."""
    try:
        variables = efi.parse_varstore(data, str(path))
    except efi.BlankStore as exc:
        return checks.blank_report("varstore", str(path), str(exc))
    return checks.build_report("varstore", str(path), variables, [], root, now)


def check_domain(domain: Domain, root: Path, now: datetime.datetime) -> dict:
    entry = {
        "domain": domain.name,
        "definition": domain.xml,
        "nvram": domain.nvram,
        "transient": domain.transient,
    }
    if domain.error:
        return error_entry(entry, domain.error)
    if domain.nvram is None:
        entry.update({"verdict": "no-nvram", "exit_status": 3})
        if domain.no_nvram:
            entry["reason"] = domain.no_nvram
        return entry
    problem = nvram_problem(domain.nvram)
    if problem:
        return error_entry(entry, f"{domain.nvram}: {problem}")
    path = nvram_path(domain, root)
    entry["running"] = domain_running(domain, root) or nvram_locked(path)
    entry["saved_state"] = saved_state(domain, root)
    if not entry["running"] and not os.path.lexists(path):
        return check_template(domain, entry, root, now)
    entry["nvram_exists"] = True
    nvram = domain.nvram

    def read() -> Tuple[Path, bytes]:
        where = in_root(root, nvram)  # a link there is followed, inside root
        return path, read_running(where) if entry["running"] else fix.read_nvram(where)

    return judge_store(entry, read, str(path), str(path), root, now)


# --- creating a never-started domain's NVRAM, as libvirt would, with the CAs added ----------


def account_id(root: Path, table: str, value: str) -> Optional[int]:
    """A user or group name (or +NUMBER, as qemu.conf allows) as its number in root's
    /etc/passwd or /etc/group."""
    if value.startswith("+") and value[1:].isdigit():
        return int(value[1:])
    try:
        text = efi.read_bounded(root / "etc" / table, MAX_XML, table).decode("utf-8", "replace")
    except Error:
        return None
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[0] == value and fields[2].isdigit():
            return int(fields[2])
    return None


def qemu_owner(root: Path) -> Tuple[int, int]:
    """The owner libvirt gives an NVRAM file it creates: qemu.conf's user and group,
    else Debian's libvirt-qemu (root when that account is missing)."""
    wanted = {"user": "libvirt-qemu", "group": "libvirt-qemu"}
    try:
        text = efi.read_bounded(root / "etc/libvirt/qemu.conf", MAX_XML, "qemu.conf").decode(
            "utf-8", "replace"
        )
    except Error:
        text = ""
    for line in text.splitlines():
        match = re.match(r'^\s*(user|group)\s*=\s*"([^"]+)"', line)
        if match:
            wanted[match.group(1)] = match.group(2)
    uid = account_id(root, "passwd", wanted["user"])
    gid = account_id(root, "group", wanted["group"])
    return (uid if uid is not None else 0, gid if gid is not None else 0)


def create_reason(domain: Domain, entry: dict) -> Optional[str]:
    """Why --fix does not create this never-started domain's NVRAM, or None."""
    if entry.get("template_from") != "the domain definition":
        return (
            f"NVRAM not created yet and its template was chosen from {entry['template_from']}, "
            "not named by the domain: let libvirt create it (virsh start --paused "
            f"{domain.name}; virsh destroy {domain.name}), then run --fix again"
        )
    if (domain.nvram_format or "raw") != "raw" or not domain.nvram.endswith(".fd"):
        return (
            "NVRAM not created yet, in a format other than raw: let libvirt create it "
            f"(virsh start --paused {domain.name}; virsh destroy {domain.name}), "
            "then run --fix again"
        )
    return None


def create_from_template(
    path: Path, template: Path, certs: Dict[str, fix.Cert], dry_run: bool, root: Path
) -> dict:
    """The NVRAM file libvirt would copy from the template at the first start, with the
    CAs added, created only if it still does not exist (libvirt copies the template only
    then, so it keeps this file)."""
    with efi.open_regular(template) as handle:
        data = fix.read_store_file(handle, template)[0]
    plan = fix.plan_fix(data, str(template), certs)
    result = plan.as_json()
    result.update(
        {
            "path": str(path),
            "format": "raw",
            "backup": None,
            "written": False,
            "created_from": str(template),
        }
    )
    if dry_run:
        return result
    new = b"".join(plan.new_bytes) if plan.new_bytes is not None else data
    uid, gid = qemu_owner(root)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(new)
            out.flush()
            os.fchmod(out.fileno(), stat.S_IRUSR | stat.S_IWUSR)  # as libvirt: 0600
            if os.geteuid() == 0:
                os.fchown(out.fileno(), uid, gid)
            os.fsync(out.fileno())
        try:
            os.link(temp, path)  # never over a file libvirt made meanwhile
        except FileExistsError:
            raise Error(
                f"{path} was created meanwhile (the domain started?): run --fix again"
            ) from None
    finally:
        os.unlink(temp)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    result["written"] = True
    return result


def render(entries: List[dict], quiet: bool, source: dict) -> str:
    """The text report: where the domains came from, then one verdict per domain; with
    quiet, nothing for a domain the check does not apply to (exit status 3)."""
    out = []
    if source["source"] == "libvirt":
        out.append(f"domains from libvirt ({source['connect']})")
        if source["note"]:
            out.append(f"note: {source['note']}")
    else:
        out.append(f"domains from files: {source['note']}")
    for entry in entries:
        if quiet and entry["exit_status"] == EXIT_NOT_APPLICABLE and not entry.get("fix"):
            continue
        out += entry_lines(entry, quiet)
    return "\n".join(checks.printable(line) for line in out) + "\n"


def entry_head(entry: dict) -> str:
    """ "domain NAME (state): " and, for a domain not started yet, the template's part."""
    if "running" not in entry and entry["verdict"] == "error":
        return f"domain {entry['domain']}: "  # its state was not looked at
    state = "running" if entry.get("running") else "shut off"
    if entry.get("transient"):
        state += ", transient"
    head = f"domain {entry['domain']} ({state}): "
    if entry.get("nvram_exists") is False and entry["verdict"] != "error":
        head += (
            f"NVRAM {entry['nvram']} not created yet; verdict on template "
            f"{entry['template']} (from {entry['template_from']}): "
        )
    return head


def entry_lines(entry: dict, quiet: bool) -> List[str]:
    """One domain's lines: its verdict, its report, what --fix did or why it did not."""
    head = entry_head(entry)
    if entry["verdict"] == "no-nvram":
        reason = entry.get("reason") or "BIOS boot or no <nvram> element"
        out = [head + f"no UEFI NVRAM ({reason})"]
    elif entry["verdict"] == "error":
        out = [head + f"error: {entry['error']}"]
    else:
        out = [head + entry["verdict"]]
        if not quiet:
            text = checks.render_text(entry["report"], quiet)
            out += ["    " + line if line else "" for line in text.splitlines()]
    fixed = entry.get("fix")
    if fixed:
        if fixed.get("created_from"):
            verb = "would create" if entry.get("dry_run") else "created"
            out.append(f"    {verb} {fixed['path']} from {fixed['created_from']}")
        out += ["    " + line for line in fix.render_fix(fixed, entry.get("dry_run", False))]
    if entry.get("skipped"):
        out.append(f"    not fixed: {entry['skipped']}")
    return out


def combined(entries: List[dict]) -> int:
    codes = [e["exit_status"] for e in entries]
    if EXIT_ERROR in codes:
        return EXIT_ERROR
    if EXIT_ACTION in codes:
        return EXIT_ACTION
    if EXIT_OK in codes:
        return EXIT_OK
    return EXIT_NOT_APPLICABLE


def fix_domain(domain: Domain, entry: dict, certs, args, root: Path) -> None:
    if entry["running"]:
        entry["skipped"] = "running: shut it down, then run --fix again"
        if domain.transient:
            entry["skipped"] = (
                "running, and transient (it exists only while it runs and its NVRAM is "
                "in use): define it (virsh define) and shut it down, then run --fix again"
            )
        return
    if entry["saved_state"]:
        entry["skipped"] = (
            f"{entry['saved_state']}: its next start would write the saved store "
            "back over the change; discard the saved state (virsh "
            "managedsave-remove) or start and shut it down, then run --fix again"
        )
        return
    dry_run = bool(args.dry_run)
    try:
        if entry.get("nvram_exists") is False:
            reason = create_reason(domain, entry)
            if reason:
                entry["skipped"] = reason
                return
            template = in_root(root, entry["template"])
            entry["fix"] = create_from_template(
                nvram_path(domain, root), template, certs, dry_run, root
            )
        else:
            entry["fix"] = fix.fix_file(
                nvram_path(domain, root), certs, dry_run=dry_run, root=root
            )
        entry["dry_run"] = dry_run
        if entry["fix"]["written"]:
            now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            after = check_domain(domain, root, now)
            for key in ("verdict", "exit_status", "report", "nvram_exists"):
                entry[key] = after.get(key)
    except Error as exc:
        entry["skipped"] = f"refused: {exc}"
        entry["exit_status"] = EXIT_ERROR
    except OSError as exc:
        # This VM's file could not be written (no such directory, the template gone,
        # a read-only file system): its error, and the other VMs are still fixed.
        entry["skipped"] = f"refused: cannot write {domain.nvram}: {exc.strerror or exc}"
        entry["exit_status"] = EXIT_ERROR


def cmd_libvirt(args: argparse.Namespace) -> int:
    root = Path(args.root or "/")
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    try:
        domains, source = read_domains(root)
        if not domains:
            where = "libvirt" if source["source"] == "libvirt" else str(root / DOMAIN_DIR)
            raise NotApplicable(f"no libvirt domains in {where}")
    except NotApplicable as exc:
        # A verdict, not an error: said as the check says "no UEFI" (one line, or a
        # JSON document with --json).
        if args.json:
            emit_json(
                {"applicable": False, "reason": str(exc), "domains": [], "exit_status": exc.code}
            )
        elif getattr(args, "verbosity", 0) != -1:  # --quiet: exit status 3 says it
            print(f"{PROG}: {checks.printable(str(exc))}", file=sys.stderr)
        return exc.code
    certs = fix.available_certs(args.cert or [], root, args.payloads) if args.fix else {}
    entries = []
    for domain in domains:
        entry = check_domain(domain, root, now)
        if args.fix and entry["verdict"] == "action-needed":
            fix_domain(domain, entry, certs, args, root)
        entries.append(entry)
    status = combined(entries)
    quiet = getattr(args, "verbosity", 0) == -1
    if args.json:
        emit_json({**source, "domains": entries, "exit_status": status})
    elif not (quiet and status == EXIT_NOT_APPLICABLE):
        print(render(entries, quiet, source), end="")
    return status
