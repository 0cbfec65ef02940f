from v1_lookup.taskset import LookupTaskset

__all__ = ["LookupTaskset"]
