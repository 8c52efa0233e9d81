"""Where requests for the same batch meet: a member preferred for each request digest.

A batch is a pure function of its request's digest, and a worker computes requests with one
digest once (`loadax.server.share_cache`). So clients that ask for the same batches (a sweep's
jobs, a job's processes that own the same rows) should ask the same worker: each ranks the
members by rendezvous hashing on the digest (weighted by the share of each it may use), the
same ranking in every client, and a different one for every digest, which spreads one client's
requests evenly. The policy breaks ties of load with it: load always wins.
"""

from __future__ import annotations

import hashlib
import math


def affinity(digest: bytes, member: str, weight: float = 1.0) -> float:
    """The rank of `member` (smaller first) for the request `digest`, `weight` its share (a
    member of weight 2 comes first for about twice as many digests as one of weight 1).

    >>> digest = bytes(16)
    >>> ranks = {name: affinity(digest, name) for name in ("a", "b", "c")}
    >>> min(ranks, key=ranks.__getitem__) == min(ranks, key=lambda n: affinity(digest, n))
    True
    >>> affinity(digest, "a") == affinity(bytes(16), "a")
    True
    """
    drawn = hashlib.blake2b(member.encode(), digest_size=8, key=digest[:64]).digest()
    uniform = (int.from_bytes(drawn, "big") + 1) / (2**64 + 1)  # in (0, 1)
    return -math.log(uniform) / weight
