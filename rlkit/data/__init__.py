"""Datasets on local disk: files, their row formats, and the first row read at submit."""
