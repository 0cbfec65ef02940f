"""``kill -9`` of a training resume at every point of its checkpoint save, then the same
command again: does the next resume refuse in one line or match a clean resume bit for
bit? The whole ``vfops train`` CLI on the tiny CPU model::

    .venv/bin/python bench/checkpoint_kills.py             # every point, once each
    .venv/bin/python bench/checkpoint_kills.py --reps 3    # each point 3 times

A 2-step run writes ``final``; a clean resume to 4 steps (its own folder) gives the
reference weights. For each kill point (vfops.training._manifest.KILL_POINT_ENV: the
writer SIGKILLs itself there, what ``kill -9`` does at that instant) a copy of the
2-step folder is resumed into itself (the README's resume into the run's own folder:
``final`` is what it reads and what it replaces), killed, then resumed again. Each row:
the killed run's exit code, what it left beside ``final``, the next resume's exit code
(or its one-line refusal) and whether its weights (the exported model and accelerate's
copy) are byte-identical to the clean resume's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.checkpoint_harness import SMALL_CONFIG, train, weights  # noqa: E402

POINTS = ("staging", "sealed", "aside", "published")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--points", nargs="*", default=list(POINTS), choices=POINTS)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vfops-ckpt-kills-") as tmp:
        root = Path(tmp)
        config = root / "c.toml"
        config.write_text(SMALL_CONFIG.format(model=root / "tiny", out=root / "base"))
        first = train(config)
        assert first.returncode == 0, first.stderr[-3000:]
        clean = train(
            config, "--steps", "4", "--resume", str(root / "base" / "final"),
            "--output-dir", str(root / "clean"),
        )  # fmt: skip
        assert clean.returncode == 0, clean.stderr[-3000:]
        reference = weights(root / "clean" / "final")
        print(f"{'point':<10} {'killed':>6}  {'left beside final':<28} {'next':>4}  result")
        bad = 0
        for point in opts.points:
            for rep in range(opts.reps):
                out = root / f"{point}-{rep}"
                shutil.copytree(root / "base", out)
                command = ["--steps", "4", "--resume", str(out / "final"), "--output-dir", str(out)]
                killed = train(config, *command, kill_at=point)
                left = sorted(p.name for p in out.iterdir() if p.name != "final")
                started = time.perf_counter()
                again = train(config, *command)
                took = time.perf_counter() - started
                if again.returncode == 0:
                    same = weights(out / "final") == reference
                    result = "bit-identical" if same else "DIFFERENT WEIGHTS"
                    bad += not same
                elif again.returncode == 2 and again.stderr.strip().count("\n") == 0:
                    result = f"refused: {again.stderr.strip()}"
                else:
                    result = f"FAILED: {again.stderr.strip()[-300:]}"
                    bad += 1
                print(
                    f"{point:<10} {killed.returncode:>6}  {', '.join(left) or '-':<28} "
                    f"{again.returncode:>4}  {result} ({took:.1f} s)"
                )
        print(f"{bad} bad outcome(s)")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
