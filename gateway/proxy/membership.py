"""The proxies' membership heartbeat in Redis: the script every proxy process runs every ``member_interval_s`` to
share the replicas' concurrency limits (``gateway.admission.shares`` decides what to ask for; ``ProxyState._beat``
asks), and the reading of what it returns."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace

from gateway.admission.shares import Member, allocate

MEMBERS_KEY = "infercap:proxy:members"
# Every this many beats (10 s at 0.25 s) a process asks for every replica, not only the changed ones: a holdings hash
# lost in Redis (evicted, or a reply lost after the script ran) is put right within that.
FULL_BEAT_EVERY = 40
# The replicas' holdings totals are summed afresh from every member's holdings at least this often.
SUM_EVERY_S = 10

# Proxy membership heartbeat (see gateway.admission.shares). KEYS[1]: the members hash (process id → its join time,
# stamp and demand per replica: JSON, only the replicas where it is not zero, as ``Member`` holds it); each member's
# holdings are its own hash beside it (``KEYS[1]:h:<id>``, replica → slots, only those held). ARGV: this process's id,
# the holdings it wants changed (replica → slots wanted: only where what it wants differs from what it holds), its
# demand per replica (every class, critical, sheddable: three JSON maps), the TTL in seconds, the changed replicas'
# limits, "1" for a full beat (every replica asked for: its holdings are rewritten from the asks, none left over), and
# its beat's number, the number of the beat before it (-1: none) and the total demand that moved since that one
# (replica → its count now, 0 where it went: a JSON map), so that a reader holding that beat's entry decodes only
# the moves (``parse_members``).
# In one atomic step: drops expired members and their holdings, grants each change out of what the other live members do
# not hold (so the holdings never sum above a limit), stamps the entry with Redis' clock (keeping the first join time)
# and returns the live entries, the grants, and 1 where this process was not a live member (new, or counted out: what it
# held is gone, and it must ask again for every replica). A beat costs Redis a read of each member's entry head (its
# join time and stamp, written first; the demand after them is passed on, never decoded) and, per changed replica,
# this process's holding and the replica's total: every live member's holdings summed per replica
# (``KEYS[1]:held``), kept by every grant, release and expiry here and in ``LEAVE``, and summed afresh from the
# members' hashes at least every ``SUM_EVERY_S``, whenever the totals are missing, and when a member's hash expired
# before it was counted out. So a beat costs what changes, not the fleet or the number of processes. While a live
# member is of the version before (not in ``KEYS[1]:v2``, the members this version marks), whose script keeps no
# totals, grants sum the others' hashes as that version did, and the totals are summed afresh once it is gone. The
# holdings hashes are keys the script names itself: one Redis, not a Redis Cluster (whose scripts may touch only the
# keys they are given).
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local ttl = tonumber(ARGV[6])
local want = cjson.decode(ARGV[2])
local limits = cjson.decode(ARGV[7])
local prefix = KEYS[1] .. ':h:'
local held_key = KEYS[1] .. ':held'
local marked = KEYS[1] .. ':v2'  -- the members whose scripts keep the totals (this version's)
local function release(key)  -- a member's holdings leave the replicas' totals, then the member's hash goes
  local h = redis.call('HGETALL', key)
  for k = 1, #h, 2 do
    if redis.call('HINCRBY', held_key, h[k], -tonumber(h[k + 1])) <= 0 then redis.call('HDEL', held_key, h[k]) end
  end
  redis.call('DEL', key)
end
local joined = nil
local live = {}
local names = {}
local lost = false
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local j, stamp = string.match(all[i + 1], '^{"j":([%d.]+),"t":([%d.]+)[,}]')  -- the head alone: no decode
  local fresh = stamp ~= nil and now - tonumber(stamp) <= ttl
  if all[i] == ARGV[1] then
    if fresh then joined = tonumber(j) end
  elseif fresh then
    names[#names + 1] = all[i]
    live[#live + 1] = all[i]
    live[#live + 1] = all[i + 1]
  else
    redis.call('HDEL', KEYS[1], all[i])
    redis.call('SREM', marked, all[i])
    lost = lost or redis.call('EXISTS', prefix .. all[i]) == 0  -- expired before it was counted out: re-sum
    release(prefix .. all[i])
  end
end
-- A live member of the version before keeps no totals: while one lives, grants sum the others' hashes as it does.
local mixed = false
for _, pid in ipairs(names) do
  if redis.call('SISMEMBER', marked, pid) == 0 then mixed = true break end
end
redis.call('SADD', marked, ARGV[1])
local mine = prefix .. ARGV[1]
local reset = 0
if joined == nil then
  joined = now
  reset = 1
end
if ARGV[8] == '1' or reset == 1 then
  release(mine)  -- a full beat asks for every replica: what it holds is rewritten from them
end
-- The totals summed afresh from every live member's holdings (this one's too, if it still holds): once a period,
-- so that a hash lost outside this script (evicted, expired) cannot leave them wrong for longer; whenever they are
-- missing while others live (lost themselves, or after members of the version before); and when a member's hash
-- expired before the member was counted out.
if not mixed then
  local resum = redis.call('SET', KEYS[1] .. ':summed', '1', 'NX', 'EX', REBUILD_S) or lost
  if not resum and #names > 0 and redis.call('EXISTS', held_key) == 0 then resum = true end
  if resum then
    redis.call('DEL', held_key)
    names[#names + 1] = ARGV[1]
    for _, pid in ipairs(names) do
      local h = redis.call('HGETALL', prefix .. pid)
      for k = 1, #h, 2 do redis.call('HINCRBY', held_key, h[k], tonumber(h[k + 1])) end
    end
    names[#names] = nil
  end
end
local parts = {}
for rid, w in pairs(want) do
  w = tonumber(w) or 0
  local have = tonumber(redis.call('HGET', mine, rid)) or 0
  local others = 0
  if mixed then
    for _, pid in ipairs(names) do others = others + (tonumber(redis.call('HGET', prefix .. pid, rid)) or 0) end
  else
    others = (tonumber(redis.call('HGET', held_key, rid)) or 0) - have
  end
  -- never below what it holds and still wants, within the limit (the same where the totals are right: others and
  -- what it holds fit in the limit); a grant short of what runs would let the others past the limit
  local limit = tonumber(limits[rid]) or 0
  local g = math.max(math.min(w, limit - others), math.min(w, have, limit))
  if g < 0 then g = 0 end
  g = math.floor(g)
  if g ~= have then
    if redis.call('HINCRBY', held_key, rid, g - have) <= 0 then redis.call('HDEL', held_key, rid) end
  end
  if g > 0 then redis.call('HSET', mine, rid, g) else redis.call('HDEL', mine, rid) end
  parts[#parts + 1] = cjson.encode(rid) .. ':' .. string.format('%d', g)
end
if mixed then
  redis.call('DEL', held_key)  -- wrong while the version before grants: summed afresh once it is gone
end
redis.call('EXPIRE', mine, math.ceil(ttl * 10))
local entry = string.format(
  '{"j":%.6f,"t":%.6f,"s":%d,"b":%d,"d":%s,"q":%s,"c":%s,"x":%s}',
  joined, now, tonumber(ARGV[9] or '') or -1, tonumber(ARGV[10] or '') or -1, ARGV[11] or '{}', ARGV[3], ARGV[4],
  ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], entry)
redis.call('EXPIRE', KEYS[1], math.ceil(ttl * 10))
redis.call('EXPIRE', held_key, math.ceil(ttl * 10))
redis.call('EXPIRE', marked, math.ceil(ttl * 10))
live[#live + 1] = ARGV[1]
live[#live + 1] = entry
return {live, '{' .. table.concat(parts, ',') .. '}', reset}
""".replace("REBUILD_S", str(SUM_EVERY_S))

