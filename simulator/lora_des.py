"""The discrete-event runner's LoRA side: a request naming an adapter waits for it on its replica (pure).

Mixed into ``des.Simulation`` when it is given a ``lora.LoraConfig``. At dispatch, a request for adapter A on
replica R takes A's slot on R (``AdapterSlots.acquire``): held and loaded, it enters the engine at once; held but
loading, or missing (loaded now, after the idle adapter the router's eviction rule names left: LRU for a router
without one), it enters when the load ends, so the load is in
its TTFT; every slot in use, it waits on R until a request there finishes and frees one. The proxy does the same in
production (it loads the adapter on the picked replica before forwarding), so the router's choice decides where
adapters load, in both. docs/lora.md.
"""

from __future__ import annotations

from gateway.routing.adapter_eviction import victim_chooser
from gateway.routing.base import RouteRequest
from simulator.adapter_slots import AdapterSlots
from simulator.engine import Sequence as EngineSeq
from simulator.fleet import _LORA, SimReplica
from simulator.results import RequestResult


class LoraOps:
    """Adapter slots for ``des.Simulation`` (which provides clock, router, lora, _push, _enter, _finished_tick)."""

    def _new_slots(self, replica_id: str) -> AdapterSlots:
        """A new replica's slots, evicting by the router's rule (the proxy's load manager asks the same one)."""
        return AdapterSlots(self.lora.max_loras, victim=victim_chooser(self.router, replica_id))

    def _send_adapter(self, rep: SimReplica, route: RouteRequest, result: RequestResult, seq) -> bool:
        now, name = self.clock.now(), route.adapter
        seq.adapter, seq.lora_rank = name, self.lora.rank(name)
        if rep.slots is None or rep.slots.max_loras <= 0:
            # vLLM without --enable-lora (or this adapter) answers the model name with a 404.
            result.status, result.reason, result.finish_s = "error", f"The model `{name}` does not exist.", now
            self.router.on_finished(route, rep.replica_id, now)
            self._finished_tick.append(result)
            return True
        rep.in_flight[route.request_id] = (route, result, seq)
        rep.in_flight_mu += route.mu
        self._admit_adapter(rep, route, seq)
        return True

    def _admit_adapter(self, rep: SimReplica, route: RouteRequest, seq: EngineSeq) -> None:
        now = self.clock.now()
        slots = rep.slots
        loads = slots.loads
        try:
            ready = slots.acquire(route.adapter, now, self.lora.load_s(route.adapter))
        except LookupError:
            rep.lora_queue.append(route.request_id)  # every slot in use: wait for one to be released
            rep.in_flight[route.request_id][1].extra["slot_wait"] = True
            return
        if slots.loads > loads:
            rep.in_flight[route.request_id][1].extra["adapter_load"] = True  # this request made the replica load it
        if ready > now + 1e-12:
            self._push(ready, _LORA, (rep, route.request_id))
        else:
            self._enter(rep, route.request_id)

    def _lora_ready(self, rep: SimReplica, request_id: str) -> None:
        if rep.state in ("ready", "draining") and request_id in rep.in_flight:
            self._enter(rep, request_id)

    def _release_adapter(self, rep: SimReplica, seq: EngineSeq) -> None:
        """A request on ``rep`` left: its adapter is idle again (for LRU), and a waiting request may take a slot."""
        if seq.adapter is None or rep.slots is None:
            return
        rep.slots.release(seq.adapter, self.clock.now())
        waiting, rep.lora_queue = rep.lora_queue, []
        for request_id in waiting:
            entry = rep.in_flight.get(request_id)
            if entry is not None:
                self._admit_adapter(rep, entry[0], entry[2])
