"""Arithmetic expressions: tokenize, then evaluate with the shunting-yard algorithm."""

import operator
import re

TOKEN_RE = re.compile(r"\s*(?:(\d+\.?\d*)|(.))")

OPERATORS = {
    "+": (1, operator.add),
    "-": (1, operator.sub),
    "*": (2, operator.mul),
    "/": (2, operator.truediv),
}


def tokenize(text):
    """Numbers (as floats) and operator or parenthesis characters."""
    tokens = []
    for number, symbol in TOKEN_RE.findall(text):
        if number:
            tokens.append(float(number))
        elif symbol.strip():
            tokens.append(symbol)
    return tokens


def evaluate(text):
    """The value of an arithmetic expression such as ``"2 * (3 + 4)"``."""
    values, ops = [], []

    def reduce():
        op = ops.pop()
        right, left = values.pop(), values.pop()
        values.append(OPERATORS[op][1](left, right))

    for token in tokenize(text):
        if isinstance(token, float):
            values.append(token)
        elif token == "(":
            ops.append(token)
        elif token == ")":
            while ops[-1] != "(":
                reduce()
            ops.pop()
        elif token in OPERATORS:
            while ops and ops[-1] != "(" and OPERATORS[ops[-1]][0] >= OPERATORS[token][0]:
                reduce()
            ops.append(token)
        else:
            raise ValueError(f"unexpected token {token!r}")
    while ops:
        reduce()
    return values[0]
