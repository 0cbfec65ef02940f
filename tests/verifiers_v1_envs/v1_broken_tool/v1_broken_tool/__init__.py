from v1_broken_tool.taskset import BrokenToolTaskset

__all__ = ["BrokenToolTaskset"]
