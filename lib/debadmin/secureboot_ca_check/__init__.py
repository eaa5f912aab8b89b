"""secureboot-ca-check: main (command line), checks (what a set of variables holds and needs,
as text, JSON and metrics), rules (findings), efi (signature lists and varstores), fix
(offline VM NVRAM), libvirt (domains), payloads (Microsoft's signed updates) and efivarfs
(this machine's firmware)."""

PROG = "secureboot-ca-check"
