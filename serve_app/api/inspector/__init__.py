"""The memory inspector: server-rendered pages under /ui that read and act only through the public API."""
