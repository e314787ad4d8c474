"""Which addresses a process tree listens on, read from /proc (no tools needed): for the loopback-only checks."""
from __future__ import annotations

import ipaddress
import os
import socket
import struct


def descendants(pids) -> set[int]:
    """The processes and all their children, grandchildren, ..."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = set(), list(pids)
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.add(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return out


def _inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(link[8:-1])
    except OSError:
        pass
    return out


def _address(hex_addr: str) -> str:
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    else:
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(struct.pack("<I", struct.unpack(">I", raw[i:i + 4])[0])
                                                          for i in range(0, 16, 4)))
    return f"{ip}:{int(port_hex, 16)}"


def listening(pids) -> dict[str, list[str]]:
    """``{"tcp": [...], "udp": [...]}``: every listening TCP socket and bound UDP socket of these processes."""
    inodes = set().union(*(_inodes(p) for p in pids)) if pids else set()
    out: dict[str, list[str]] = {"tcp": [], "udp": []}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = open(f"/proc/net/{proto}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, state, inode = f[1], f[3], f[9]
            if inode in inodes and (proto.startswith("udp") or state == "0A"):
                out[proto[:3]].append(_address(local))
    return out


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback
