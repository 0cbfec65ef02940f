# /// script
# dependencies = []
# ///
"""Grade one answer in the rollout's runtime: ``check.py EXPECTED REPLY`` prints 1.0 when
the reply's last ``<answer>`` holds the expected number (as exact fractions: ``12``,
``12.0`` and ``24/2`` are one value), else 0.0."""

import re
import sys
from fractions import Fraction

expected, reply = sys.argv[1], sys.argv[2]
found = re.findall(r"<answer>(.*?)</answer>", reply)
try:
    score = 1.0 if found and Fraction(found[-1].strip()) == Fraction(expected) else 0.0
except (ValueError, ZeroDivisionError):
    score = 0.0
print(score)
