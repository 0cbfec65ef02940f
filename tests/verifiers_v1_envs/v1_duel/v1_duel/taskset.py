"""Two seats, one card each, one round of betting: a two-agent Env.

Each task is a hand, dealt from its seed. The Env opens an interaction with each seat
(``opener`` and ``responder``, two traces of one episode), asks the seat to act in turn
with its legal moves, checks each move and, when the hand is over, records the chips
each seat won as its ``chips`` reward: zero-sum, in ``run()``. Both put in one chip; the
opener checks or bets one more; after a check the responder checks (showdown for the
pot) or bets; a bet is called (showdown for the bigger pot) or folded (the bettor takes
the pot). A seat that answers twice without a legal move in brackets forfeits: it loses
one chip and its ``forfeited`` metric is 1."""

import random
import re
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

SEATS = ("opener", "responder")
NEXT_TO_ACT = {"": 0, "check": 1, "bet": 1, "check-bet": 0}
"""Who acts after a history of moves; a history not listed ends the hand."""
MOVES = {
    "": ("check", "bet"),
    "check": ("check", "bet"),
    "bet": ("call", "fold"),
    "check-bet": ("call", "fold"),
}
HANDS = 4

RULES = (
    "You are the {seat} in a one-card betting game against one other player. Cards run "
    "from 1 (lowest) to 5 (highest); each player put in one chip. The opener checks or "
    "bets one chip; after a check the responder checks or bets; a bet is called or "
    "folded. At a showdown the higher card takes the pot. Your card is {card}. Each time "
    "you act, reply with exactly one of the offered moves in square brackets."
)


def opener_net(history: str, cards: tuple[int, ...], forfeit: int | None) -> int:
    """Chips the opener wins (the responder loses as many) at the end of ``history``; a
    seat that forfeits loses one chip."""
    if forfeit is not None:
        return -1 if forfeit == 0 else 1
    higher = 1 if cards[0] > cards[1] else -1
    return {
        "check-check": higher,
        "bet-fold": 1,
        "check-bet-fold": -1,
        "bet-call": 2 * higher,
        "check-bet-call": 2 * higher,
    }[history]


def offered(legal: tuple[str, ...]) -> str:
    return " or ".join(f"[{m}]" for m in legal)


def chosen_move(reply: str, legal: tuple[str, ...]) -> str | None:
    picked = [m for m in re.findall(r"\[(\w+)\]", reply.lower()) if m in legal]
    return picked[0] if len(picked) == 1 else None


class DuelData(vf.TaskData):
    seed: int


class DuelTask(vf.Task[DuelData]):
    pass


class DuelEnvConfig(vf.EnvConfig):
    opener: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    responder: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    second_chances: int = Field(1, ge=0)
    """Second chances for a reply without a legal move, before the seat forfeits."""


class DuelEnv(vf.Env[DuelEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        cards = tuple(random.Random(task.data.seed).sample(range(1, 6), 2))
        seat_tasks = [
            vf.Task(
                vf.TaskData(
                    idx=task.data.idx,
                    prompt=None,
                    system_prompt=RULES.format(seat=seat, card=cards[i]),
                )
            )
            for i, seat in enumerate(SEATS)
        ]
        history: list[str] = []
        forfeit: int | None = None
        async with (
            agents.opener.interaction(seat_tasks[0]) as opener,
            agents.responder.interaction(seat_tasks[1]) as responder,
        ):
            seats = (opener, responder)
            while (key := "-".join(history)) in NEXT_TO_ACT:
                seat = NEXT_TO_ACT[key]
                move = await self._ask(seats[seat], history, MOVES[key])
                if move is None:
                    forfeit = seat
                    break
                history.append(move)
        net = opener_net("-".join(history), cards, forfeit)
        for i, interaction in enumerate((opener, responder)):
            trace = interaction.trace
            trace.record_reward("chips", float(net if i == 0 else -net))
            trace.record_metric("forfeited", float(forfeit == i))
            trace.info["duel"] = {"cards": list(cards), "moves": history, "forfeit": forfeit}

    async def _ask(self, seat: Any, history: list[str], legal: tuple[str, ...]) -> str | None:
        so_far = ", ".join(history) if history else "no moves yet"
        message = f"Moves so far: {so_far}. Your move: {offered(legal)}."
        for _ in range(self.config.second_chances + 1):
            segment = await seat.turn(message)
            if segment.terminated:
                return None
            move = chosen_move(segment.last_reply, legal)
            if move is not None:
                return move
            message = f"No legal move found. Reply with one of {offered(legal)}."
        return None


class DuelTaskset(vf.Taskset[DuelTask, vf.TasksetConfig]):
    def load(self) -> list[DuelTask]:
        return [
            DuelTask(DuelData(idx=idx, name=f"hand-{idx}", prompt=None, seed=idx), self.config.task)
            for idx in range(HANDS)
        ]
