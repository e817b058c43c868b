"""Core of ddptop: everything that works without a terminal UI.

Nothing under ``ddptop.core`` may import textual, rich or torch
(``tests/integration/test_boundaries.py`` enforces it).
"""
