"""The command line: one module per command group (main.py: the parser and training commands, `main` the console
script's entry point; eval.py: eval and compare; judge.py: judge)."""

from keelrl.cli.main import main

__all__ = ["main"]
