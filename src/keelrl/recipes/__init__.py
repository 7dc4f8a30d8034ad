"""Whole-lifecycle recipes built on the API: the laptop demo (recipes/demo.py) and the search-trace SFT recipe (search.py)."""
