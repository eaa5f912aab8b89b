"""netboot-serialize: main (command line, per-format menu editors, settings) and tar (netboot
tarballs: validation and rewriting)."""
