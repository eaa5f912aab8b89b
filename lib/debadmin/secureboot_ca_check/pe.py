"""secureboot-ca-check: an EFI binary's Authenticode hash and signers, as the firmware sees them.

The hash is edk2's HashPeImage (DxeImageVerificationLib), which follows the Authenticode
specification: the headers without the CheckSum field and the Certificate Table's data
directory entry, then every section with raw data in the order of its file offset, then
whatever follows the sections except the attribute certificate table (which edk2 takes to
be last, as the specification requires).  python3-pefile reads the headers.
"""

import hashlib
import os
import stat
import struct
import warnings
from dataclasses import dataclass, field
from typing import List, Optional

import pefile
from asn1crypto import cms
from cryptography import x509

from debadmin.errors import Error
from debadmin.secureboot_ca_check import efi, payloads

SECURITY = pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_SECURITY"]  # 4
WIN_CERT_TYPE_PKCS_SIGNED_DATA = 2
MAX_SIGNATURES = efi.MAX_SIGNATURES


@dataclass
class Signature:
    """One WIN_CERTIFICATE (PKCS#7 SignedData): its signer and the certificates it carries."""

    index: int
    signer: Optional[x509.Certificate]
    certs: List[x509.Certificate] = field(default_factory=list)


@dataclass
class Image:
    path: str
    sha256: str  # the Authenticode digest: what a dbx SHA-256 entry revokes
    signatures: List[Signature] = field(default_factory=list)


def headers(data: bytes, source: str) -> pefile.PE:
    """The PE/COFF headers, read by pefile; Error for what is not a PE image."""
    if len(data) < 0x40 or data[:2] != b"MZ":
        raise Error(f"{source}: not a PE image (no MZ header)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return pefile.PE(data=data, fast_load=True)
    except pefile.PEFormatError as exc:
        raise Error(f"{source}: not a PE image ({exc.value})") from None
    except Exception as exc:  # hostile headers: one line, never a traceback
        raise Error(f"{source}: unreadable PE headers ({exc.__class__.__name__})") from None


def security_entry(image: pefile.PE):
    """The Certificate Table's data directory entry (pefile structure), or None."""
    optional = image.OPTIONAL_HEADER
    if optional.NumberOfRvaAndSizes <= SECURITY or len(optional.DATA_DIRECTORY) <= SECURITY:
        return None
    return optional.DATA_DIRECTORY[SECURITY]


def authenticode_sha256(data: bytes, source: str, image: Optional[pefile.PE] = None) -> str:
    """The SHA-256 Authenticode digest as edk2's HashPeImage computes it."""
    image = image or headers(data, source)
    optional = image.OPTIONAL_HEADER
    size = len(data)
    checksum = optional.get_field_absolute_offset("CheckSum")
    size_of_headers = optional.SizeOfHeaders
    if size_of_headers > size or checksum + 4 > size_of_headers:
        raise Error(f"{source}: SizeOfHeaders ({size_of_headers}) lies outside the file")
    view = memoryview(data)
    digest = hashlib.sha256()
    digest.update(view[:checksum])
    entry = security_entry(image)
    if entry is None:
        digest.update(view[checksum + 4 : size_of_headers])
        cert_size = 0
    else:
        at = entry.get_file_offset()
        if at + 8 > size_of_headers:
            raise Error(f"{source}: the Certificate Table entry lies outside the headers")
        digest.update(view[checksum + 4 : at])
        digest.update(view[at + 8 : size_of_headers])
        cert_size = entry.Size
    hashed = size_of_headers
    sections = sorted(
        (s for s in image.sections if s.SizeOfRawData), key=lambda s: s.PointerToRawData
    )
    for section in sections:
        start, length = section.PointerToRawData, section.SizeOfRawData
        if start + length > size:
            raise Error(f"{source}: section {section_name(section)} runs past the end of the file")
        digest.update(view[start : start + length])
        hashed += length
    if size > hashed:
        if size > hashed + cert_size:
            digest.update(view[hashed : size - cert_size])
        elif size < hashed + cert_size:
            raise Error(f"{source}: the certificate table overlaps the sections")
    return digest.hexdigest()


def section_name(section) -> str:
    return section.Name.rstrip(b"\0").decode("ascii", "replace") or "(unnamed)"


def signatures(data: bytes, source: str, image: pefile.PE) -> List[Signature]:
    """The image's WIN_CERTIFICATEs of type PKCS#7 SignedData, 8-byte aligned."""
    entry = security_entry(image)
    if entry is None or not entry.Size:
        return []
    start, size = entry.VirtualAddress, entry.Size  # a file offset, for this entry only
    if start + size > len(data) or start < image.OPTIONAL_HEADER.SizeOfHeaders:
        raise Error(f"{source}: certificate table ({start}+{size}) lies outside the file")
    found: List[Signature] = []
    offset, end = start, start + size
    while offset < end:
        where = f"{source}: WIN_CERTIFICATE {len(found) + 1} at byte {offset}"
        if end - offset < 8:
            raise Error(f"{where}: truncated header")
        length, revision, cert_type = struct.unpack_from("<IHH", data, offset)
        if length < 8 or offset + length > end:
            raise Error(f"{where}: length {length} runs past the certificate table")
        if len(found) == MAX_SIGNATURES:
            raise Error(f"{source}: more than {MAX_SIGNATURES} signatures, not a boot loader")
        if cert_type == WIN_CERT_TYPE_PKCS_SIGNED_DATA:
            found.append(read_signature(data[offset + 8 : offset + length], len(found) + 1, where))
        offset += (length + 7) & ~7
    return found


def read_signature(blob: bytes, index: int, where: str) -> Signature:
    """The first SignerInfo's certificate and all the certificates of a SignedData."""
    try:
        blob = blob[: efi.der_length(blob)]
        info = cms.ContentInfo.load(bytes(blob))
        if info["content_type"].native != "signed_data":
            raise ValueError("not SignedData")
        sd = info["content"]
        certs = []
        for choice in sd["certificates"] or []:
            if choice.name == "certificate":
                cert = payloads.load_der_cert(choice.chosen.dump())
                if cert is None:
                    raise ValueError("a certificate cannot be parsed")
                certs.append(cert)
        signer = None
        infos = list(sd["signer_infos"])
        if infos and infos[0]["sid"].name == "issuer_and_serial_number":
            signer = payloads.find_signer(infos[0], certs)
    except Exception as exc:  # asn1crypto raises ValueError, TypeError and friends
        raise Error(
            f"{where}: not a PKCS#7 SignedData structure ({exc.__class__.__name__})"
        ) from None
    return Signature(index, signer, certs)


def parse(data: bytes, source: str) -> Image:
    image = headers(data, source)
    return Image(source, authenticode_sha256(data, source, image), signatures(data, source, image))


def read_fd(fd: int, source: str) -> bytes:
    """An open regular file's bytes, at most efi.MAX_PE."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise Error(f"{source}: not a regular file")
    if info.st_size > efi.MAX_PE:
        raise Error(f"{source}: larger than {efi.MAX_PE >> 20} MiB, not a boot loader")
    chunks, total = [], 0
    while total <= efi.MAX_PE:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > efi.MAX_PE:
        raise Error(f"{source}: larger than {efi.MAX_PE >> 20} MiB, not a boot loader")
    return b"".join(chunks)
