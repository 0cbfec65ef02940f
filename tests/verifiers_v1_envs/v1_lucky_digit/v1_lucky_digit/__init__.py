from v1_lucky_digit.taskset import LuckyDigitTaskset

__all__ = ["LuckyDigitTaskset"]
