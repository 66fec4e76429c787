"""Two machines on this one: network namespaces joined by a veth pair, each with a host name of its own, for the
jobs that run on several nodes (tests/test_nodes.py, tests/test_render.py). They need root."""
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import psutil
import pytest


class Nodes:
    """Two network namespaces joined by a veth pair: node0 (10.23x.y.1) and node1 (.2). A command run on a node runs
    in its namespace and in a UTS namespace of its own, whose host name is the node's, and resolves both names
    through /etc/netns/<namespace>/hosts, which `ip netns exec` mounts over /etc/hosts."""

    def __init__(self):
        self.tag = f"ft{os.getpid() % 100000}"
        subnet = f"10.{230 + os.getpid() % 20}.{os.getpid() % 250}"
        self.namespaces = [f"{self.tag}n{index}" for index in range(2)]
        self.addresses = [f"{subnet}.{index + 1}" for index in range(2)]
        links = [f"{self.tag}v{index}" for index in range(2)]
        commands = [["ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1]]]
        for namespace, link, address in zip(self.namespaces, links, self.addresses):
            commands = [["ip", "netns", "add", namespace], *commands]
            commands += [["ip", "link", "set", link, "netns", namespace],
                         ["ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", link],
                         ["ip", "-n", namespace, "link", "set", link, "up"],
                         ["ip", "-n", namespace, "link", "set", "lo", "up"]]
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                self.close()
                pytest.skip(f"two nodes need network namespaces, which this machine refused: {' '.join(command)}: "
                            f"{done.stderr.strip()}")
        hosts = "".join(f"{address} node{index}\n" for index, address in enumerate(self.addresses))
        for namespace in self.namespaces:
            Path("/etc/netns", namespace).mkdir(parents=True, exist_ok=True)
            Path("/etc/netns", namespace, "hosts").write_text(hosts)

    def also_name(self, node: int, name: str) -> None:
        """Let every node reach `node` by `name` too, as a cluster's DNS names a pod."""
        for namespace in self.namespaces:
            with Path("/etc/netns", namespace, "hosts").open("a") as hosts:
                hosts.write(f"{self.addresses[node]} {name}\n")

    def start(self, node: int, command: list[str], cwd: Path, log: Path, env: dict[str, str],
              own_folder: Path | None = None) -> subprocess.Popen:
        """`command` on node `node`, in the background; its output in `log`. The process is the command itself
        (every wrapper execs), so that killing it and its children kills the node. `own_folder`: a folder this node
        sees as a disk of its own (a tmpfs in its own mount namespace), where the other node sees the shared one."""
        inner = f"hostname node{node} && exec {shlex.join(command)}"
        unshare = ["unshare", "--uts"]
        if own_folder is not None:
            inner = f"mount -t tmpfs {self.tag} {shlex.quote(str(own_folder))} && {inner}"
            unshare += ["--mount", "--propagation", "private"]
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[node], *unshare, "sh", "-c", inner],
                                cwd=cwd, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT)

    def close(self) -> None:
        for namespace in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
            shutil.rmtree(Path("/etc/netns", namespace), ignore_errors=True)


def kill_node(agent: subprocess.Popen) -> None:
    """A node that dies: its torchrun agent and every process under it, at once."""
    tree = [*psutil.Process(agent.pid).children(recursive=True), psutil.Process(agent.pid)]
    for process in tree:
        process.kill()
    psutil.wait_procs(tree, timeout=30)
