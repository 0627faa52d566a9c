"""Prompt work a router has sent and not yet seen answered (pure): per replica, the uncached prompt tokens of the
requests that have no first token yet.

A replica's in-flight model units weigh a request's prompt for its whole life, but its prompt is work only until the
first token: after that it is KV memory, and the replica's queue of prompts to prefill is what a new request waits
behind (the TTFT part of the SLO). So the router counts that queue on its own: ``add`` when it sends a request (its
prompt tokens less those it expects cached there), ``remove`` at the request's first token (the proxy's first
streamed bytes, the simulator's end of prefill) or at its end, whichever comes first. infercap's router adds it to
each replica's load (``InfercapRouter.prefill_weight``; docs/algorithms.md#pending-prefill).
"""


class PendingPrefill:
    def __init__(self) -> None:
        self._tokens: dict[str, dict[str, float]] = {}  # replica → request → uncached prompt tokens
        self._totals: dict[str, float] = {}
        self._where: dict[str, str] = {}  # request → replica

    def add(self, replica_id: str, request_id: str, tokens: float) -> None:
        """``request_id`` was sent to ``replica_id`` with ``tokens`` to prefill there (a resend moves it)."""
        self.remove(request_id)
        if tokens <= 0:
            return
        self._tokens.setdefault(replica_id, {})[request_id] = tokens
        self._totals[replica_id] = self._totals.get(replica_id, 0.0) + tokens
        self._where[request_id] = replica_id

    def remove(self, request_id: str) -> None:
        replica_id = self._where.pop(request_id, None)
        if replica_id is None:
            return
        pending = self._tokens[replica_id]
        tokens = pending.pop(request_id)
        if pending:
            self._totals[replica_id] -= tokens
        else:  # exact zero when nothing is left, whatever the float sums drifted by
            del self._tokens[replica_id]
            del self._totals[replica_id]

    def tokens(self, replica_id: str) -> float:
        return self._totals.get(replica_id, 0.0)

    def forget_replica(self, replica_id: str) -> None:
        for request_id in self._tokens.pop(replica_id, {}):
            del self._where[request_id]
        self._totals.pop(replica_id, None)

    def __len__(self) -> int:
        return len(self._where)
