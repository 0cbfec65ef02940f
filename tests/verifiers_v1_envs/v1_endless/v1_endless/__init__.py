from v1_endless.taskset import EndlessEnv, EndlessTaskset

__all__ = ["EndlessEnv", "EndlessTaskset"]
