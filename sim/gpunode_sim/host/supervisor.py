"""The fleet's host-side helper for what a node asks of its "hardware": reboots.

A node's ``reboot`` stand-in writes a request into the node's data folder; this
process (one per fleet, started by ``gpunode sim up``) restarts that node with
its disk kept, as pressing the reset button would.

    python -m gpunode_sim.host.supervisor STATE_DIR
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

from gpunode_sim.fleet import FleetState, restart_node
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.node.simnode import REBOOT_REQUEST

POLL = 0.5
# one node's restart at a time: a restart rewrites the fleet's record and the shared tools layer (two at once lost
# a node: "reboot of node02 failed: FileNotFoundError", when a roll rebooted two nodes together)
RESTARTING = threading.Lock()


def reboot(paths: SimPaths, name: str) -> None:
    time.sleep(1)  # the reboot command returns and the SSH session closes first, as on a real machine
    try:
        with RESTARTING:
            restart_node(paths, name, lambda line: print(line, file=sys.stderr, flush=True))
    except Exception as error:  # noqa: BLE001 - a failed reboot is logged; the node stays down
        print(f"reboot of {name} failed: {error!r}", file=sys.stderr, flush=True)


def main(state_dir: Path) -> None:
    environment = SimPaths.from_env()
    paths = SimPaths(state_dir, environment.cache, environment.net_block)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    while not stopping.wait(POLL):
        for request in (paths.state / "nodes").glob(f"*/data/gpunode-sim/{REBOOT_REQUEST}"):
            request.unlink(missing_ok=True)
            name = request.parents[2].name
            if name in FleetState(paths).data["nodes"]:
                threading.Thread(target=reboot, args=(paths, name), daemon=True).start()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
