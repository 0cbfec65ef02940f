from v1_scripted_user.taskset import ScriptedUserEnv, ScriptedUserTaskset

__all__ = ["ScriptedUserEnv", "ScriptedUserTaskset"]
