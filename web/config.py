"""What the UI needs to know of the service it is mounted in (`web.mount_ui(app, config)`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class MountConfig:
    host: str  # the service's bind address and port: the UI calls its API there, on loopback
    port: int
    path: str  # where the service mounts the UI (its login form is PATH/login)
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # set: the UI asks for one at login
    request_timeout_s: float = 60.0  # the service's deadline: the UI waits 30 s longer for an event (30 s at least)
    max_upload_bytes: int | None = None  # the largest file the UI takes
    blocked: tuple[Path, ...] = ()  # folders the UI may never read (the model directory)

    @property
    def timeout_s(self) -> float:
        """The UI's longest wait for the service's next stream event."""
        return max(30.0, self.request_timeout_s + 30.0)
