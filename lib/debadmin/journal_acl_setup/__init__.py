"""journal-acl-setup: main (command line, apply, revert, check), walk (the descriptor walk of
the journal tree) and state (the SQLite record that makes revert exact)."""
