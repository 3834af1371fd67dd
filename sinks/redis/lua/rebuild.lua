-- KEYS[1] rebuild
-- ARGV[1] pattern
-- ARGV[2] keep_prefix
-- ARGV[3] evicted
-- ARGV[4] run_id
-- `rebuild`: the hash {prefix}sink:rebuild:{group} (generation, evicted, run_id);
-- `pattern`: the keys of the prefix (glob-escaped, ending in *); `keep_prefix`: the prefix
-- of the rebuild hashes (kept); `evicted`, `run_id`: Redis's eviction count and run id when
-- the caller noticed evictions.
-- Deletes every key of the prefix but the rebuild hashes, once per eviction count of a
-- run (a second writer that noticed the same evictions finds them done), and moves the
-- generation on, in one step: no batch lands halfway through. Returns the generation.
local run = redis.call('HGET', KEYS[1], 'run_id')
local seen = tonumber(redis.call('HGET', KEYS[1], 'evicted') or '-1')
if run == ARGV[4] and seen >= tonumber(ARGV[3]) then
  return tonumber(redis.call('HGET', KEYS[1], 'generation') or '0')
end
local keep = ARGV[2]
local cursor = '0'
repeat
  local found = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = found[1]
  for _, key in ipairs(found[2]) do
    if string.sub(key, 1, #keep) ~= keep then
      redis.call('UNLINK', key)
    end
  end
until cursor == '0'
redis.call('HSET', KEYS[1], 'evicted', ARGV[3], 'run_id', ARGV[4])
return redis.call('HINCRBY', KEYS[1], 'generation', 1)
