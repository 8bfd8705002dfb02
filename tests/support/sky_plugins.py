"""A SkyPilot API server plugin for the tests' local server (tests/test_skypilot_server.py).

SkyPilot's server config picks process-local request queues for a local server, one uvicorn worker
in one process (`sky.server.config`: `QueueBackend.LOCAL` when not `--deploy`), but SkyPilot 0.14.1's
`queues.base.get_queue_backend_factory()` never returns None, so that choice is never read and every
server spawns a request-queue manager process instead and waits a fixed 60 s for it to listen. On a
loaded CI machine the spawned manager (a fresh interpreter importing the whole server) missed the
60 s, three starts in a row, and a server whose start failed hangs at exit. This plugin, through
SkyPilot's own plugin API, registers SkyPilot's own `LocalQueueFactory`: what its config chose.
"""

from __future__ import annotations

import functools
from typing import Any

#: Logged at install, so the test can tell that its server runs on them.
INSTALLED = "orch tests: process-local request queues registered"


@functools.cache
def _local_request_queues() -> type:
    """The plugin class, made on first use: SkyPilot's server modules take seconds to import, and
    every test process imports this module at collection only for INSTALLED."""
    from sky import sky_logging
    from sky.server import plugins
    from sky.server.requests.queues import base

    logger = sky_logging.init_logger(__name__)

    class LocalRequestQueues(plugins.BasePlugin):
        """Registers the process-local request queues before the server's main process builds them."""

        load_contexts = frozenset({plugins.PluginContext.MAIN})

        def install(self, extension_context: plugins.ExtensionContext) -> None:
            extension_context.register_queue_backend_factory(base.LocalQueueFactory())
            logger.info(INSTALLED)

    return LocalRequestQueues


def __getattr__(name: str) -> Any:
    """`LocalRequestQueues`, as SkyPilot's plugin loader asks for it (`getattr` on this module)."""
    if name == "LocalRequestQueues":
        return _local_request_queues()
    raise AttributeError(name)
