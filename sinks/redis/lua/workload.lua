-- KEYS[1] workloads
-- KEYS[2] deleted
-- ARGV[1] uid
-- ARGV[2] ts
-- ARGV[3] json
-- ARGV[4] deletes
-- ARGV[5] keep_ms
-- ARGV[6] resource_version
-- `workloads`: a hash; `deleted`: a sorted set; `deletes`: "1" or "". A Kueue workload's
-- record, with its event time `ts`. The hash keeps each live workload's latest record: the
-- later ts; at an equal ts the later resource version where both are numbers (etcd's are: a
-- status write and the creation it follows often share their times), else the greater JSON,
-- so arrival order does not matter. A deletion removes the field and is remembered in the
-- sorted set (uid by the deletion's ts) for keep_ms, so a record of before it that comes
-- late (a replay) does not bring the workload back; older entries are trimmed as deletions
-- come.
local gone = redis.call('ZSCORE', KEYS[2], ARGV[1])
local ts = tonumber(ARGV[2])
if gone and tonumber(gone) >= ts then return 0 end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local deletes = ARGV[4] == '1'
if cur then
  local ok, held = pcall(cjson.decode, cur)
  if ok and type(held) == 'table' and tonumber(held.ts) then
    local held_ts = tonumber(held.ts)
    if held_ts > ts then return 0 end
    if held_ts == ts and not deletes then
      local held_rv, rv = tonumber(held.resource_version), tonumber(ARGV[6])
      if held_rv and rv then
        if held_rv >= rv then return 0 end
      elseif cur >= ARGV[3] then
        return 0
      end
    end
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
