"""Imported once by the reward pool's forkserver (``HardTimeoutPool(preload=...)``).

Importing math-verify and parsing one expression builds latex2sympy's ANTLR
caches (about 1 s); every worker forked afterwards inherits them, so a pool
recreated after a timeout is ready in a fraction of a second.
"""

import logging

from math_verify import parse

logging.getLogger("math_verify").setLevel(logging.ERROR)
parse("$\\frac{1}{2} + x$", parsing_timeout=None)
