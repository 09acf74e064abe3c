"""A typed OpenEnv client for ``simpop openenv serve`` (:mod:`simpop.integrations.openenv_server`).

:class:`SimpopEnvClient` is OpenEnv's own ``EnvClient`` (one WebSocket session, one env on the server)
with simpop's action, observation and state types::

    from simpop.integrations.openenv_client import SimpopEnvClient

    with SimpopEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=0)                   # scenario_id=..., member=... (panel servers)
        while not result.done:
            result = env.step("Would you consider donating to Save the Children?")   # or an act index
            print(result.observation.reply, result.reward, result.metadata["simulator"])

``step`` takes a :class:`~simpop.integrations.openenv_server.SimpopAction`, or the bare text / act index.
A session lives as long as its WebSocket: when the server has closed it (``--session-idle-timeout``, say), a
``step`` or ``state`` raises ``ConnectionError`` with the server's reason, and the next ``reset`` opens a new
session (OpenEnv's client would reconnect silently, into a session without the episode).
"""

from __future__ import annotations

from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult

from simpop.integrations.openenv_server import SimpopAction, SimpopObservation, SimpopState


class SimpopEnvClient(EnvClient[SimpopAction, SimpopObservation, SimpopState]):
    """OpenEnv's WebSocket client, typed for simpop servers (see the module docstring)."""

    async def _send(self, message: dict[str, Any]) -> None:
        """OpenEnv's send; but a step or state on a socket the server closed raises the server's reason."""
        ws = self._ws
        if message.get("type") != "reset" and ws is not None and ws.close_code is not None:
            await self._disconnect_async()  # the next call (a reset) connects afresh
            raise ConnectionError(f"the server closed this session ({ws.close_code}: {ws.close_reason or 'no reason'})"
                                  "; reset to start a new one")
        await super()._send(message)

    def _step_payload(self, action: SimpopAction | str | int) -> dict[str, Any]:
        if not isinstance(action, SimpopAction):
            action = SimpopAction(message=action)
        return action.model_dump(exclude_defaults=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SimpopObservation]:
        fields = dict(payload.get("observation", {}))
        metadata = payload.get("metadata") or fields.pop("metadata", None) or {}
        fields.pop("metadata", None)
        observation = SimpopObservation(**fields, reward=payload.get("reward"), done=bool(payload.get("done")),
                                        metadata=metadata)
        return StepResult(observation=observation, reward=payload.get("reward"), done=bool(payload.get("done")),
                          metadata=metadata)

    def _parse_state(self, payload: dict[str, Any]) -> SimpopState:
        return SimpopState(**payload)
