from v1_guarded.taskset import GuardedTaskset

__all__ = ["GuardedTaskset"]
