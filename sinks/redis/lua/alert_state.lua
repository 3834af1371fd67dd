-- KEYS[1] firing
-- KEYS[2] last
-- ARGV[1] fingerprint
-- ARGV[2] status
-- ARGV[3] ts
-- ARGV[4] json
-- ARGV[5] ttl_ms
-- The latest status wins; at equal ts resolved beats firing, and equal firing messages tie
-- on their JSON. `firing` hashes fingerprint -> JSON, `last` scores each fingerprint by the
-- ts of its latest status (kept `ttl_ms`).
local fp, status, ts = ARGV[1], ARGV[2], tonumber(ARGV[3])
local last = redis.call('ZSCORE', KEYS[2], fp)
if last then
  last = tonumber(last)
  if ts < last then return 0 end
  if ts == last and status == 'firing' then
    local shown = redis.call('HGET', KEYS[1], fp)
    if not shown or ARGV[4] < shown then return 0 end
  end
end
redis.call('ZADD', KEYS[2], ARGV[3], fp)
if status == 'firing' then redis.call('HSET', KEYS[1], fp, ARGV[4])
else redis.call('HDEL', KEYS[1], fp) end
local cutoff = string.format('%d', ts - tonumber(ARGV[5]))
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. cutoff)
return 1
