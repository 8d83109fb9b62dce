"""Imported once by the reward worker zygote (``shared_pool().add_setup(preload=...)`` in
``mr_rl.rewards.math``).

Importing math-verify and parsing / verifying one expression builds latex2sympy's ANTLR
caches and sympy's lazily built tables (about 1 s); every worker forked afterwards inherits
them, so a worker replaced after a timeout is ready in milliseconds. Its "timeout is
disabled" warning is silenced: the pool times calls out from the parent.
"""

import logging

from math_verify import parse, verify

logging.getLogger("math_verify").setLevel(logging.ERROR)
verify(parse("$\\frac{1}{2} + x$", parsing_timeout=None),
       parse("\\boxed{0.5 + x}", parsing_timeout=None), timeout_seconds=None)
