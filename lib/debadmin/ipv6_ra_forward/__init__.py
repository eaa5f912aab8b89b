"""ipv6-ra-forward: main (the command line), plan (enable and disable), status, watch (the
daemon), stack (bridges, bonds, VLANs in sysfs), solicit (router solicitations), managers
(networkd, NetworkManager, ifupdown advice), sysctls (names, sysctls, the drop-in, the
configuration) and owner (which network manager owns an interface)."""
