"""The Textual front end of ddptop.  ``from ddptop.ui.app import make_app``."""
