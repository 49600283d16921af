"""The row-selection expressions of ``rewardkit filter``: parsed by a small grammar, never ``eval``-ed.

Grammar (precedence low to high)::

    expr    := or
    or      := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := sum (("<" | "<=" | ">" | ">=" | "==" | "!=") sum)*      # chains: 1 < score < 5
    sum     := product (("+" | "-") product)*
    product := unary (("*" | "/") unary)*
    unary   := "-" unary | atom
    atom    := NUMBER | 'string' | "string" | true | false | NAME | `any name` | "(" expr ")"

A NAME is letters, digits, ``_`` and ``.`` (``score``, ``dim_aesthetic``, ``hps.score``); backticks quote any
other column name. The meaning is pandas' ``DataFrame.query`` over the same columns (comparisons with NaN are
false, ``and`` / ``or`` / ``not`` elementwise), evaluated with numpy. Nulls (None, NaN) in a text column follow
pandas too: ``==`` and ordering comparisons with a null are false, ``!=`` true. Comparing text with a number
by order (``prompt > 3``), or arithmetic on text, is a usage error naming the operation (pandas raises
``TypeError``); so is nesting deeper than :data:`MAX_DEPTH` parentheses / ``not`` / ``-``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import UsageError

_TOKEN = re.compile(r"""\s*(?:
    (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<str>'[^']*'|"[^"]*")
  | (?P<bq>`[^`]+`)
  | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<op><=|>=|==|!=|<|>|\+|-|\*|/|\(|\))
)""", re.VERBOSE)
_KEYWORDS = {"and", "or", "not", "true", "false", "True", "False"}
_CMP = ("<", "<=", ">", ">=", "==", "!=")
MAX_DEPTH = 64  # nested parentheses / not / unary minus


@dataclass
class Expression:
    """A parsed expression: its source text, its tree, and the column names it reads."""

    text: str
    tree: Any
    columns: list[str] = field(default_factory=list)

    def evaluate(self, columns: Mapping[str, Any], rows: Any = None) -> Any:
        """A boolean numpy array over the rows of ``columns`` (name -> 1-D array-like, all one length), or over
        ``rows`` only (an index array: the rows still in play; the others are never looked at)."""
        import numpy as np

        missing = [c for c in self.columns if c not in columns]
        if missing:
            raise UsageError(f"expression {self.text!r}: no column {', '.join(map(repr, missing))} "
                             f"(columns: {', '.join(columns)})")
        used = {k: np.asarray(columns[k]) for k in self.columns}
        if rows is not None:
            used = {k: v[rows] for k, v in used.items()}
        try:
            out = np.asarray(_eval(self.tree, used))
        except UsageError as exc:
            raise UsageError(f"expression {self.text!r}: {exc}") from None
        except RecursionError:
            raise UsageError(f"expression {self.text!r}: too long a chain of operators to evaluate") from None
        if out.dtype != bool:
            raise UsageError(f"expression {self.text!r} is not a condition (it gives numbers, not true / false)")
        if out.ndim == 0:
            n = len(rows) if rows is not None else (len(next(iter(columns.values()))) if columns else 0)
            out = np.full(n, bool(out))
        return out


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks: list[tuple[str, Any, int]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise UsageError(f"expression {self.text!r}: cannot read {text[pos:].strip()[:20]!r} "
                                 f"(at character {pos})")
            kind = m.lastgroup
            val = m.group(kind)
            if kind == "num":
                self.toks.append(("num", float(val), m.start(kind)))
            elif kind == "str":
                self.toks.append(("str", val[1:-1], m.start(kind)))
            elif kind == "bq":
                self.toks.append(("name", val[1:-1], m.start(kind)))
            elif kind == "name" and val in _KEYWORDS:
                self.toks.append(("kw", val.lower(), m.start(kind)))
            else:
                self.toks.append((kind, val, m.start(kind)))
            pos = m.end()
        self.i = 0
        self.depth = 0
        self.names: list[str] = []

    def deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise UsageError(f"expression {self.text!r}: nested more than {MAX_DEPTH} levels deep")

    def peek(self) -> tuple[str, Any, int] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def accept(self, kind: str, *vals: Any) -> Any:
        t = self.peek()
        if t is not None and t[0] == kind and (not vals or t[1] in vals):
            self.i += 1
            return t[1]
        return None

    def fail(self, what: str):
        t = self.peek()
        where = f"at {t[1]!r} (character {t[2]})" if t else "at the end"
        raise UsageError(f"expression {self.text!r}: expected {what} {where}")

    def parse(self) -> Expression:
        if not self.toks:
            raise UsageError("empty expression")
        tree = self.or_()
        if self.peek() is not None:
            self.fail("an operator, 'and' or 'or'")
        return Expression(self.text, tree, list(dict.fromkeys(self.names)))

    def or_(self):
        node = self.and_()
        while self.accept("kw", "or"):
            node = ("or", node, self.and_())
        return node

    def and_(self):
        node = self.not_()
        while self.accept("kw", "and"):
            node = ("and", node, self.not_())
        return node

    def not_(self):
        if self.accept("kw", "not"):
            self.deeper()
            node = ("not", self.not_())
            self.depth -= 1
            return node
        return self.compare()

    def compare(self):
        left = self.sum_()
        node = None
        while (op := self.accept("op", *_CMP)) is not None:
            right = self.sum_()
            part = ("cmp", op, left, right)
            node = part if node is None else ("and", node, part)
            left = right
        return left if node is None else node

    def sum_(self):
        node = self.product()
        while (op := self.accept("op", "+", "-")) is not None:
            node = ("arith", op, node, self.product())
        return node

    def product(self):
        node = self.unary()
        while (op := self.accept("op", "*", "/")) is not None:
            node = ("arith", op, node, self.unary())
        return node

    def unary(self):
        if self.accept("op", "-"):
            self.deeper()
            node = ("neg", self.unary())
            self.depth -= 1
            return node
        return self.atom()

    def atom(self):
        t = self.peek()
        if t is None:
            self.fail("a number, a column or '('")
        kind, val, _ = t
        if kind in ("num", "str"):
            self.i += 1
            return ("lit", val)
        if kind == "kw" and val in ("true", "false"):
            self.i += 1
            return ("lit", val == "true")
        if kind == "name":
            self.i += 1
            self.names.append(val)
            return ("col", val)
        if self.accept("op", "("):
            self.deeper()
            node = self.or_()
            if not self.accept("op", ")"):
                self.fail("')'")
            self.depth -= 1
            return node
        self.fail("a number, a column or '('")


def parse_expression(text: str) -> Expression:
    """Parse ``text`` (e.g. ``"score >= 6.5 and valid"``, ``"hps > 0.25 or aesthetic > 6"``) or raise
    :class:`~rewardkit.commands.UsageError` saying where it stops making sense (an empty or blank text too)."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError("empty expression: give a condition such as 'score >= 6.5'")
    return _Parser(text).parse()


def _eval(node: Any, cols: Mapping[str, Any]) -> Any:
    import numpy as np

    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "col":
        return cols[node[1]]
    if kind == "neg":
        return -_num(_eval(node[1], cols))
    if kind == "not":
        return ~_bool(_eval(node[1], cols))
    if kind in ("and", "or"):
        a, b = _bool(_eval(node[1], cols)), _bool(_eval(node[2], cols))
        return (a & b) if kind == "and" else (a | b)
    if kind == "arith":
        a, b = _num(_eval(node[2], cols)), _num(_eval(node[3], cols))
        with np.errstate(divide="ignore", invalid="ignore"):
            return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide}[node[1]](a, b)
    if kind == "cmp":
        return _compare(node[1], _eval(node[2], cols), _eval(node[3], cols))
    raise AssertionError(node)  # pragma: no cover


_OPS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


def _is_null(x: Any) -> bool:
    return x is None or (isinstance(x, float) and x != x)


def _compare(op: str, a: Any, b: Any) -> Any:
    """``a op b`` elementwise, pandas' way: numbers (NaN: false, ``!=`` true) with numpy; text or mixed values
    one by one, a null (None / NaN) false for ``==`` and the orderings and true for ``!=``; text ordered against
    a number is a :class:`UsageError` (pandas: ``TypeError``)."""
    import operator

    import numpy as np

    x, y = np.asarray(a), np.asarray(b)
    numeric = x.dtype.kind in "iufb" and y.dtype.kind in "iufb"
    text = x.dtype.kind == "U" and y.dtype.kind == "U"
    if numeric or text:
        fn = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
              "!=": np.not_equal}[op]
        with np.errstate(invalid="ignore"):
            return np.asarray(fn(x, y), dtype=bool)
    fn = getattr(operator, _OPS[op])
    xs, ys = np.broadcast_arrays(x.astype(object), y.astype(object))
    out = np.empty(xs.shape, dtype=bool)
    for i, (u, v) in enumerate(zip(xs.ravel().tolist(), ys.ravel().tolist())):
        if _is_null(u) or _is_null(v):
            out.flat[i] = op == "!="
            continue
        if op in ("==", "!="):
            same = isinstance(u, str) == isinstance(v, str)  # text never equals a number (pandas)
            out.flat[i] = (bool(u == v) if same else False) == (op == "==")
            continue
        try:
            out.flat[i] = bool(fn(u, v))
        except TypeError:
            raise UsageError(f"cannot compare {type(u).__name__} {u!r} {op} {type(v).__name__} {v!r} "
                             "(text is ordered only against text)") from None
    return out


def _num(x: Any) -> Any:
    import numpy as np

    arr = np.asarray(x)
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        what = "text" if arr.dtype.kind in "UO" else str(arr.dtype)
        raise UsageError(f"arithmetic on a value that is not a number ({what})")
    return arr.astype(np.float64) if arr.dtype.kind != "f" else arr


def _bool(x: Any) -> Any:
    import numpy as np

    arr = np.asarray(x)
    if arr.dtype != bool:
        raise UsageError("'and' / 'or' / 'not' need conditions on both sides (e.g. score > 5), got a number")
    return arr
