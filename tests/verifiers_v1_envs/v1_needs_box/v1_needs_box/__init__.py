from v1_needs_box.taskset import BoxTaskset

__all__ = ["BoxTaskset"]
