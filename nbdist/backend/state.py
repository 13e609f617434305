"""One kernel's backend state: what it chose, planned and set as it joined a world, and what it puts back.

The session holds one :class:`BackendState` for the kernel's life; :mod:`nbdist.backend.setup` fills it in
as the rank joins (the session hands it this state, and the world where it needs it), and leaving a world puts
back what it changed (:meth:`BackendState.leave`).
"""

from __future__ import annotations

from typing import Any

from ..config import WorldConfig
from . import backends, debugmode, envplan, threads, userinit
from .environ import Environ
from .procgroup import destroy_default


class BackendState:
    """The backend, device and environment of one kernel's rank (see the module docstring)."""

    def __init__(self) -> None:
        self.choice: backends.Choice | None = None
        self.config: WorldConfig | None = None
        self.device: Any = None
        self.local_rank = 0
        self.env_plan: list[envplan.EnvVar] = []
        self.environ = Environ()  # what nbdist put in os.environ, to put back what was there
        self.pg_timeout = envplan.PG_TIMEOUT
        self.npu_seen: dict[str, str | None] | None = None  # what torch_npu read once in this process, if known
        self.npu_seen_when = ""
        self.notes: list[str] = []  # warnings for the init summary
        self.cpplog_note: str | None = None  # torch was imported first: its C++ log lines may show
        self.around_tunnel: envplan.EnvVar | None = None  # the interface chosen for the peers, the master on loopback
        self.user_init = userinit.UserInit()  # the notebook's own init_process_group, while in a world
        self.debug = debugmode.DebugMode()  # the world's %dist_debug switch, as applied here
        self.threads_before: int | None = None  # torch's thread count before nbdist set it (backend.threads)

    def choose(self, cfg: WorldConfig) -> backends.Choice:
        """As a rank joins ``cfg``'s world: the backend and device, before anything else is planned."""
        self.config = cfg
        self.choice = backends.choose(cfg.backend, cfg.device, 0)
        return self.choice

    def note_plan(self, built_hccl: str) -> None:
        """The init summary's warnings, once the plan is made: the choice's, the plan's, and values torch_npu
        will not read again (``built_hccl``: what :attr:`npu_seen_when` says when a group of this process read
        them)."""
        assert self.choice is not None
        self.notes = [*self.choice.warnings, *(v.warning for v in self.env_plan if v.warning),
                      *([self.cpplog_note] if self.cpplog_note else [])]
        late = envplan.stale(self.env_plan, self.npu_seen) if self.choice.backend == "hccl" else []
        if late:
            certain = self.npu_seen_when == built_hccl
            self.notes.append(
                f"these values {'will' if certain else 'may'} not take effect: {', '.join(late)}. torch_npu reads "
                f"them once per process, at its first HCCL process group, and {self.npu_seen_when}"
                f"{'' if certain else ' (a group made since keeps what torch_npu read then)'}. Restart the kernel "
                "and run %load_ext nbdist before anything imports torch")

    def environ_for_config(self) -> dict[str, str]:
        """The environment as the user set it: values nbdist itself set are left out."""
        return self.environ.as_user_set()

    def leave(self) -> None:
        """Leaving the world, once its group is cut: no default group, the switch's and plan's variables put back."""
        self.user_init.uninstall()
        destroy_default()
        self.debug.restore()
        self.environ.restore(keep=self.environ.early)

    def forget_device(self) -> None:
        """The last of leaving: no device, and torch's thread count as it was."""
        self.device = None
        if self.threads_before is not None:
            threads.apply(self.threads_before)
            self.threads_before = None
