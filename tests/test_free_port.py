"""Throwaway servers' ports: outside the ephemeral range, never handed out twice, a slice per xdist worker."""

from __future__ import annotations

import random
import socket

import fix_throwaway
import pytest
from fix_throwaway import ephemeral_range, free_port, port_window


def test_a_port_lies_outside_the_range_outgoing_connections_take_their_ports_from() -> None:
    # A Galera joiner lost its IST port to an outgoing connection's local port (CI of 2026-12-06).
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(not low <= port <= high for port in ports)
    assert all(port >= fix_throwaway.PORT_FLOOR for port in ports)


def test_a_port_is_never_handed_out_twice_even_before_its_server_listens() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def test_each_xdist_worker_picks_from_a_slice_no_other_worker_picks_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    windows = []
    for worker in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        windows.append(set(port_window()))
    assert all(len(window) > 1000 for window in windows)
    assert all(a.isdisjoint(b) for i, a in enumerate(windows) for b in windows[i + 1 :])


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        spare = next(p for p in port_window() if p not in fix_throwaway._PROMISED)
        monkeypatch.setattr(fix_throwaway, "port_window", lambda: [busy])
        with pytest.raises(fix_throwaway.ServerError, match="no free port"):
            free_port()
        monkeypatch.setattr(fix_throwaway, "port_window", lambda: [busy, spare])
        picks = iter([0, 1])
        monkeypatch.setattr(random, "randrange", lambda n: next(picks))
        assert free_port() == spare
