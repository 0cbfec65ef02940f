from v1_picture.taskset import PictureEnv, PictureTaskset

__all__ = ["PictureEnv", "PictureTaskset"]
