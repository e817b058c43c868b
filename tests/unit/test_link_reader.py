"""One thread reads every agent link (``link_reader``): 64 links' lines reach their own decoders, a
link that ends, falls silent, breaks its decoder or is closed ends alone, and the fds are let go."""

from __future__ import annotations

import os
import threading

from ddptop.core.sessions.link_reader import CLOSED, LinkReader


def follow_in_thread(reader: LinkReader, fd: int, feed, idle=lambda now: None, closed=None):
    closed = closed or threading.Event()
    box: dict = {}

    def run():
        box["outcome"] = reader.follow(fd, feed, idle, closed)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box, closed


def test_sixty_four_links_each_get_their_own_lines_and_end_on_their_own():
    reader = LinkReader()
    pipes = [os.pipe() for _ in range(64)]
    got: list[list[bytes]] = [[] for _ in pipes]
    links = []
    for i, (r, _) in enumerate(pipes):
        links.append(follow_in_thread(reader, r, lambda chunk, i=i: got[i].append(chunk)))
    for i, (_, w) in enumerate(pipes):
        os.write(w, f"node {i} line 1\n".encode())
        os.write(w, f"node {i} line 2\n".encode())
    for i, (r, w) in enumerate(pipes):
        os.close(w)  # the link ends: the pipe's end is read
        t, box, _ = links[i]
        t.join(timeout=30)
        assert not t.is_alive()
        assert box["outcome"] is None  # (ended without an outcome of its decoder: the caller classifies it)
        assert b"".join(got[i]) == f"node {i} line 1\nnode {i} line 2\n".encode()
        os.close(r)
    # one thread read them all
    assert [th.name for th in threading.enumerate()].count("link-reader") >= 1
    assert reader.links == 0


def test_an_outcome_a_silence_a_broken_decoder_and_a_detach_end_only_their_link():
    reader = LinkReader()
    (r1, w1), (r2, w2), (r3, w3), (r4, w4), (r5, w5) = (os.pipe() for _ in range(5))
    ends = follow_in_thread(reader, r1, lambda chunk: ("bye", "") if b"bye" in chunk else None)
    silent = follow_in_thread(reader, r2, lambda chunk: None, idle=lambda now: ("lost", "no data for 15 s"))

    def broken(chunk):
        raise ValueError("a decoder bug")

    bug = follow_in_thread(reader, r3, broken)
    detached = follow_in_thread(reader, r4, lambda chunk: None)
    still: list[bytes] = []
    other = follow_in_thread(reader, r5, still.append)

    os.write(w1, b"a line\nbye\n")
    os.write(w3, b"anything\n")
    detached[2].set()
    for (t, box, _), want in ((ends, ("bye", "")), (silent, ("lost", "no data for 15 s")), (detached, CLOSED)):
        t.join(timeout=30)
        assert box["outcome"] == want
    bug[0].join(timeout=30)
    kind, why = bug[1]["outcome"]
    assert kind == "lost" and "ValueError: a decoder bug" in why
    # the other link is read on
    os.write(w5, b"still here\n")
    os.close(w5)
    other[0].join(timeout=30)
    assert b"".join(still) == b"still here\n" and other[1]["outcome"] is None
    assert reader.links == 0
    for fd in (r1, w1, r2, w2, r3, w3, r4, w4, r5):
        os.close(fd)
