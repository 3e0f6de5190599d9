"""Groundwork for issue 9: a procedural "shapes world" to train small video models on, and a classical scorer for their outputs."""
