"""Scale from zero, called by the proxy when a request is queued for an endpoint with no ready replica.

Like Knative's activator: the proxy holds the request in its queue (bounded by the class's max queue age, then
429 + Retry-After) while this wakes the autoscaler at once instead of at its next 5 s tick. The call runs on the
proxy's event loop, so it only checks an in-process debounce and hands the work to a daemon thread: no I/O here.
"""

import logging
import threading
import time

from celery import signature
from django.db import connections

from capacity.autoscaling import store

log = logging.getLogger(__name__)

DEBOUNCE_S = 2.0
WAKE_TTL_S = 30  # the flag counts as demand for the horizontal tick until a replica is up or it expires
_last_request: dict[int, float] = {}
_lock = threading.Lock()


def request_scale_from_zero(endpoint_id: int) -> bool:
    """Ask for a first replica; returns False when a request for this endpoint was sent in the last seconds."""
    now = time.monotonic()
    with _lock:
        if now - _last_request.get(endpoint_id, -1e9) < DEBOUNCE_S:
            return False
        _last_request[endpoint_id] = now
    threading.Thread(target=_wake, args=(endpoint_id,), name=f"activator-{endpoint_id}", daemon=True).start()
    return True


def _wake(endpoint_id: int) -> None:
    try:
        # One wake-up per endpoint across every proxy process: the first SET NX wins, the others stop here.
        if not store.client().set(store.WAKE_KEY.format(endpoint_id=endpoint_id), "1", nx=True, ex=WAKE_TTL_S):
            return
        # By name (workers.tasks.autoscaling.horizontal_one): the task module imports the services this sits beside.
        signature("autoscale.horizontal_one", args=[endpoint_id, f"wake-{int(time.time())}"]).apply_async(expires=30)
    except Exception:  # noqa: BLE001 - best effort: the regular tick picks the queued demand up within 5 s
        log.exception("activator: could not wake the autoscaler for endpoint %s", endpoint_id)
    finally:
        connections.close_all()  # this thread's own connections; a short-lived thread must not leak them
