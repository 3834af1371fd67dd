-- KEYS[1] index
-- KEYS[2..] gpus
-- ARGV[1] rows
-- `gpus` are the GPU hashes; `rows` one JSON array of rows [uuid, updated_at, field, value,
-- ...], one per hash in KEYS order. Each hash takes its row unless it holds a newer
-- updated_at; the index scores each uuid by its newest updated_at.
local rows = cjson.decode(ARGV[1])
local written = 0
for i, row in ipairs(rows) do
  local key = KEYS[i + 1]
  local cur = redis.call('HGET', key, 'updated_at')
  if not cur or tonumber(cur) <= tonumber(row[2]) then
    redis.call('HSET', key, 'updated_at', row[2], unpack(row, 3))
    redis.call('ZADD', KEYS[1], 'GT', row[2], row[1])
    written = written + 1
  end
end
return written
