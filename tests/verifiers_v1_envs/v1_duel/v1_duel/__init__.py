from v1_duel.taskset import DuelEnv, DuelTaskset

__all__ = ["DuelEnv", "DuelTaskset"]
