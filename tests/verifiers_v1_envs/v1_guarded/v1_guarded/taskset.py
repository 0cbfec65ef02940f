"""Model replies checked on their way back to the harness, before it sees them.

Each task asks for one word; what the interception does with the reply depends on it:
``HALT`` trips a response stop (the trace ends, stop condition ``halted``); ``SECRET``
is rewritten by a plain interceptor; a ``DISPUTED`` reply goes to a referee model (the
``referee`` judge of the task config) and is rewritten when it says VETO; ``TALLY`` only
records a metric; ``PLAIN`` passes untouched. The reward says whether the guard acted."""

import verifiers.v1 as vf

WORDS = ("HALT", "SECRET", "DISPUTED loudly", "DISPUTED calmly", "TALLY", "PLAIN")
REFEREE_PROMPT = (
    "You referee replies before the user reads them. Answer VETO if the reply below "
    "is loud, PASS otherwise.\n\nConversation:\n{transcript}\n\nReply under review:\n{reply}"
)


class GuardedTaskConfig(vf.TaskConfig):
    referee: vf.JudgeConfig = vf.JudgeConfig()


class GuardedTask(vf.Task[vf.TaskData, vf.State, GuardedTaskConfig]):
    @vf.stop
    def halted(self, response: vf.Response) -> bool:
        return "HALT" in (response.message.content or "")

    @vf.intercept(priority=10)
    def redact(self, response: vf.Response) -> vf.Response | None:
        if "SECRET" not in (response.message.content or ""):
            return None
        return response.model_copy(update={"message": vf.AssistantMessage(content="[redacted]")})

    @vf.intercept
    async def referee(self, response: vf.Response, trace: vf.Trace) -> vf.Response | None:
        reply = response.message.content or ""
        if "DISPUTED" not in reply:
            return None
        asked = REFEREE_PROMPT.format(transcript=trace.transcript, reply=reply)
        verdict = await vf.Judge(self.config.referee).complete(asked, trace=trace)
        choice = vf.parse_judge_choice(verdict.text, choices=("VETO", "PASS"))
        if choice is None:
            raise ValueError(f"the referee gave no VETO/PASS verdict: {verdict.text!r}")
        if choice == "PASS":
            return None
        return response.model_copy(update={"message": vf.AssistantMessage(content="[vetoed]")})

    @vf.intercept
    def tally(self, response: vf.Response, trace: vf.Trace) -> None:
        if "TALLY" in (response.message.content or ""):
            trace.record_metric("guard/tallied", 1.0)

    @vf.reward
    async def guarded(self, trace: vf.Trace) -> float:
        acted = trace.response_rewrites or trace.stop_condition == "halted"
        return float(bool(acted) or "guard/tallied" in trace.metrics)


class GuardedConfig(vf.TasksetConfig):
    task: GuardedTaskConfig = GuardedTaskConfig()


class GuardedTaskset(vf.Taskset[GuardedTask, GuardedConfig]):
    def load(self) -> list[GuardedTask]:
        return [
            GuardedTask(vf.TaskData(idx=idx, prompt=f"Say exactly: {word}"), self.config.task)
            for idx, word in enumerate(WORDS)
        ]
