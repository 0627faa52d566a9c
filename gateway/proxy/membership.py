"""The proxies' membership heartbeat in Redis: the script every proxy process runs every ``member_interval_s`` to
share the replicas' concurrency limits (``gateway.admission.shares`` decides what to ask for; ``ProxyState._beat``
asks), and the reading of what it returns."""

from __future__ import annotations

import json

from gateway.admission.shares import Member

MEMBERS_KEY = "infercap:proxy:members"
# Every this many beats (10 s at 0.25 s) a process asks for every replica, not only the changed ones: a holdings hash
# lost in Redis (evicted, or a reply lost after the script ran) is put right within that.
FULL_BEAT_EVERY = 40

# Proxy membership heartbeat (see gateway.admission.shares). KEYS[1]: the members hash (process id → its join time,
# stamp, in-flight streams and demand per replica: JSON, only the replicas where they are not zero); each member's
# holdings are its own hash beside it (``KEYS[1]:h:<id>``, replica → slots, only those held). ARGV: this process's
# id, its in-flight streams, the holdings it wants changed (replica → slots wanted: only where what it wants differs
# from what it holds), its demand per replica and class, the TTL in seconds, the changed replicas' limits, and "1"
# for a full beat (every replica asked for: its holdings are rewritten from the asks, none left over). In
# one atomic step: drops expired members and their holdings, grants each change out of what the other live members
# do not hold (so the holdings never sum above a limit), stamps the entry with Redis' clock (keeping the first join
# time) and returns the live entries, the grants, and 1 where this process was not a live member (new, or counted
# out: what it held is gone, and it must ask again for every replica). A beat costs Redis the members' small
# entries and, per changed replica, one read of each other member's holding: what changes, not the fleet. The
# holdings hashes are keys the script names itself: one Redis, not a Redis Cluster (whose scripts may touch only the
# keys they are given).
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local ttl = tonumber(ARGV[5])
local want = cjson.decode(ARGV[3])
local limits = cjson.decode(ARGV[6])
local prefix = KEYS[1] .. ':h:'
local joined = nil
local others = {}
local live = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local ok, v = pcall(cjson.decode, all[i + 1])
  local fresh = ok and type(v) == 'table' and tonumber(v.t) and now - tonumber(v.t) <= ttl
  if all[i] == ARGV[1] then
    if fresh and tonumber(v.j) then joined = tonumber(v.j) end
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
if ARGV[7] == '1' then
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
local entry = string.format('{"j":%.6f,"t":%.6f,"f":%s,"q":%s}', joined, now, ARGV[2], ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], entry)
redis.call('EXPIRE', KEYS[1], math.ceil(ttl * 10))
live[#live + 1] = ARGV[1]
live[#live + 1] = entry
return {live, '{' .. table.concat(parts, ',') .. '}', reset}
"""


def parse_members(raw: list) -> dict:
    def ints(value) -> dict[str, int]:
        return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}

    members = {}
    for i in range(0, len(raw) - 1, 2):
        entry = json.loads(raw[i + 1])
        demand = entry.get("q")
        members[raw[i].decode() if isinstance(raw[i], bytes) else raw[i]] = Member(
            joined=float(entry["j"]),
            seen_at=float(entry["t"]),
            in_flight=ints(entry.get("f")),
            holdings=ints(entry.get("h")),
            demand={k: tuple(v) for k, v in demand.items() if isinstance(v, list)}  # ``allocate`` reads them as ints
            if isinstance(demand, dict)
            else {},
        )
    return members
