"""A small aiohttp server on 127.0.0.1 (a free port) in a thread, for tests that talk HTTP to a fake engine.

Subclasses list their handlers in :meth:`LocalServer.routes`; ``with Sub(...) as server:`` starts it (``server.port``)
and stops it at the end, also when a test fails."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class LocalServer:
    def __init__(self):
        self.loop, self.ready = asyncio.new_event_loop(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def _run(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.add_routes(self.routes())
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(10), "the local test server did not start within 10 s"
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
