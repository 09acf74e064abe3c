"""calc: evaluate arithmetic expressions."""

from calc.evaluator import evaluate

__all__ = ["evaluate"]
