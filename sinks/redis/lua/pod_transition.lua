-- KEYS[1] pod
-- KEYS[2] windows
-- KEYS[3] timeline
-- KEYS[4] seen
-- KEYS[5..] states
-- ARGV[1] uid
-- ARGV[2] ts
-- ARGV[3] to_state
-- ARGV[4] reason
-- ARGV[5] namespace
-- ARGV[6] pod_name
-- ARGV[7] node
-- ARGV[8] labels
-- ARGV[9] ttl_s
-- ARGV[10] cluster
-- `states`: state:queued..finished, in rank order. The newest transition wins, ordered by
-- (finished, ts, rank, reason): order-independent, and finished is terminal.
local RANK = {queued = 1, running = 2, stalled = 3, finished = 4}

local function expire_pod(ttl, first, last)
  for i = first, last do redis.call('EXPIRE', KEYS[i], ttl, 'NX') end
end

local uid, ts, state, reason = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local cur = redis.call('HMGET', KEYS[1], 'state', 'state_since', 'updated_at', 'reason')
if cur[1] and RANK[cur[1]] and cur[2] then
  local since, old_fin, new_fin = tonumber(cur[2]), cur[1] == 'finished', state == 'finished'
  if old_fin ~= new_fin then
    if old_fin then return 0 end
  elseif ts < since then return 0
  elseif ts == since then
    if RANK[state] < RANK[cur[1]] then return 0 end
    if RANK[state] == RANK[cur[1]] and reason < (cur[4] or '') then return 0 end
  end
end
local updated = ARGV[2]
if cur[3] and tonumber(cur[3]) and tonumber(cur[3]) > ts then updated = cur[3] end
redis.call('HSET', KEYS[1], 'namespace', ARGV[5], 'pod', ARGV[6], 'labels', ARGV[8],
  'state', state, 'state_since', ARGV[2], 'reason', reason, 'updated_at', updated)
if ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'cluster', ARGV[10]) end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'node', ARGV[7])
else redis.call('HSETNX', KEYS[1], 'node', '') end
for i = 5, 8 do redis.call('ZREM', KEYS[i], uid) end
redis.call('ZADD', KEYS[4 + RANK[state]], ARGV[2], uid)
if state == 'finished' then
  local ttl = tonumber(ARGV[9])
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. string.format('%d', ts - ttl * 1000))
  expire_pod(ttl, 1, 4)
end
return 1
