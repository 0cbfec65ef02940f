"""Chores graded inside the task's own box: each task names the image it runs in
(``TaskData.image``), or, with ``sealed``, its class declares ``NEEDS_CONTAINER``; one
reward reads the box itself through the runtime (its OS release). The shape of
upstream's container tasksets: vfops runs it in verifiers' own podman runtime, with
``--image-map`` pointing the image at a local one (tests/v1/test_verifiers_v1.py), and
refuses it in one line when the image is not on the host (tests/v1/test_v1_refusals.py)."""

import verifiers.v1 as vf


class BoxData(vf.TaskData):
    path: str
    codename: str = "bookworm"


class BoxTask(vf.Task[BoxData]):
    @vf.reward(weight=1.0)
    async def names_the_file(self, trace: vf.Trace) -> float:
        return float(self.data.path in (trace.last_reply or ""))

    @vf.reward(weight=0.5)
    async def box_is_the_tasks(self, trace: vf.Trace, runtime) -> float:
        # graded inside the task's container: its OS is the release the task names
        found = await runtime.run(["cat", "/etc/os-release"], {})
        return float(f"VERSION_CODENAME={self.data.codename}" in found.stdout)


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
                codename="bookworm" if i % 3 else "bullseye",
            )
            yield task_class(data, self.config.task)
