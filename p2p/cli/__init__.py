"""The ``p2p`` command line (typer): flags -> config objects -> library calls.

``app.py`` holds the entry point (``main``) and builds the app (``p2p.cli.app.build_app``, or
``p2p.cli.app.app`` for all of it); each command and its views live beside it.
"""

from p2p.cli.app import main

__all__ = ["main"]
