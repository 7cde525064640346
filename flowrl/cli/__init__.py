"""The ``flowrl`` command: one module per subcommand; :func:`flowrl.cli.main.main` builds the parser."""
