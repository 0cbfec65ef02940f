from v1_arith.taskset import ArithTaskset

__all__ = ["ArithTaskset"]
