from v1_notes.taskset import NotesTaskset

__all__ = ["NotesTaskset"]
