"""Watching runs: the run directory, metric sinks, and (later) the doctor and report."""
