"""`python -m ddpify` runs the command-line interface."""

from ddpify.cli import main

if __name__ == "__main__":
    main()
