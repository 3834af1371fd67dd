"""Reading the kernel's table of listening sockets."""

from __future__ import annotations

from gpuwatch.harness.stack.ports import parse_listening_inodes


def test_parse_listening_inodes_keeps_listeners_of_the_port() -> None:
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
        "  timeout inode\n"
        "   0: 0100007F:2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
        "        0 1111 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:2384 0100007F:D1C2 01 00000000:00000000 00:00000000 00000000     0"
        "        0 2222 1 0000000000000000 20 4 30 10 -1\n"
        "   2: 0100007F:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
        "        0 3333 1 0000000000000000 100 0 0 10 0\n"
    )
    assert parse_listening_inodes(table, 0x2384) == {1111}  # 9092; the established one is not
    assert parse_listening_inodes(table, 6379) == {3333}
    assert parse_listening_inodes(table, 1) == set()
