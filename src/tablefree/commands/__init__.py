"""Command-line verbs; one module per area, each with ``add_commands(subparsers)``."""
