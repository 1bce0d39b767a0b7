"""Imported once by the grading forkserver (rstar2.grading_pool): pay Math-Verify's first-use costs there.

The first LaTeX comparison in a process builds the ANTLR parser and sympy caches (about a second), which
every freshly forked grading worker would otherwise pay again after a timeout kill. Importing this module
runs a few representative comparisons so that forked workers start warm.
"""

from rstar2 import grading

for _pred, _gold in (("\\frac{1}{2}", "0.5"), ("x = 5", "5"), ("\\sqrt{16}", "4"), ("3.0", "3"), ("2^{10}", "1024"),
                     ("\\dfrac{3}{4}", "\\frac{3}{4}"), ("(B)", "B"), ("\\pi", "3.14159")):
    try:
        grading.grade(_pred, _gold)
    except Exception:
        pass
