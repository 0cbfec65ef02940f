"""Define a workshop term with a tool: each rollout gets its own MCP server
(``dictionary_define``), declared by the task class, started before the rollout and
stopped after it. The reply is right when it carries the definition the tool returned
for the asked term; the British spelling ``colour`` is not in the dictionary, so the
tool answers that it has no definition and that task scores 0. The server counts its
lookups in the rollout's state (``DictionaryState``), which verifiers syncs between the
server and the trace over the interception's per-rollout state channel."""

import re

import verifiers.v1 as vf

from v1_lookup.dictionary import TERMS, DictionaryState, DictionaryToolset

ASKED = ("kiln", "colour", "awl")


class LookupTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class LookupData(vf.TaskData):
    term: str
    answer: str


class LookupTask(vf.Task[LookupData, DictionaryState, LookupTaskConfig]):
    @classmethod
    def toolsets(cls, config: LookupTaskConfig) -> list[vf.Toolset]:
        return [DictionaryToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def defined(self, trace: vf.Trace) -> float:
        found = re.search(r"<answer>(.*?)</answer>", trace.last_reply or "", re.DOTALL)
        return float(found is not None and found.group(1).strip() == self.data.answer)

    @vf.metric
    async def lookups(self, trace: vf.Trace) -> float:
        # counted by the rollout's own server, in the state it syncs back to the trace
        return float(trace.state.lookups)


class LookupConfig(vf.TasksetConfig):
    task: LookupTaskConfig = LookupTaskConfig()


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    def load(self) -> list[LookupTask]:
        tasks = []
        for idx, term in enumerate(ASKED):
            prompt = (
                f'Find the meaning of "{term}" with the dictionary tool and answer with '
                "the definition it gives, between <answer> and </answer>."
            )
            data = LookupData(idx=idx, prompt=prompt, term=term, answer=TERMS.get(term, ""))
            tasks.append(LookupTask(data, self.config.task))
        return tasks
