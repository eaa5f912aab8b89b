"""sbuild-fast: main (command line, create, update, remove), sbuild (what the installed sbuild
can do), doctor (diagnosis) and session (the one-namespace-per-build backend)."""
