from v1_twice.taskset import TwiceEnv, TwiceTaskset

__all__ = ["TwiceEnv", "TwiceTaskset"]
