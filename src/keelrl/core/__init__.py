"""The lowest layer: small helpers every other folder may use (core/seeds.py: `stable_hash`, the one way to derive a seed; procs.py: process helpers)."""
