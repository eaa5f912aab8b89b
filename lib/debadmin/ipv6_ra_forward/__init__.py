"""ipv6-ra-forward: main (command line, status, enable/disable plans) and owner (which
network manager owns an interface)."""
