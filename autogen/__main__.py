from autogen.cli.main import entry

entry()
