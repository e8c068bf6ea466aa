"""The `rlkit` commands (typer + rich): the login-node side users type, and the in-job entry points."""
