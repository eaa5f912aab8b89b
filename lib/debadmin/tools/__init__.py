"""One module per debadmin tool; bin/TOOL calls its main()."""
