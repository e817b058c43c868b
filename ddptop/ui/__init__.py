"""The Textual front end of ddptop: ``from ddptop.ui.app import make_app``; each part of the screen has its own module (see app.py)."""
