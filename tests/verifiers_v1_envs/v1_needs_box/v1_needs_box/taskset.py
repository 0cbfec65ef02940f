"""Shell chores graded inside the task's own box: each task names the image it runs in
(``TaskData.image``), or, with ``sealed``, its class declares ``NEEDS_CONTAINER``. The
shape of upstream's container tasksets; vfops runs tasks in-process, so it refuses this
one in one line before anything starts (tests/v1/test_v1_refusals.py)."""

import verifiers.v1 as vf


class BoxData(vf.TaskData):
    path: str


class BoxTask(vf.Task[BoxData]):
    @vf.reward(weight=1.0)
    async def names_the_file(self, trace: vf.Trace) -> float:
        # a real grader would look for the file in the box; never reached under vfops
        return float(self.data.path in (trace.last_reply or ""))


class SealedBoxTask(BoxTask):
    NEEDS_CONTAINER = True


class BoxConfig(vf.TasksetConfig):
    size: int = 3
    image: str | None = "localhost/v1-box:latest"
    sealed: bool = False


class BoxTaskset(vf.Taskset[BoxTask, BoxConfig]):
    def load(self):
        task_class = SealedBoxTask if self.config.sealed else BoxTask
        for i in range(self.config.size):
            path = f"/srv/chore-{i}.txt"
            data = BoxData(
                prompt=f"Create {path} holding the word done, then say its path.",
                image=self.config.image,
                path=path,
            )
            yield task_class(data, self.config.task)
