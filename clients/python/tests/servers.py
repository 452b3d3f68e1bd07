# SPDX-License-Identifier: Apache-2.0
"""WSGI and ASGI servers on free loopback ports, in threads of the test process."""

from __future__ import annotations

import threading
import time
from typing import Any

from harness import eventually, free_port


class WSGIServer:
    """werkzeug's threaded server (Flask's), one thread per request."""

    def __init__(self, app: Any):
        from werkzeug.serving import make_server
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ASGIServer:
    """uvicorn, on an event loop of its own thread."""

    def __init__(self, app: Any):
        import uvicorn
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical", lifespan="off",
                                access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        eventually("uvicorn", lambda: bool(self.server.started), 10)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        time.sleep(0)
