"""Checkpoint files (`files`: atomic writes, rotation, safe loading) and the run tree
(`run_tree`: resume and fork origins, a fork's parent record)."""
