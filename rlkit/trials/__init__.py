"""Trials on disk: paths, the trial record and index, the recover layout, multi-stage runs."""
