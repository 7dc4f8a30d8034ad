"""Which problems a run trains on next (sources.py): the data's order, adaptive curricula, mixtures, dynamic sampling."""
