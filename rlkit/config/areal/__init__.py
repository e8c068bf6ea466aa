"""AReaL's configs read as rlkit's: its keys, their rules, its per-engine layouts, `rlkit migrate`."""
