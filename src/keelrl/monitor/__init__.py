"""Watching runs: the run directory, metric sinks, trace statistics, the doctor and the report."""
