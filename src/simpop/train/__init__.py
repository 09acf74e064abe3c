"""simpop.train."""
