-- KEYS[1] pod
-- KEYS[2] windows
-- KEYS[3] timeline
-- KEYS[4] seen
-- KEYS[5] waste_pods_window
-- KEYS[6] waste_namespaces_window
-- KEYS[7] waste_pods
-- KEYS[8] waste_namespaces
-- KEYS[9] waste_windows
-- ARGV[1] uid
-- ARGV[2] namespace
-- ARGV[3] pod_name
-- ARGV[4] node
-- ARGV[5] labels
-- ARGV[6] window_start
-- ARGV[7] window_end
-- ARGV[8] cost_nusd
-- ARGV[9] waste_nusd
-- ARGV[10] vram_bytes
-- ARGV[11] share
-- ARGV[12] gpus
-- ARGV[13] state
-- ARGV[14] ttl_s
-- ARGV[15] hour_ms
-- ARGV[16] pods_window_prefix
-- ARGV[17] namespaces_window_prefix
-- ARGV[18] cluster
-- ARGV[19] work_units
-- ARGV[20] revision
-- The waste keys: pods and namespaces of the window, of the hour, and the window index; the
-- prefixes: of the per-window keys (pods, namespaces); `cluster`: '' for the default one (a
-- named cluster's namespaces rank as cluster/namespace); `work_units`: the window's (JSON
-- object; '' when the pod reports no units of work). The pod's units over its windows so
-- far, and the cost of the windows that had each, are kept by the difference to this
-- window's stored values too: `work_units` and `cost_per_unit` of the pod are over its
-- life. Totals and leaderboards move by the difference to the value stored for this window,
-- in nano-USD: a replay moves them by exactly zero, a higher revision by what it changed. A
-- revision lower than the one applied (`rev:{window_start}`, absent for 0) changes nothing.
local function expire_pod(ttl, first, last)
  for i = first, last do redis.call('EXPIRE', KEYS[i], ttl, 'NX') end
end

local uid, ns, ws, we = ARGV[1], ARGV[2], ARGV[6], tonumber(ARGV[7])
local revision = tonumber(ARGV[20])
if revision < tonumber(redis.call('HGET', KEYS[2], 'rev:' .. ws) or '0') then return 0 end
if revision > 0 then redis.call('HSET', KEYS[2], 'rev:' .. ws, ARGV[20]) end
local function usd(n)
  local s = string.format('%010d', math.abs(n))
  return (n < 0 and '-' or '') .. string.sub(s, 1, -10) .. '.' .. string.sub(s, -9)
end
local old_cost = tonumber(redis.call('HGET', KEYS[2], 'cost:' .. ws) or '0')
local totals = {}
for i, kind in ipairs({'cost', 'waste'}) do
  local new = tonumber(ARGV[7 + i])
  local old = tonumber(redis.call('HGET', KEYS[2], kind .. ':' .. ws) or '0')
  local total = tonumber(redis.call('HGET', KEYS[2], kind .. ':total') or '0')
  if new ~= old then
    redis.call('HSET', KEYS[2], kind .. ':' .. ws, ARGV[7 + i])
    total = redis.call('HINCRBY', KEYS[2], kind .. ':total', string.format('%d', new - old))
  end
  totals[i] = usd(total)
end
-- Units of work: this window's replace what was stored for it (a replay changes nothing).
local function decoded(raw)
  if not raw or raw == '' then return {} end
  return cjson.decode(raw)
end
local old_units = decoded(redis.call('HGET', KEYS[2], 'units:' .. ws))
local new_units = decoded(ARGV[19])
local per_unit = nil
if next(old_units) ~= nil or next(new_units) ~= nil then
  local names = decoded(redis.call('HGET', KEYS[2], 'units:names'))
  local known = {}
  for _, u in ipairs(names) do known[u] = true end
  for u, n in pairs(old_units) do
    redis.call('HINCRBYFLOAT', KEYS[2], 'units:total:' .. u, -n)
    redis.call('HINCRBY', KEYS[2], 'units:cost:' .. u, string.format('%d', -old_cost))
  end
  local cost = tonumber(ARGV[8])
  for u, n in pairs(new_units) do
    redis.call('HINCRBYFLOAT', KEYS[2], 'units:total:' .. u, n)
    redis.call('HINCRBY', KEYS[2], 'units:cost:' .. u, string.format('%d', cost))
    if not known[u] then names[#names + 1] = u; known[u] = true end
  end
  table.sort(names)
  if ARGV[19] == '' then redis.call('HDEL', KEYS[2], 'units:' .. ws)
  else redis.call('HSET', KEYS[2], 'units:' .. ws, ARGV[19]) end
  redis.call('HSET', KEYS[2], 'units:names', cjson.encode(names))
  local done, each = {}, {}
  for _, u in ipairs(names) do
    local n = tonumber(redis.call('HGET', KEYS[2], 'units:total:' .. u) or '0')
    local c = tonumber(redis.call('HGET', KEYS[2], 'units:cost:' .. u) or '0')
    local q = string.format('%q', u)
    done[#done + 1] = q .. ':' .. string.format('%.17g', n)
    if n > 0 then each[#each + 1] = q .. ':' .. string.format('%.17g', c / 1e9 / n)
    else each[#each + 1] = q .. ':null' end
  end
  per_unit = {'{' .. table.concat(done, ',') .. '}', '{' .. table.concat(each, ',') .. '}'}
end
local cur = redis.call('HMGET', KEYS[1], 'window_start', 'updated_at', 'state')
local f = {'namespace', ns, 'pod', ARGV[3], 'cost_usd', totals[1], 'waste_usd', totals[2]}
if ARGV[18] ~= '' then f[#f + 1] = 'cluster'; f[#f + 1] = ARGV[18] end
if not cur[1] or tonumber(ws) >= tonumber(cur[1]) then
  for _, v in ipairs({'window_start', ws, 'labels', ARGV[5], 'vram_bytes', ARGV[10],
      'share', ARGV[11], 'gpus', ARGV[12]}) do f[#f + 1] = v end
  if ARGV[4] ~= '' then f[#f + 1] = 'node'; f[#f + 1] = ARGV[4] end
end
if not cur[2] or we > tonumber(cur[2]) then f[#f + 1] = 'updated_at'; f[#f + 1] = ARGV[7] end
if per_unit then
  for _, v in ipairs({'work_units', per_unit[1], 'cost_per_unit', per_unit[2]}) do
    f[#f + 1] = v
  end
end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('HSETNX', KEYS[1], 'node', '')
if cur[3] == 'finished' or ARGV[13] == 'finished' then expire_pod(tonumber(ARGV[14]), 1, 4) end
-- Scores are rounded to whole nano-dollars after every change, so a sum does not depend
-- on the order its terms arrived in.
local function bump(key, member, delta)
  local score = tonumber(redis.call('ZINCRBY', key, delta, member))
  local exact = string.format('%.9f', score)
  if tonumber(exact) <= 0 then redis.call('ZREM', key, member)
  elseif tonumber(exact) ~= score then redis.call('ZADD', key, exact, member) end
end
local top = redis.call('ZRANGE', KEYS[9], -1, -1, 'WITHSCORES')
local newest = top[2] and tonumber(top[2]) or -1
local horizon = math.max(newest, we) - tonumber(ARGV[15])
if tonumber(ws) < horizon then return 0 end
local new = tonumber(ARGV[9])
local old = tonumber(redis.call('ZSCORE', KEYS[5], uid) or '0')
old = math.floor(old * 1e9 + 0.5)
if new ~= old then
  if new > 0 then redis.call('ZADD', KEYS[5], usd(new), uid)
  else redis.call('ZREM', KEYS[5], uid) end
  local ns_member = ARGV[18] == '' and ns or (ARGV[18] .. '/' .. ns)
  for _, km in ipairs({{KEYS[6], ns_member}, {KEYS[7], uid}, {KEYS[8], ns_member}}) do
    bump(km[1], km[2], usd(new - old))
  end
end
redis.call('ZADD', KEYS[9], ARGV[7], ws)
if we <= newest then return 1 end
for _, m in ipairs(redis.call('ZRANGE', KEYS[9], 0, -1)) do
  if tonumber(m) < horizon then
    for j, prefix in ipairs({ARGV[16], ARGV[17]}) do
      local window = prefix .. m
      local entries = redis.call('ZRANGE', window, 0, -1, 'WITHSCORES')
      for k = 1, #entries, 2 do bump(KEYS[6 + j], entries[k], '-' .. entries[k + 1]) end
      redis.call('DEL', window)
    end
    redis.call('ZREM', KEYS[9], m)
  end
end
return 1
