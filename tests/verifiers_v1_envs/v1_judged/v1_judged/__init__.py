from v1_judged.taskset import JudgedTaskset

__all__ = ["JudgedTaskset"]
