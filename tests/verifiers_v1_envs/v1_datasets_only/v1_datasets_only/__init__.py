from v1_datasets_only.taskset import MirrorTaskset

__all__ = ["MirrorTaskset"]
