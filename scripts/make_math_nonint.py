"""Write data/rl/math_nonint/math_nonint.jsonl: 50 MATH train problems whose answer is not an integer.

Rule (deterministic, no randomness): in file order of data/rl/math_train/math_train_deepscaler.json, the first 50
rows whose answer has a ``\\frac``/``\\dfrac`` or ``\\sqrt`` and is under 30 characters, and whose problem is
under 220 characters without an Asymptote figure. ``id`` is the row's 0-based index in that file.
Run from the repository root: python scripts/make_math_nonint.py
"""

import json
import re
from pathlib import Path

SRC = Path("data/rl/math_train/math_train_deepscaler.json")
OUT = Path("data/rl/math_nonint/math_nonint.jsonl")


def main() -> None:
    rows = json.loads(SRC.read_text())
    picked = [{"id": i, "problem": r["problem"], "answer": r["answer"], "subject": r["type"],
               "level": r["difficulty"]}
              for i, r in enumerate(rows)
              if r["answer"] and re.search(r"\\(d?frac|sqrt)", r["answer"]) and len(r["answer"]) < 30
              and len(r["problem"]) < 220 and "[asy]" not in r["problem"]][:50]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in picked))
    print(f"wrote {len(picked)} rows to {OUT}")


if __name__ == "__main__":
    main()