# A process leaving (shutdown, or a test counting it out): its entry and its holdings go, and the holdings leave the
# replicas' totals. KEYS[1]: the members hash; ARGV[1]: the process's id.
LEAVE = """
local held_key = KEYS[1] .. ':held'
local key = KEYS[1] .. ':h:' .. ARGV[1]
local h = redis.call('HGETALL', key)
for k = 1, #h, 2 do
  if redis.call('HINCRBY', held_key, h[k], -tonumber(h[k + 1])) <= 0 then redis.call('HDEL', held_key, h[k]) end
end
redis.call('DEL', key)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[1] .. ':v2', ARGV[1])
"""


_HEAD = re.compile(r'{"j":([\d.]+),"t":([\d.]+),"s":(-?\d+),"b":(-?\d+),"d":')
_DECODER = json.JSONDecoder()


def parse_members(raw: list, known: dict | None = None) -> dict:
    """The live members the heartbeat returned. Their demand maps are read as they came (plain counts, see
    ``Member``), except one that is not a map of non-negative numbers (an entry of another version): none. The
    critical and sheddable maps are decoded when first looked at (``_LazyCounts``): the split looks at them only on a
    replica whose demand exceeds its limit, so a fleet under its limits never decodes them.

    ``known``: the caller's memory of the last read (member id → ``Member``), kept up to date here. A member whose
    entry is of the beat known comes back as it was (the same maps: ``ShareBook.allocate`` skips it by identity);
    one whose entry is of the beat after it (its ``"b"``) has only the demand that moved since decoded, and carries
    those replicas in ``moved_since``; any other is decoded whole. So a busy fleet's beat decodes what moved, not
    every member's demand on every replica."""
    members = {}
    for i in range(0, len(raw) - 1, 2):
        name = raw[i].decode() if isinstance(raw[i], bytes) else raw[i]
        entry = raw[i + 1].decode() if isinstance(raw[i + 1], bytes) else raw[i + 1]
        head = _HEAD.match(entry)
        last = known.get(name) if known is not None and head is not None else None
        if last is not None and last.beat == int(head[3]):
            member = replace(last, joined=float(head[1]), seen_at=float(head[2]))
        else:
            member = (_read(entry, head, last) if head is not None else None) or _read_whole(entry)
            if member is None:  # the script reads only an entry's head: one unreadable after it is left out, by all
                continue
        members[name] = member
    if known is not None:
        known.clear()
        known.update((name, m) for name, m in members.items() if m.beat is not None)
    return members


