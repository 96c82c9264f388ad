"""A fake HAProxy stats socket for the unit tests (no HAProxy, no socat): a threading UNIX socket server that answers
as HAProxy's runtime API does in non-interactive mode (doc/management.txt, "9.3. Unix Socket commands": one command
line, the answer, then the connection closes; `set server` answers an empty line when taken), from the `show stat`
captured from Debian's HAProxy 3.0.11 (tests/contracts/haproxy/show-stat.csv), and records every command."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CAPTURED = [line for line in (ROOT / "tests/contracts/haproxy/show-stat.csv").read_text().splitlines()
            if line.strip() and not line.startswith("#!")]  # fmt: skip


class OneLineSocket:
    """A UNIX socket server in a thread that talks as HAProxy's CLIs do in non-interactive mode (management.txt 9.3 and
    9.4): it reads one command line, records it, sends ``answer(command)`` and closes the connection."""

    # HAProxy's master CLI answers and then waits for the client to close its side (the HAProxy maintainer's review
    # on 2.6.12 and 3.0.11); the stats socket closes after answering
    close_on_eof = False

    def __init__(self, path: str) -> None:
        self.path = path
        self.commands: list[str] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                command = data.decode().rstrip("\n")
                self.commands.append(command)
                answer = self.answer(command)
                conn.sendall(answer if isinstance(answer, bytes) else answer.encode())
                if self.close_on_eof:
                    conn.settimeout(30)
                    with contextlib.suppress(OSError):
                        while conn.recv(4096):
                            pass

    def answer(self, command: str) -> str | bytes:
        """What to send back (text, or bytes sent as they are)."""
        raise NotImplementedError

    def close(self) -> None:
        self.server.close()


class FakeHAProxy(OneLineSocket):
    """HAProxy's stats socket, non-interactive: reads one line, answers, closes. ``show stat`` prints the captured CSV
    with each server's current status and scur; ``set server B/S state X`` changes the status (DRAIN, UP, MAINT) and
    answers an empty line, or ``No such server.``; ``refuse`` makes every set answer that text. ``scur`` and
    ``status`` may hold a list per server: one value per ``show stat``, the last one repeated."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.rows = [line.split(",") for line in CAPTURED[1:]]
        self.scur: dict[tuple[str, str], list[int]] = {}
        self.status: dict[tuple[str, str], list[str]] = {}
        self.after_set: dict[tuple[str, str], list[str]] = {}  # the statuses a set server leads to (health checks)
        self.refuse = ""
        self.answer_stat: str | None = None
        self.servers_state = "Unknown command.\n"  # the answer to `show servers state` (management.txt 9.3)
        self.pid = 4242  # the worker that answers (`show info`'s Pid)
        self.infos = 0
        self.thread.start()

    def next_value(self, table: dict[tuple[str, str], list[Any]], key: tuple[str, str]) -> Any:
        values = table.get(key)
        if not values:
            return None
        return values.pop(0) if len(values) > 1 else values[0]

    def answer(self, command: str) -> str:
        # `a;b` runs a then b on the same worker (management.txt 9.3); `show info` there names the worker (Pid), and is
        # counted in `infos`, not in `commands` (the module prefixes every change with it: d3_server_state.ask_as)
        if ";" in command:
            self.commands.pop()
            parts = command.split(";")
            out = ""
            for part in parts:
                if part == "show info":
                    self.infos += 1
                    out += f"Name: HAProxy\nVersion: 3.0.11-1+deb13u4\nPid: {self.pid}\nProcess_num: 1\n\n"
                else:
                    self.commands.append(part)
                    out += type(self).answer(self, part)  # not an instance spy: it saw the whole line
            return out
        if command == "show info":
            self.commands.pop()
            self.infos += 1
            return f"Name: HAProxy\nVersion: 3.0.11-1+deb13u4\nPid: {self.pid}\nProcess_num: 1\n\n"
        if command == "show stat":
            if self.answer_stat is not None:
                return self.answer_stat
            lines = [CAPTURED[0]]
            for row in self.rows:
                key = (row[0], row[1])
                scur, status = self.next_value(self.scur, key), self.next_value(self.status, key)
                row[4] = str(scur) if scur is not None else row[4]
                row[17] = status if status is not None else row[17]
                lines.append(",".join(row))
            return "\n".join(lines) + "\n\n"
        if command == "show servers state":
            return self.servers_state
        words = command.split(" ")
        if len(words) == 5 and words[:2] == ["set", "server"] and words[3] == "state":
            if self.refuse:
                return self.refuse + "\n\n"
            backend, _, name = words[2].partition("/")
            for row in self.rows:
                if (row[0], row[1]) == (backend, name):
                    row[17] = {"drain": "DRAIN", "ready": "UP", "maint": "MAINT"}[words[4]]
                    self.status.pop((backend, name), None)
                    # what the health checks do after a drain or a ready (a ready goes through maint first: not then)
                    if (backend, name) in self.after_set and words[4] != "maint":
                        self.status[(backend, name)] = self.after_set.pop((backend, name))
                    return "\n"
            return "No such server.\n\n"
        return "Unknown command. Please enter one of the following commands only :\n  help\n\n"

    @classmethod
    @contextmanager
    def started(cls) -> Iterator[FakeHAProxy]:
        """One fake in a short directory of /tmp (a UNIX socket path must stay under 108 bytes), removed after."""
        directory = tempfile.mkdtemp(prefix="d3hx", dir="/tmp")
        fake = cls(f"{directory}/admin.sock")
        try:
            yield fake
        finally:
            fake.close()
            shutil.rmtree(directory)


