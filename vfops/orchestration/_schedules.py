"""Cron schedules, checked with Prefect's own model before any deployment is made.

A nightly spec is validated when it is read (``vfops deploy --nightly-config``), long
before Prefect sees it: the check uses Prefect's schedule model, so it accepts exactly
what a deployment would, without a server. Prefect is imported on the first check.
"""

from __future__ import annotations

from vfops._errors import InvalidArgumentError


def check_cron(value: str) -> str:
    """``value`` when Prefect accepts it as a cron schedule, else a one-line ValueError
    (the message a pydantic validator shows)."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=value)
    except ValidationError:
        raise InvalidArgumentError(
            f"{value!r} is not a valid cron expression; use five fields: minute hour "
            'day-of-month month day-of-week, e.g. "0 3 * * *"'
        ) from None
    return value