def _read(entry: str, head, last: Member | None) -> Member | None:
    """An entry as the script writes it (``{"j":…,"t":…,"s":…,"b":…,"d":{…},"q":{…},"c":{…},"x":{…}}``): from
    ``last`` and the moves where it is the entry's base beat, else the total demand decoded; the class maps left for
    ``_LazyCounts``. None where it is not of that shape."""
    beat, base = int(head[3]), int(head[4])
    try:
        moves, end = _DECODER.raw_decode(entry, head.end())
    except ValueError:
        return None
    if not entry.startswith(',"q":', end) or _counts(moves) is not moves:
        return None
    c, x = entry.rfind(',"c":'), entry.rfind(',"x":')
    if not (end < c < x and entry.endswith("}")):
        return None
    if last is not None and last.beat == base:
        demand = {**last.demand, **moves} if moves else last.demand
        for rid in [rid for rid, n in moves.items() if not n]:
            del demand[rid]
        moved_since = (base, moves.keys())
    else:
        try:
            demand = _counts(_DECODER.raw_decode(entry, end + 5)[0])
        except ValueError:
            return None
        moved_since = None
    return Member(
        joined=float(head[1]),
        seen_at=float(head[2]),
        demand=demand,
        critical=_LazyCounts(entry[c + 5 : x]),
        sheddable=_LazyCounts(entry[x + 5 : -1]),
        beat=beat,
        moved_since=moved_since,
    )


def _read_whole(entry: str) -> Member | None:
    try:
        decoded = json.loads(entry)
        return Member(
            joined=float(decoded["j"]),
            seen_at=float(decoded["t"]),
            demand=_counts(decoded.get("q")),
            critical=_counts(decoded.get("c")),
            sheddable=_counts(decoded.get("x")),
        )
    except (ValueError, KeyError, TypeError):
        return None


