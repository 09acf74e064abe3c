"""simpop.evaluation."""
