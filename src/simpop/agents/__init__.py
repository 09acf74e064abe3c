"""simpop.agents."""
