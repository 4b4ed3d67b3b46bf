"""The event loop a test session runs its asyncio code on.

Most FastAPI services run on uvloop (``uvicorn[standard]`` picks it when installed), whose loop
schedules callbacks, cancels waits and runs executors differently from the standard library's.
``OUTBOX_TEST_EVENT_LOOP=uvloop`` runs a whole session's ``asyncio.run`` and
``asyncio.new_event_loop`` on it, so the asyncio forms' guarantees are walked on the loop users
deploy on, not only on the one the tests were written on.
"""

from __future__ import annotations

import asyncio
import importlib

from outbox.testing.service import ServiceStartError


def use_event_loop(name: str) -> None:
    """Make ``name`` ("asyncio" or "uvloop") the loop every new event loop of this process is.
    "asyncio" leaves the policy as it is (a policy the user's own conftest set stays).

    Raises:
        ServiceStartError: "uvloop" without the ``uvloop`` package installed.
    """
    if name == "asyncio":
        return
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as err:
        raise ServiceStartError(
            f"OUTBOX_TEST_EVENT_LOOP={name!r} needs the uvloop package: `pip install uvloop` "
            "(this project's dev extra has it), or unset the variable to run on asyncio's loop"
        ) from err
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def running_loop_name() -> str:
    """ "uvloop" or "asyncio": whose loop ``asyncio.run`` makes now (the session's check that the
    setting took)."""

    async def name() -> str:
        module = type(asyncio.get_running_loop()).__module__
        return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"

    return asyncio.run(name())
