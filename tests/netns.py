"""Two hosts on one machine: two Linux network namespaces joined by a veth pair.

`TwoHosts()` makes namespaces `<prefix>a` and `<prefix>b` (a prefix unique to this run: the
process id and a random suffix, so parallel runs never collide), one veth end in each, with the
link-local addresses 169.254.77.1 and 169.254.77.2 (/30; nothing outside the two namespaces has
a route to them, and each pair of namespaces has its own, so runs side by side do not meet).
Loopback is up in each. `close()` (also at exit, and from the pytest fixture's finalizer) kills
what still runs inside them and deletes both; the veth pair goes with them.

Open MPI crosses the link with `mpirun_command`: mpirun itself runs in namespace a, its host list
names `localhost` (one rank, in a) and namespace b (one rank); mpirun starts b's daemon through
its rsh launcher, with an "agent" that is not ssh but `ip netns exec <b>` (this file writes it
into its folder). The daemon then calls back to mpirun over the veth (the oob), and the ranks
talk over TCP only (`--mca btl tcp,self`, no shared memory) on the veth's subnet, named by CIDR
because each end has its own interface name.

Needs root and iproute2 (`ip`, and `tc` for `rate_limit`); `unavailable()` says why not.
"""
from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

SUBNET = "169.254.77.0/30"
ADDRESSES = ("169.254.77.1", "169.254.77.2")
# Every command this file runs is bounded: ip and tc answer in milliseconds.
_COMMAND_TIMEOUT_S = 20.0

# The launcher mpirun calls as "AGENT HOST COMMAND...": HOST is a namespace name here.
_AGENT = """#!/bin/sh
namespace="$1"; shift
exec ip netns exec "$namespace" /bin/sh -c "$*"
"""


def unavailable() -> str | None:
    """Why two namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2's `{tool}` (apt-get install iproute2)"
    return None


def _run(argv: Sequence[str]) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True,
                          timeout=_COMMAND_TIMEOUT_S)
    if done.returncode != 0:
        raise OSError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


class TwoHosts:
    """Two network namespaces joined by a veth pair; see the module's text."""

    def __init__(self) -> None:
        self.prefix = f"gk{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.namespaces = (self.prefix + "a", self.prefix + "b")
        self.interfaces = (self.prefix + "x", self.prefix + "y")  # a's end, b's end
        self.addresses = ADDRESSES
        self.folder = tempfile.mkdtemp(prefix=self.prefix + "-")
        self._made: list[str] = []
        atexit.register(self.close)
        try:
            for namespace in self.namespaces:
                _run(["ip", "netns", "add", namespace])
                self._made.append(namespace)
            _run(["ip", "link", "add", self.interfaces[0], "type", "veth", "peer", "name",
                  self.interfaces[1]])
            for namespace, interface, address in zip(self.namespaces, self.interfaces,
                                                     self.addresses):
                # Moved into its namespace at once: no veth end outlives the namespaces.
                _run(["ip", "link", "set", interface, "netns", namespace])
                _run(["ip", "-n", namespace, "addr", "add", f"{address}/30", "dev", interface])
                _run(["ip", "-n", namespace, "link", "set", interface, "up"])
                _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        except BaseException:
            self.close()
            raise
        self.agent = os.path.join(self.folder, "netns-agent.sh")
        with open(self.agent, "w") as f:
            f.write(_AGENT)
        os.chmod(self.agent, 0o700)
        self.hostfile = os.path.join(self.folder, "hosts")
        with open(self.hostfile, "w") as f:
            f.write(f"localhost slots=1\n{self.namespaces[1]} slots=1\n")

    def exec(self, host: int, argv: Sequence[str]) -> list[str]:
        """`argv` run inside namespace `host` (0: a, 1: b)."""
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def mpirun_command(self, argv: Sequence[str], env: Sequence[str] = ()) -> list[str]:
        """`mpirun` with one rank per namespace (rank 0 in a, rank 1 in b), over TCP on the
        veth only; `env`: variables forwarded to the ranks (`-x`)."""
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise OSError("needs Open MPI's mpirun (apt-get install openmpi-bin)")
        forwarded = [arg for name in env for arg in ("-x", name)]
        return self.exec(0, [
            mpirun, "-n", "2", "--allow-run-as-root", "--hostfile", self.hostfile,
            "--mca", "plm_rsh_agent", self.agent,
            "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", SUBNET,
            "--mca", "oob_tcp_if_include", SUBNET, *forwarded, *argv])

    def rate_limit(self, rate: str | None) -> None:
        """Shape both directions of the link with a token bucket (`tc ... tbf`) at `rate`
        (tc's units: "100mbit", "1gbit"); None removes the limit. The bucket holds 1 ms of
        traffic at the rate (at least 64 KiB, a TSO segment), packets wait at most 100 ms."""
        for namespace, interface in zip(self.namespaces, self.interfaces):
            subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev",
                            interface, "root"], capture_output=True, timeout=_COMMAND_TIMEOUT_S)
            if rate is None:
                continue
            bits = _bits_per_second(rate)
            burst = max(64 * 1024, bits // 8 // 1000)
            _run(["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", interface,
                  "root", "tbf", "rate", rate, "burst", str(burst), "latency", "100ms"])

    def pids(self) -> list[int]:
        """Processes running inside either namespace."""
        found: list[int] = []
        for namespace in self._made:
            done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                  text=True, timeout=_COMMAND_TIMEOUT_S)
            found += [int(p) for p in done.stdout.split()]
        return found

    def close(self) -> None:
        """Kill what still runs in the namespaces (TERM, then KILL after 5 s) and delete
        them; safe to call twice."""
        if not self._made:
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        signals = [signal.SIGTERM] * 50 + [signal.SIGKILL] * 20  # 5 s, then 2 s: bounded
        for sig in signals:
            left = self.pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for namespace in self._made:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True,
                           timeout=_COMMAND_TIMEOUT_S)
        self._made = []
        # A veth end not yet moved into its namespace (a failure in between) is deleted here;
        # one that was went with its namespace (the command then fails: nothing to delete).
        subprocess.run(["ip", "link", "del", self.interfaces[0]], capture_output=True,
                       timeout=_COMMAND_TIMEOUT_S)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> TwoHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bits_per_second(rate: str) -> int:
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return int(float(rate[:-len(unit)]) * scale)
    raise ValueError(f"rate {rate!r}: give tc's form, e.g. '100mbit' or '1gbit'")


if __name__ == "__main__":  # a quick look: make the pair, print it, remove it
    reason = unavailable()
    if reason:
        sys.exit(reason)
    with TwoHosts() as hosts:
        print(hosts.namespaces, hosts.interfaces, hosts.addresses)
