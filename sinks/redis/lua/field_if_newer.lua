-- KEYS[1] hash
-- ARGV[1] field
-- ARGV[2] ts
-- ARGV[3] json
-- A record's JSON, with its event time `ts`. The field
-- takes the record unless it holds one of a later ts; at an equal ts the greater JSON
-- stays, so the outcome does not depend on arrival order. A value that is not such a
-- record (written by someone else) is replaced.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local ok, held = pcall(cjson.decode, cur)
  if ok and type(held) == 'table' and tonumber(held.ts) then
    local ts, held_ts = tonumber(ARGV[2]), tonumber(held.ts)
    if held_ts > ts or (held_ts == ts and cur >= ARGV[3]) then return 0 end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
