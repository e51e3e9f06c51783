"""The `autogen` command: argument parsing and checks (options), the subcommands (commands)
and the entry point (main). May import every other part."""
