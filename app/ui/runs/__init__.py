"""Runs: the run history, the run tree, forking from a checkpoint, the "What fits" tab and the
views that show one run in the window."""
