"""Experiments that reproduce the paper's findings (``simpop experiment ...``)."""
