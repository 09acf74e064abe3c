"""simpop.simulators."""
