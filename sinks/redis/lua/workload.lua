-- KEYS workloads hash, deleted sorted set. ARGV uid, ts, json, deleted ("1" or ""),
-- keep_ms: a Kueue workload's record, with its event time `ts`. The hash keeps each
-- live workload's latest record (later ts; at an equal ts the greater JSON, so arrival
-- order does not matter). A deletion removes the field and is remembered in the sorted
-- set (uid by the deletion's ts) for keep_ms, so a record of before it that comes late
-- (a replay) does not bring the workload back; older entries are trimmed as deletions come.
local gone = redis.call('ZSCORE', KEYS[2], ARGV[1])
local ts = tonumber(ARGV[2])
if gone and tonumber(gone) >= ts then return 0 end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local deletes = ARGV[4] == '1'
if cur then
  local ok, held = pcall(cjson.decode, cur)
  if ok and type(held) == 'table' and tonumber(held.ts) then
    local held_ts = tonumber(held.ts)
    if held_ts > ts or (held_ts == ts and cur >= ARGV[3] and not deletes) then return 0 end
  end
end
if deletes then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], ts, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (ts - tonumber(ARGV[5])))
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1
