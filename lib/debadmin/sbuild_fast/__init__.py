"""sbuild-fast: main (the command line), create (the mmdebstrap recipe and the chroot put in
place), update (refresh), remove, configure (the sbuild settings block), sbuild (what the
installed sbuild can do), doctor (diagnosis), session (the one-namespace-per-build backend)
and leftovers (trees of killed builds)."""
