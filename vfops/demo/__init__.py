"""The whole loop on embedded defaults (``vfops demo``, ``make demo``).

:func:`run_demo` publishes an environment, evaluates a tiny base model, trains it
with GRPO on the CPU, registers and promotes the checkpoint through the evidence
gate (and shows a refusal), and runs the nightly flow on the champion; it
returns a :class:`DemoSummary` read back from the registry and MLflow.
"""

from vfops.demo._demo import DEMO_ENV, DEMO_MODEL, DemoSettings, DemoSummary, Night, run_demo

__all__ = ["DEMO_ENV", "DEMO_MODEL", "DemoSettings", "DemoSummary", "Night", "run_demo"]
