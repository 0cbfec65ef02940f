from v1_verified.taskset import VerifiedTaskset

__all__ = ["VerifiedTaskset"]
