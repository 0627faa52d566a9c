"""Redis keys shared by the proxy (writer) and the rollout service (reader); no imports, so the proxy loads nothing.

``FAILED_ATTEMPTS_KEY``: a sorted set per endpoint of upstream attempts that failed before the first byte, or
broke mid-stream (resumed elsewhere: gateway/proxy/resume.py) (member ``"<replica id>:<request id>"``, score = unix time). The usage record names only the replica that answered
in the end (the retry), or none when no retry was possible, so without this a canary whose replicas fail every
request before the first byte, each absorbed by a retry on the old version, would look flawless. Written only on
a failure (never per request); entries older than ``FAILED_ATTEMPTS_RETENTION_S`` are pruned on write.
"""

FAILED_ATTEMPTS_KEY = "infercap:failed_attempts:{endpoint_id}"
FAILED_ATTEMPTS_RETENTION_S = 3600
