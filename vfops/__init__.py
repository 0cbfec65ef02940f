"""vfops: RL environments for LLMs, evaluated and trained at scale."""
