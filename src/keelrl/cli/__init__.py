"""The command line: one module per command group (main.py: the parser and training commands; eval.py: eval and compare)."""
