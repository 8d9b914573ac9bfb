"""``python -m fastfs`` runs the command-line interface."""

from fastfs.daemon.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
