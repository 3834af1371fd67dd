-- KEYS[1] stream
-- KEYS[2] seen
-- KEYS[3] pod?
-- ARGV[1] identity
-- ARGV[2] ts
-- ARGV[3] maxlen
-- ARGV[4] ttl_s
-- ARGV[5..] fields
-- `fields`: field/value pairs of the entry. Skips an identity already seen (or older than
-- every remembered one once the cap is full).
local function expire_pod(ttl, first, last)
  for i = first, last do redis.call('EXPIRE', KEYS[i], ttl, 'NX') end
end

if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
local ts, maxlen = tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[2]) >= maxlen then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if ts <= tonumber(oldest[2]) then return 0 end
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, string.format('%d', -(maxlen + 1)))
local id = ARGV[2] .. '-*'
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if top then
  local top_ms = string.match(top[1], '^(%d+)')
  if tonumber(top_ms) > ts then id = top_ms .. '-*' end
end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], id, unpack(ARGV, 5))
if KEYS[3] and redis.call('HGET', KEYS[3], 'state') == 'finished' then
  expire_pod(tonumber(ARGV[4]), 1, 2)
end
return 1
