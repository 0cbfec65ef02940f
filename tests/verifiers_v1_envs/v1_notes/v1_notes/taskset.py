"""Keep a few words in a notebook shared by the taskset, then say what it holds.

Each task lists words to jot one call at a time; the answer is the notebook's last
reply. Rollouts share the notebook server but each sees only its own words (its state),
so the right answer is the task's own words in order. A word longer than the notebook
takes is refused, and that task's answer comes out short: scored 0."""

import re

import verifiers.v1 as vf

from v1_notes.notebook import NotebookConfig, NotebookState, NotebookToolset

WORD_LISTS = (("heron", "maple"), ("lantern", "saxophone"), ("amber", "cobalt", "dune"))


class NotesData(vf.TaskData):
    words: list[str]


class NotesTask(vf.Task[NotesData, NotebookState]):
    @vf.stop
    async def enough_turns(self, trace: vf.Trace) -> bool:
        # one call per word and the answer; a model that keeps calling still ends
        return trace.num_turns >= len(self.data.words) + 2

    @vf.reward(weight=1.0)
    async def recalled(self, trace: vf.Trace) -> float:
        found = re.search(r"<answer>(.*?)</answer>", trace.last_reply or "", re.DOTALL)
        return float(found is not None and found.group(1).strip() == ", ".join(self.data.words))

    @vf.metric
    async def kept(self, trace: vf.Trace) -> float:
        return float(len(trace.state.words))


class NotesConfig(vf.TasksetConfig):
    tools: NotebookConfig = NotebookConfig()


class NotesTaskset(vf.Taskset[NotesTask, NotesConfig]):
    @classmethod
    def toolsets(cls, config: NotesConfig) -> list[vf.Toolset]:
        return [NotebookToolset(config.tools)]

    def load(self) -> list[NotesTask]:
        tasks = []
        for idx, words in enumerate(WORD_LISTS):
            prompt = (
                "Jot each of these words in the notebook, one tool call per word, in "
                f"order: {' '.join(words)}. Then answer with the notebook's last reply "
                "between <answer> and </answer>."
            )
            data = NotesData(idx=idx, prompt=prompt, words=list(words))
            tasks.append(NotesTask(data, self.config.task))
        return tasks
