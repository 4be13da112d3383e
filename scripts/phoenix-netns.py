"""Run Phoenix in a private network namespace, reachable on 127.0.0.1 only.

    python phoenix-netns.py DIR PHOENIX_EXECUTABLE

`scripts/phoenix start` runs this with the Phoenix venv's interpreter (it needs
only the standard library); see that script for why. In order, it:

1. binds two listeners on 127.0.0.1 of the *current* network namespace: one
   for HTTP (UI, REST API, OTLP/HTTP) and one for OTLP/gRPC, on the ports in
   TURNFSM_PHOENIX_HTTP_PORT / TURNFSM_PHOENIX_GRPC_PORT, or free ones (0);
2. moves itself into a new network namespace (`unshare(CLONE_NEWNET)`; if not
   root, inside a new user namespace too), brings its loopback up and checks
   that loopback is the only interface there;
3. starts `PHOENIX_EXECUTABLE serve` in that namespace on its fixed ports 6006
   and 4317 - private, so they clash with nothing - with telemetry and
   outside resources off, its database under DIR/phoenix;
4. forwards each connection accepted on the outer listeners to Phoenix: the
   listening sockets were made before step 2, so they stay in the outer
   namespace; the sockets it connects with are made after it, so they reach
   Phoenix's loopback.

It writes DIR/ports.json ({"http": port, "grpc": port}) once Phoenix is
started; Phoenix's output goes to DIR/phoenix.log. It stops Phoenix and exits
on SIGTERM or SIGINT, when Phoenix exits, and when the process
TURNFSM_PHOENIX_OWNER_PID (if set) is gone. Phoenix gets SIGTERM if this
process dies first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
PR_SET_PDEATHSIG = 1

INNER_HTTP_PORT = 6006
INNER_GRPC_PORT = 4317

# Phoenix's own switches: no analytics pixels, no web fonts or downloads, no
# assistant or MCP server (they would call out, and cost start-up time).
PHOENIX_ENV = {
    "PHOENIX_HOST": "127.0.0.1",
    "PHOENIX_PORT": str(INNER_HTTP_PORT),
    "PHOENIX_GRPC_PORT": str(INNER_GRPC_PORT),
    "PHOENIX_TELEMETRY_ENABLED": "false",
    "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
    "PHOENIX_ENABLE_MCP_SERVER": "false",
    "PHOENIX_AGENTS_DISABLE_BASH": "true",
    "PHOENIX_ENABLE_AUTH": "false",
    "PHOENIX_LOG_MIGRATIONS": "false",
}

libc = ctypes.CDLL(None, use_errno=True)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def enter_private_network() -> None:
    """Move this (single-threaded) process into a new network namespace."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return
    if ctypes.get_errno() != errno.EPERM:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    # Not root: a user namespace of our own grants the capabilities for the
    # network namespace it owns. Map our ids to themselves, so files Phoenix
    # writes keep their owner.
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(
            err,
            f"{os.strerror(err)}: unshare(CLONE_NEWUSER | CLONE_NEWNET); a private"
            " network namespace needs root (CAP_SYS_ADMIN) or unprivileged user"
            " namespaces",
        )
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def bring_loopback_up() -> None:
    """`ip link set lo up`, with an ioctl; fail unless lo is the only interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        (flags,) = struct.unpack_from("H", fcntl.ioctl(s, SIOCGIFFLAGS, request), 16)
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        raise RuntimeError(f"the private namespace has interfaces {names}")


def die_with_parent() -> None:
    """Run in the child before exec: SIGTERM it if the supervisor dies."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_phoenix(directory: Path, executable: str) -> subprocess.Popen[bytes]:
    """Start `executable serve` with a clean PHOENIX_/OTEL_ environment."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PHOENIX_", "OTEL_"))
    }
    env.update(PHOENIX_ENV, PHOENIX_WORKING_DIR=str(directory / "phoenix"))
    log = (directory / "phoenix.log").open("ab")
    return subprocess.Popen(
        [executable, "serve"],
        cwd=directory,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
    )


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction of a connection, then pass the half-close on."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


def forwarder(port: int) -> Handler:
    """Return a connection handler that forwards to 127.0.0.1:`port` (in here)."""

    async def handle(
        client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, writer), pipe(reader, client_writer))
        for w in (writer, client_writer):
            w.close()

    return handle


async def supervise(
    phoenix: subprocess.Popen[bytes],
    listeners: dict[str, socket.socket],
    owner: int | None,
) -> int:
    """Forward until told to stop or Phoenix exits; then stop Phoenix."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    inner = {"http": INNER_HTTP_PORT, "grpc": INNER_GRPC_PORT}
    servers = [
        await asyncio.start_server(forwarder(inner[kind]), sock=sock)
        for kind, sock in listeners.items()
    ]
    while not stop.is_set() and phoenix.poll() is None:
        if owner is not None and not pid_alive(owner):
            print(f"owner {owner} is gone", file=sys.stderr)
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    for server in servers:
        server.close()
    if (status := phoenix.poll()) is not None:
        print(f"phoenix exited with status {status}", file=sys.stderr)
        return status or 1
    phoenix.terminate()
    try:
        await asyncio.to_thread(phoenix.wait, 15)
    except subprocess.TimeoutExpired:
        phoenix.kill()
    return 0


def pid_alive(pid: int) -> bool:
    """Whether the process `pid` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def outer_port(name: str) -> int:
    """The outer port asked for `name` (http, grpc); 0 picks a free one."""
    return int(os.environ.get(f"TURNFSM_PHOENIX_{name.upper()}_PORT") or 0)


def main(argv: list[str]) -> int:
    """Bind, unshare, start Phoenix, forward; return Phoenix's exit status."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    directory, executable = Path(argv[0]).resolve(), argv[1]
    with contextlib.suppress(PermissionError):
        os.setsid()  # a terminal's Ctrl-C or the caller's group kill skips us
    listeners = {
        kind: socket.create_server(("127.0.0.1", outer_port(kind)))
        for kind in ("http", "grpc")
    }
    enter_private_network()
    bring_loopback_up()
    phoenix = start_phoenix(directory, executable)
    ports = {kind: sock.getsockname()[1] for kind, sock in listeners.items()}
    (directory / "ports.json").write_text(json.dumps(ports) + "\n")
    owner = os.environ.get("TURNFSM_PHOENIX_OWNER_PID")
    status = asyncio.run(supervise(phoenix, listeners, int(owner) if owner else None))
    print(f"stopped (status {status})", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
