"""The proxies' membership heartbeat in Redis: the script every proxy process runs every ``member_interval_s`` to
share the replicas' concurrency limits (``gateway.admission.shares`` decides what to ask for; ``ProxyState._beat``
asks), and the reading of what it returns."""

from __future__ import annotations

import json
from collections.abc import Mapping

from gateway.admission.shares import Member, allocate

MEMBERS_KEY = "infercap:proxy:members"
# Every this many beats (10 s at 0.25 s) a process asks for every replica, not only the changed ones: a holdings hash
# lost in Redis (evicted, or a reply lost after the script ran) is put right within that.
FULL_BEAT_EVERY = 40

# Proxy membership heartbeat (see gateway.admission.shares). KEYS[1]: the members hash (process id → its join time,
# stamp and demand per replica: JSON, only the replicas where it is not zero, as ``Member`` holds it); each member's
# holdings are its own hash beside it (``KEYS[1]:h:<id>``, replica → slots, only those held). ARGV: this process's id,
# the holdings it wants changed (replica → slots wanted: only where what it wants differs from what it holds), its
# demand per replica (every class, critical, sheddable: three JSON maps), the TTL in seconds, the changed replicas'
# limits, and "1" for a full beat (every replica asked for: its holdings are rewritten from the asks, none left over).
# In one atomic step: drops expired members and their holdings, grants each change out of what the other live members do
# not hold (so the holdings never sum above a limit), stamps the entry with Redis' clock (keeping the first join time)
# and returns the live entries, the grants, and 1 where this process was not a live member (new, or counted out: what it
# held is gone, and it must ask again for every replica). A beat costs Redis a read of each member's entry head (its
# join time and stamp, written first; the demand after them is passed on, never decoded) and, per changed replica, one
# read of each other member's holding: what changes, not the fleet. The holdings hashes are keys the script names
# itself: one Redis, not a Redis Cluster (whose scripts may touch only the keys they are given).
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local ttl = tonumber(ARGV[6])
local want = cjson.decode(ARGV[2])
local limits = cjson.decode(ARGV[7])
local prefix = KEYS[1] .. ':h:'
local joined = nil
local others = {}
local live = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local j, stamp = string.match(all[i + 1], '^{"j":([%d.]+),"t":([%d.]+)[,}]')  -- the head alone: no decode
  local fresh = stamp ~= nil and now - tonumber(stamp) <= ttl
  if all[i] == ARGV[1] then
    if fresh then joined = tonumber(j) end
  elseif fresh then
    others[#others + 1] = all[i]
    live[#live + 1] = all[i]
    live[#live + 1] = all[i + 1]
  else
    redis.call('HDEL', KEYS[1], all[i])
    redis.call('DEL', prefix .. all[i])
  end
end
local mine = prefix .. ARGV[1]
local reset = 0
if ARGV[8] == '1' then
  redis.call('DEL', mine)  -- a full beat asks for every replica: what it holds is rewritten from them
end
if joined == nil then
  redis.call('DEL', mine)
  joined = now
  reset = 1
end
local parts = {}
for rid, w in pairs(want) do
  local held = 0
  for _, pid in ipairs(others) do
    held = held + (tonumber(redis.call('HGET', prefix .. pid, rid)) or 0)
  end
  local g = math.min(tonumber(w) or 0, (tonumber(limits[rid]) or 0) - held)
  if g < 0 then g = 0 end
  g = math.floor(g)
  if g > 0 then redis.call('HSET', mine, rid, g) else redis.call('HDEL', mine, rid) end
  parts[#parts + 1] = cjson.encode(rid) .. ':' .. string.format('%d', g)
end
redis.call('EXPIRE', mine, math.ceil(ttl * 10))
local entry = string.format('{"j":%.6f,"t":%.6f,"q":%s,"c":%s,"x":%s}', joined, now, ARGV[3], ARGV[4], ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], entry)
redis.call('EXPIRE', KEYS[1], math.ceil(ttl * 10))
live[#live + 1] = ARGV[1]
live[#live + 1] = entry
return {live, '{' .. table.concat(parts, ',') .. '}', reset}
"""


def parse_members(raw: list) -> dict:
    """The live members the heartbeat returned. Their demand maps are read as they came (plain counts, see
    ``Member``), except one that is not a map of non-negative numbers (an entry of another version): none."""
    members = {}
    for i in range(0, len(raw) - 1, 2):
        try:
            entry = json.loads(raw[i + 1])
        except ValueError:  # the script reads only an entry's head: one unreadable after it is left out, by all
            continue
        members[raw[i].decode() if isinstance(raw[i], bytes) else raw[i]] = Member(
            joined=float(entry["j"]),
            seen_at=float(entry["t"]),
            demand=_counts(entry.get("q")),
            critical=_counts(entry.get("c")),
            sheddable=_counts(entry.get("x")),
        )
    return members


def _counts(value) -> dict:
    if not isinstance(value, dict):
        return {}
    try:
        return value if min(value.values(), default=0) >= 0 else {}
    except TypeError:  # lists, strings: another version's entry
        return {}


class ShareBook:
    """This process's side of the heartbeat: what it may run on each replica (``allocation``), what Redis granted it
    (``holdings``) and what to ask for, beat to beat.

    A beat works out only what can have changed since the last one, not the fleet: a replica's allocation depends
    only on its limit, the members and their demand on it, so with the same members and limits only the replicas
    some member reports demand on, now or at the last beat, are worked out again; and the holdings asked for are
    those replicas', those this process runs requests on now or ran at the last beat, and those whose last grant
    fell short of the ask (asked again every beat until granted).
    The first beat, a changed membership or limit, and every full beat (``FULL_BEAT_EVERY``) go over every replica.
    """

    def __init__(self) -> None:
        self.allocation: dict[str, int] = {}
        self.holdings: dict[str, int] = {}  # what the heartbeat granted (0 included)
        self.limits: dict[str, int] = {}  # the replicas' limits at the last beat Redis answered
        self.short: set[str] = set()  # replicas whose last grant was below the ask
        self._basis: tuple | None = None  # (members, limits) the allocation was worked out on
        self._demanded: set[str] = set()  # the replicas with some member's demand in that view
        self._running: set[str] = set()  # the replicas this process ran requests on at the last beat

    def allocate(self, me: str, view: Mapping[str, Member], limits: dict[str, int], *, full: bool) -> set[str] | None:
        """Work out ``allocation`` from this beat's view; the replicas whose allocation may have changed, or None
        where every one may have."""
        demanded = set().union(*(m.demand for m in view.values()))
        basis = (sorted(view), limits)
        if full or me not in view or basis != self._basis:
            touched, self.allocation = None, allocate(me, view, limits)
        else:
            touched = demanded | self._demanded
            self.allocation = {**self.allocation, **allocate(me, view, limits, only=touched)}
        self._basis, self._demanded = basis, demanded
        return touched

    def changes(self, in_flight: dict[str, int], limits: dict[str, int], touched: set[str] | None, full: bool):
        """The holdings to ask for: ``max(allocation, what runs)`` where it differs from what is held, a replica
        whose limit changed (clipped to it again), 0 for a replica gone from the pools; with ``full`` every replica,
        and the script rewrites the process's holdings from them."""
        held, allocation = self.holdings, self.allocation
        if touched is not None and not full and limits == self.limits:
            # Same limits: what is held is of serving replicas, and only these can want another holding.
            changes = {
                rid: w
                for rid in touched | self.short | in_flight.keys() | self._running
                if rid in allocation and held.get(rid) != (w := max(allocation[rid], in_flight.get(rid, 0)))
            }
        else:
            before = self.limits
            changes = {
                rid: w
                for rid, n in allocation.items()
                if (w := max(n, in_flight.get(rid, 0))) != held.get(rid) or full or before.get(rid) != limits[rid]
            }
            changes.update((rid, 0) for rid in held.keys() - limits.keys())
        self.short.intersection_update(changes)  # a replica not asked for holds what it wants
        self._running = set(in_flight)
        return changes

    def granted(self, grants: dict[str, int], changes: dict[str, int], limits: dict[str, int], reset: bool) -> None:
        """Record what the script granted for ``changes`` (``reset``: this process held nothing before them)."""
        self.limits = limits
        if reset:
            self.holdings, self.short = {}, set()
        held, short = self.holdings, self.short
        for rid, n in grants.items():
            if rid in limits:
                held[rid] = n
            else:
                held.pop(rid, None)
            if rid in limits and n != changes.get(rid):
                short.add(rid)
            else:
                short.discard(rid)
