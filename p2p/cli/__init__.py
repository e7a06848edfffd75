"""The ``p2p`` command line (typer): flags -> config objects -> library calls.

``app.py`` holds the app and its entry point; each command and its views live beside it.
"""

from p2p.cli.app import app, main

__all__ = ["app", "main"]
