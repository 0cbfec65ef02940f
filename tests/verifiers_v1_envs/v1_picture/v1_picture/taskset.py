"""Coloured squares shown over several turns, spelled as letters: a user that sends images.

Each square is a tiny PNG (2x2 pixels of one colour) in a ``data:`` URL, sent as an image
part of a user message. The first turn's squares are the task's prompt; the taskset's
``Env`` then plays the user, sending each later turn's squares after the previous reply.
After every turn the model answers with the letters of all squares so far (the key is in
the system prompt). The reward is an exact match of the last answer with the whole word;
a metric counts the letters in place."""

import base64
import re
import struct
import zlib

import verifiers.v1 as vf

COLOURS = {
    "red": ((255, 0, 0), "A"),
    "green": ((0, 255, 0), "B"),
    "blue": ((0, 0, 255), "C"),
    "yellow": ((255, 255, 0), "D"),
    "grey": ((128, 128, 128), "E"),
}
EPISODES = (
    (("red", "blue"), ("green",)),
    (("yellow",), ("grey", "red"), ("blue",)),
    (("green", "green"), ("yellow", "blue")),
    (("blue",), ("red",), ("grey",)),
)
SYSTEM = (
    "You will be shown coloured squares over a few turns. Colours stand for letters: "
    + ", ".join(f"{name}={letter}" for name, (_, letter) in COLOURS.items())
    + ". After each turn, answer with the letters of every square shown so far, in order, "
    "between <code> and </code>."
)


def png_square(rgb: tuple[int, int, int], side: int = 2) -> bytes:
    """A ``side`` x ``side`` PNG of one colour (8-bit RGB, no filtering)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    rows = b"".join(b"\x00" + bytes(rgb) * side for _ in range(side))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def squares_message(colours: tuple[str, ...], text: str) -> vf.UserMessage:
    parts: list = [
        vf.ImageUrlContentPart(
            image_url=vf.ImageUrlSource(
                url="data:image/png;base64," + base64.b64encode(png_square(COLOURS[c][0])).decode()
            )
        )
        for c in colours
    ]
    parts.append(vf.TextContentPart(text=text))
    return vf.UserMessage(content=parts)


def code_of(reply: str) -> str:
    found = re.search(r"<code>(.*?)</code>", reply, re.DOTALL)
    return found.group(1).strip() if found else ""


class PictureData(vf.TaskData):
    answer: str
    turns: list[list[str]]


class PictureTask(vf.Task[PictureData]):
    def _last_code(self, trace: vf.Trace) -> str:
        replies = trace.assistant_messages
        return code_of((replies[-1].content or "") if replies else "")

    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(self._last_code(trace) == self.data.answer)

    @vf.metric
    async def letters_in_place(self, trace: vf.Trace) -> float:
        code = self._last_code(trace)
        return sum(a == b for a, b in zip(code, self.data.answer, strict=False)) / len(
            self.data.answer
        )


class PictureEnv(vf.SingleAgentEnv):
    """The user: the prompt's squares open the exchange; each later turn's follow."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            for colours in task.data.turns[1:]:
                if segment.terminated:
                    break
                text = f"{len(colours)} more square(s)."
                segment = await interaction.turn([squares_message(tuple(colours), text)])


class PictureTaskset(vf.Taskset[PictureTask, vf.TasksetConfig]):
    def load(self) -> list[PictureTask]:
        tasks = []
        for idx, turns in enumerate(EPISODES):
            answer = "".join(COLOURS[c][1] for turn in turns for c in turn)
            opening = squares_message(turns[0], f"{len(turns[0])} square(s).")
            data = PictureData(
                idx=idx,
                prompt=[opening],
                system_prompt=SYSTEM,
                answer=answer,
                turns=[list(t) for t in turns],
            )
            tasks.append(PictureTask(data, self.config.task))
        return tasks
