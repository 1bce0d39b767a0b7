"""A bundled learning task: integer arithmetic problems from a seeded generator (a CPU learning signal).

The paper's RL data (§4.2) is competition math that a 135M-parameter model cannot touch. To see learning on
CPU we need problems that a small model *can* solve once it delegates the arithmetic to the Python tool, and
cannot solve reliably by itself (products of 2- and 3-digit numbers, multi-step expressions). Four kinds, from
easiest to hardest for a model that has only learned the tool format:

* ``bare``     - the problem is just an expression: ``"347 * 28"``;
* ``one_step`` - one operation in words: ``"What is the product of 347 and 28?"``;
* ``two_step`` - a parenthesised two-operation expression: ``"Compute (45 + 38) * 12."``;
* ``word``     - a short word problem, one or two operations: ``"Each crate holds 24 bottles. How many bottles
  are in 17 of them?"``.

Every answer is an integer (divisions are exact). Rows: ``{"id", "problem", "answer", "kind"}``; ``answer`` is
the integer as a string, as in the other RL sources. :func:`generate` is deterministic given its seed;
``train`` and ``heldout`` never share a problem text. ``python -m rstar2.data.arith_task OUT_DIR`` writes
``train.jsonl`` and ``heldout.jsonl`` (the bundled copies live in ``data/learning/``; a test checks that they
equal a fresh generation).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

KINDS = ("bare", "one_step", "two_step", "word")

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _bare(r: random.Random) -> tuple[str, int]:
    op = r.choice("+-*")
    if op == "*":
        a, b = r.randint(12, 999), r.randint(12, 99)
    else:
        a, b = r.randint(100, 9999), r.randint(100, 9999)
    return f"{a} {op} {b}", _OPS[op](a, b)


def _one_step(r: random.Random) -> tuple[str, int]:
    kind = r.choice(("sum", "difference", "product", "quotient"))
    if kind == "sum":
        a, b = r.randint(100, 9999), r.randint(100, 9999)
        return r.choice((f"What is the sum of {a} and {b}?", f"Add {a} and {b}.")), a + b
    if kind == "difference":
        a, b = sorted((r.randint(100, 9999), r.randint(100, 9999)), reverse=True)
        return r.choice((f"What is {a} minus {b}?", f"Subtract {b} from {a}.")), a - b
    if kind == "product":
        a, b = r.randint(12, 999), r.randint(12, 99)
        return r.choice((f"What is the product of {a} and {b}?", f"Multiply {a} by {b}.")), a * b
    b, q = r.randint(3, 99), r.randint(12, 999)
    return r.choice((f"What is {b * q} divided by {b}?", f"Divide {b * q} by {b}.")), q


def _two_step(r: random.Random) -> tuple[str, int]:
    a, b, c = r.randint(10, 999), r.randint(10, 999), r.randint(3, 99)
    form = r.choice(("(a+b)*c", "(a-b)*c", "a*c+b", "a*c-b"))
    if form == "(a+b)*c":
        return f"Compute ({a} + {b}) * {c}.", (a + b) * c
    if form == "(a-b)*c":
        a, b = max(a, b), min(a, b)
        return f"Compute ({a} - {b}) * {c}.", (a - b) * c
    if form == "a*c+b":
        return f"Compute {a} * {c} + {b}.", a * c + b
    return f"Compute {a} * {c} - {b}.", a * c - b


_ITEMS = (("crate", "bottles"), ("box", "pencils"), ("bag", "apples"), ("shelf", "books"), ("tray", "cookies"),
          ("bus", "passengers"), ("packet", "stickers"), ("row", "chairs"))
_NAMES = ("Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas")


def _word(r: random.Random) -> tuple[str, int]:
    name = r.choice(_NAMES)
    form = r.choice(("groups", "left", "rate", "change"))
    if form == "groups":
        (holder, items), per, n = r.choice(_ITEMS), r.randint(12, 99), r.randint(12, 99)
        return (f"Each {holder} holds {per} {items}. How many {items} are in {n} of them?"), per * n
    if form == "left":
        have, give = r.randint(500, 9999), r.randint(100, 499)
        return (f"{name} has {have} marbles and gives away {give} of them. How many marbles does {name} "
                f"have left?"), have - give
    if form == "rate":
        speed, hours = r.randint(35, 120), r.randint(3, 48)
        return f"A train travels {speed} km every hour. How many km does it travel in {hours} hours?", speed * hours
    price, count = r.randint(3, 49), r.randint(3, 19)
    paid = price * count + r.randint(1, 500)
    return (f"{name} buys {count} books that cost {price} dollars each and pays with {paid} dollars. "
            f"How many dollars of change does {name} get?"), paid - price * count


_MAKERS = {"bare": _bare, "one_step": _one_step, "two_step": _two_step, "word": _word}


def generate(n_train: int = 2000, n_heldout: int = 200, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Draw ``n_train`` + ``n_heldout`` distinct problems, the kinds in equal shares, and split them.

    Returns:
        ``(train, heldout)``, lists of ``{"id", "problem", "answer", "kind"}``. The held-out problems are
        drawn first, kind by kind in turn, so the held-out set does not change when ``n_train`` does.
    Raises:
        ValueError: a count is negative.
    """
    if n_train < 0 or n_heldout < 0:
        raise ValueError(f"counts must be >= 0, got n_train={n_train}, n_heldout={n_heldout}")
    r = random.Random(f"arith:{seed}")
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < n_heldout + n_train:
        kind = KINDS[len(rows) % len(KINDS)]
        problem, answer = _MAKERS[kind](r)
        if problem in seen:
            continue
        seen.add(problem)
        split = "heldout" if len(rows) < n_heldout else "train"
        rows.append({"id": f"arith-{split}-{len(rows):05d}", "problem": problem, "answer": str(answer),
                     "kind": kind})
    return rows[n_heldout:], rows[:n_heldout]


def main(argv: list[str]) -> None:
    import argparse

    from ..io import write_jsonl

    ap = argparse.ArgumentParser(prog="python -m rstar2.data.arith_task",
                                 description="Write train.jsonl and heldout.jsonl of the arithmetic learning task.")
    ap.add_argument("out_dir", nargs="?", default="data/learning")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = generate(a.train, a.heldout, a.seed)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "heldout.jsonl", heldout)
    print(f"wrote {len(train)} train and {len(heldout)} held-out problems to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
