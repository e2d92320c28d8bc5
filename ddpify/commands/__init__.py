"""One module per CLI command; each exposes COMMANDS, a tuple of click commands."""

# The module of each command (the CLI imports it on first use; tests check this against COMMANDS).
MODULE_OF = {"convert": "convert", "explain": "explain", "launch": "launch", "lint": "lint", "rule": "lint",
             "rules": "lint", "mcp": "mcp", "server": "server", "verify": "verify"}
