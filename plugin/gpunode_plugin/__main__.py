"""Entry point the container image runs: ``gpunode-device-plugin``."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time

from gpunode_plugin import __version__
from gpunode_plugin.config import ConfigError, load
from gpunode_plugin.manager import PluginManager, StartupError


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)), "level": record.levelname,
                 "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--version" in args:
        print(f"gpunode-device-plugin {__version__}")
        return 0
    try:
        config = load(args, dict(os.environ))
    except ConfigError as error:
        print(f"gpunode-device-plugin: configuration error: {error}", file=sys.stderr)
        return 2
    setup_logging(config.log_format)
    log = logging.getLogger("gpunode_plugin")
    manager = PluginManager(config, dict(os.environ))
    stopped = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        manager.start()
    except StartupError as error:
        log.error("cannot start: %s", error)
        print(f"gpunode-device-plugin: {error}", file=sys.stderr)
        manager.stop()
        return 1
    http_server = None
    if config.http_address:
        from gpunode_plugin.http import serve

        http_server = serve(manager, config.http_address)
        log.info("probes and metrics on http://%s/", config.http_address)
    while not stopped.wait(1):
        pass
    manager.stop()
    if http_server:
        http_server.shutdown()
    log.info("stopped; removed our sockets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
