"""A rendezvous store that holds its port from the moment the port is known.

Picking a free port (bind port 0, read it, close the socket) and letting rank 0 bind it
later leaves a gap in which another process, such as a second verify beside this one,
can take the port: rank 0 then fails with "address already in use", or the other ranks
join the wrong job's store. Here the store is served by the process that starts the
ranks, bound as the OS picks the port, and every rank joins it as a client: what
torchrun does for its workers, which TORCHELASTIC_USE_AGENT_STORE=True tells
`init_process_group` (env:// and tcp://) to expect.
"""

from __future__ import annotations

import torch.distributed as dist

HOST = "127.0.0.1"
AGENT_STORE_VARIABLE = "TORCHELASTIC_USE_AGENT_STORE"


def serve_store(world_size: int) -> dist.TCPStore:
    """A TCPStore served from this process (on a thread of its own) at HOST, on a port chosen as it binds.

    Keep it referenced while the ranks run: the server stops when it is collected.
    """
    return dist.TCPStore(HOST, 0, world_size, is_master=True, wait_for_workers=False)


def client_environment(store: dist.TCPStore) -> dict[str, str]:
    """The variables that make a rank's `init_process_group()` join `store` as a client."""
    return {"MASTER_ADDR": HOST, "MASTER_PORT": str(store.port), AGENT_STORE_VARIABLE: "True"}