class _LazyCounts(Mapping):
    """A member's per-class demand map, decoded from its JSON text on first use (one that does not decode, or is not
    a map of non-negative counts, reads as none, as ``_counts``)."""

    __slots__ = ("_text", "_map")

    def __init__(self, text: str) -> None:
        self._text, self._map = text, None

    def _counts(self) -> dict:
        if self._map is None:
            try:
                self._map = _counts(json.loads(self._text))
            except ValueError:
                self._map = {}
            self._text = None
        return self._map

    def __getitem__(self, rid: str) -> int:
        return self._counts()[rid]

    def get(self, rid: str, default=None):
        return self._counts().get(rid, default)

    def __iter__(self):
        return iter(self._counts())

    def __len__(self) -> int:
        return len(self._counts())


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
    where some member's demand moved since the last beat's view are worked out again (see ``allocate``). Which those
    are, each member says itself: its entry carries the replicas whose demand moved since its beat before
    (``sending``, ``parse_members``); an entry that came back unchanged is skipped by identity, and only where a
    reader lacks that earlier beat are two maps compared (``_moved``). The holdings asked for are those replicas',
    those where this process's own streams moved since the last beat, and those whose last grant fell short of the
    ask (asked again every beat until granted). The first beat, a changed membership or limit, and every full beat
    (``FULL_BEAT_EVERY``) go over every replica.
    """

    def __init__(self) -> None:
        self.allocation: dict[str, int] = {}
        self.holdings: dict[str, int] = {}  # what the heartbeat granted (0 included)
        self.limits: dict[str, int] = {}  # the replicas' limits at the last beat Redis answered
        self.short: set[str] = set()  # replicas whose last grant was below the ask
        self.known: dict[str, Member] = {}  # the members at the last read (``parse_members``)
        self._sent: tuple[int, Mapping[str, int]] | None = None  # this process's last beat and its total demand
        self._basis: tuple | None = None  # (members, limits) the allocation was worked out on
        self._view: Mapping[str, Member] = {}  # the members' demand it was worked out from
        self._over: set[str] = set()  # the replicas whose demand exceeded their limit in that view
        self._totals: dict[str, int] = {}  # every member's demand in that view, summed per replica (non-zero only)
        self._flight: dict[str, int] = {}  # this process's streams per replica at the last beat

    def allocate(
        self, me: str, view: Mapping[str, Member], limits: dict[str, int], *, full: bool
    ) -> tuple[set[str] | None, list[str]]:
        """Work out ``allocation`` from this beat's view: the replicas whose allocation may have changed (None where
        every one may have), and those whose allocation did change.

        A replica's allocation follows from its limit and the members' total demand on it, and from their demand
        per class only where the totals exceed the limit (``allocate``): so the replicas worked out again are those
        where some member's total moved, and those over their limit at the last beat (a class's count can move
        under an unchanged total); a replica under its limit then and with the same totals now is under it still."""
        basis = (sorted(view), limits)
        before = self.allocation
        if full or me not in view or basis != self._basis:
            self._over, self._totals = set(), _sums(view)
            touched, self.allocation = None, allocate(me, view, limits, over=self._over, totals=self._totals)
            moved = [
                rid for rid in before.keys() | self.allocation.keys() if before.get(rid) != self.allocation.get(rid)
            ]
        else:
            touched, totals = set(self._over), self._totals
            for mid, member in view.items():
                last = self._view[mid]
                since = member.moved_since
                if member is last:
                    continue
                if since is not None and last.beat is not None and since[0] == last.beat:
                    moved = since[1]  # the writer's own account of what moved since the view's beat
                elif member.demand is not last.demand and member.demand != last.demand:
                    moved = _moved(member.demand, last.demand)
                else:
                    continue
                touched.update(moved)
                now, was = member.demand.get, last.demand.get
                for rid in moved:
                    n = totals.get(rid, 0) + now(rid, 0) - was(rid, 0)
                    if n:
                        totals[rid] = n
                    else:
                        totals.pop(rid, None)
            self._over -= touched
            fresh = allocate(me, view, limits, only=touched, over=self._over, totals=totals)
            moved = [rid for rid, n in fresh.items() if before.get(rid) != n]
            before.update(fresh)  # in place: a busy fleet's allocation is not copied every beat
        self._basis, self._view = basis, view
        return touched, moved

    def sending(self, beat: int, demand: dict[str, int], moved=None) -> tuple[int, dict[str, int] | None]:
        """This process's total demand for its beat ``beat`` against what it sent at its last one: that beat's
        number (-1: none) and the replicas whose count moved, with their count now (0: gone); what it sends beside
        its demand (``HEARTBEAT``) and keeps in its own ``Member`` for ``allocate``; none (-1, None) where most of
        the map moved, which then costs less read whole. ``moved``: the replicas whose demand may have moved since
        (``OwnReports``), else the two maps are compared."""
        sent, self._sent = self._sent, (beat, demand)
        if sent is None:
            return -1, None
        moves = {rid: demand.get(rid, 0) for rid in (_moved(demand, sent[1]) if moved is None else moved)}
        if 2 * len(moves) > max(1, len(demand)):  # most of it moved: the readers decode the map whole instead
            return -1, None
        return sent[0], moves

    def changes(
        self, in_flight: dict[str, int], limits: dict[str, int], touched: set[str] | None, full: bool, moved=None
    ) -> dict[str, int]:
        """The holdings to ask for: ``max(allocation, what runs)`` where it differs from what is held, a replica
        whose limit changed (clipped to it again), 0 for a replica gone from the pools; with ``full`` every replica,
        and the script rewrites the process's holdings from them. ``moved``: the replicas whose streams may have
        moved since the last beat (``OwnReports``), else ``in_flight`` is compared with the last beat's."""
        held, allocation = self.holdings, self.allocation
        if touched is not None and not full and limits == self.limits:
            # Same limits: what is held is of serving replicas, and only these can want another holding.
            changes = {
                rid: w
                for rid in touched.union(self.short, _moved(in_flight, self._flight) if moved is None else moved)
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
        self._flight = dict(in_flight) if moved is None else {}  # compared at the next beat where no moves come
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


def _sums(view: Mapping[str, Member]) -> dict[str, int]:
    """Every member's demand summed per replica (non-zero only)."""
    totals: dict[str, int] = {}
    for member in view.values():
        for rid, n in member.demand.items():
            totals[rid] = totals.get(rid, 0) + n
    return {rid: n for rid, n in totals.items() if n}


def _moved(new: Mapping[str, int], old: Mapping[str, int]) -> list[str]:
    """The replicas whose count differs between two demand maps. A busy fleet's maps are large: this builds no
    object per replica (no pairs, which would also wake the collector), only the list of those that moved."""
    get = old.get
    moved = [rid for rid in new if new[rid] != get(rid)]
    appeared = sum(1 for rid in moved if rid not in old)
    if len(new) - appeared != len(old):  # some replica left the map (its demand went to 0)
        moved += [rid for rid in old if rid not in new]
    return moved
