from interception.taskset import InterceptionTaskset

__all__ = ["InterceptionTaskset"]