class FakeMaster(OneLineSocket):
    """HAProxy's master CLI (doc/management.txt, "9.4. Master CLI"), non-interactive: ``show proc`` lists the master
    and the workers of the next snapshot (the first current, the others old ones still finishing), in the layout of
    tests/contracts/haproxy/master-cli.yml; ``@!<pid> show stat`` answers that worker's ``show stat`` (the captured
    CSV, each server's scur from the snapshot, 0 else), or the master's answer for a pid it does not know. Each
    snapshot is {pid: {(backend, server): scur}}; the last one is repeated."""

    close_on_eof = True

    def __init__(self, path: str, snapshots: list[dict[int, dict[tuple[str, str], int]]]) -> None:
        super().__init__(path)
        self.snapshots = list(snapshots)
        self.current: dict[int, dict[tuple[str, str], int]] = {}
        self.answer_proc: str | None = None
        self.closed: set[int] = set()
        self.thread.start()

    def answer(self, command: str) -> str:
        if command == "show proc":
            if self.answer_proc is not None:
                return self.answer_proc
            self.current = self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]
            pids = list(self.current)
            lines = ["#<PID>          <type>          <reloads>       <uptime>        <version>",
                     "1000            master          1 [failed: 0]   0d00h01m00s     2.6.12-1+deb12u4", "# workers"]
            lines += [f"{pid}            worker          0               0d00h00m10s     2.6.12-1+deb12u4" for pid in pids[:1]]
            lines += ["# old workers"]
            lines += [f"{pid}            worker          1               0d00h00m50s     2.6.12-1+deb12u4" for pid in pids[1:]]
            lines += ["# programs", ""]
            return "\n".join(lines) + "\n"
        if command.startswith("@!") and command.endswith(" show stat"):
            pid = int(command[2:].split(" ")[0])
            if pid not in self.current:
                return f"Can't find the target PID matching the prefix '@!{pid}'\n"  # master-cli.yml: unknown_pid_answer_3_0
            if pid in self.closed:
                return ""  # a reload closed the master CLI's connections before this worker answered
            lines = [CAPTURED[0]]
            for line in CAPTURED[1:]:
                row = line.split(",")
                row[4] = str(self.current[pid].get((row[0], row[1]), 0))
                lines.append(",".join(row))
            return "\n".join(lines) + "\n\n"
        return "Unknown command.\n"

    @classmethod
    @contextmanager
    def started(cls, snapshots: list[dict[int, dict[tuple[str, str], int]]]) -> Iterator[FakeMaster]:
        directory = tempfile.mkdtemp(prefix="d3mx", dir="/tmp")
        fake = cls(f"{directory}/master.sock", snapshots)
        try:
            yield fake
        finally:
            fake.close()
            shutil.rmtree(directory)
