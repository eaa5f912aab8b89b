"""debadmin: Debian admin helper tools (shared library)."""

__version__ = "0.5.0"
