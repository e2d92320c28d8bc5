"""The exit codes every command shares (black's convention); below the CLI and verify, which both use them."""

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_ERROR = 2
EXIT_INCOMPLETE = 3  # convert: a conversion that needs work by hand
